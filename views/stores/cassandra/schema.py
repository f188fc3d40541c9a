"""The versioned schema of the Cassandra store (``fanout schema`` is :mod:`infra.ops.schema`).

Cassandra's tables are created by numbered CQL files, ``views/stores/cassandra/cql/NNN_name.cql``
(shipped as package data), applied in order by ``fanout schema apply``: it creates
the keyspace with the replication the store URL asks for, then a ``schema_version``
table, then every step not recorded there, recording each once its statements have
run and the cluster agrees on the schema. Steps are written to be re-runnable (IF
NOT EXISTS), so an interrupted apply is finished by running it again. Processes that
use the store (the job, the API) only *check* that the schema is current — DDL from
many clients at once is how Cassandra schemas diverge — unless the URL says
``schema=auto`` (tests, one-machine setups).

An existing keyspace keeps its replication: change it with ALTER KEYSPACE and a
repair, not here. The SQLite store creates its schema when opened.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any, Final

import numpy as np

from ingest.retry import within
from views.errors import StoreError
from views.stores.cassandra.statements import in_keyspace

log = logging.getLogger(__name__)

STEP_FILE: Final = re.compile(r"(\d{3})_([a-z0-9_]+)\.cql")
VERSION_TABLE: Final = ("CREATE TABLE IF NOT EXISTS schema_version "
                        "(version int PRIMARY KEY, name text, applied_at bigint)")
_KEYSPACE_EXISTS: Final = ("SELECT keyspace_name FROM system_schema.keyspaces "
                           "WHERE keyspace_name = ?")
_TABLE_EXISTS: Final = ("SELECT table_name FROM system_schema.tables "
                        "WHERE keyspace_name = ? AND table_name = 'schema_version'")
#: Not prepared: a prepare goes to any node, and the table may be new to it.
_RECORD: Final = "INSERT INTO schema_version (version, name, applied_at) VALUES (%s, %s, %s)"
#: Seconds a DDL statement may take.
DDL_TIMEOUT: Final = 120.0
#: Seconds the live nodes may take to agree on the schema at each of apply_schema's waits.
AGREEMENT_WAIT: Final = 60.0


class SchemaError(StoreError):
    """The schema cannot be applied, or the store's schema is not current."""


@dataclass(frozen=True)
class Step:
    """One numbered CQL file: its version, name and statements in order."""

    version: int
    name: str
    statements: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.version:03d}_{self.name}"


def cql_directory() -> Traversable:
    """Where the numbered CQL files are (package data of ``views.stores.cassandra``)."""
    return resources.files("views.stores.cassandra").joinpath("cql")


def load_steps(directory: Traversable | Path | None = None) -> list[Step]:
    """The schema steps, by version; raises on a misnamed file or a repeated version."""
    steps: dict[int, Step] = {}
    for entry in (directory or cql_directory()).iterdir():
        if not entry.name.endswith(".cql"):
            continue
        match = STEP_FILE.fullmatch(entry.name)
        if match is None:
            msg = f"schema file {entry.name!r} is not named NNN_lowercase_name.cql"
            raise SchemaError(msg)
        version = int(match.group(1))
        if version in steps or version == 0:
            msg = f"schema version {version} is used twice (or is 0): {entry.name}"
            raise SchemaError(msg)
        steps[version] = Step(version, match.group(2), tuple(split_cql(entry.read_text())))
    return [steps[v] for v in sorted(steps)]


def split_cql(text: str) -> list[str]:
    """Statements of a CQL file: ``--`` comments dropped, split at ``;`` line ends."""
    lines = [line.split("--", 1)[0].rstrip() for line in text.splitlines()]
    body = "\n".join(line for line in lines if line.strip())
    return [" ".join(s.split()) for s in body.split(";") if s.strip()]


def keyspace_cql(keyspace: str, replication_map: str) -> str:
    """CREATE KEYSPACE for a validated name (identifiers cannot be bound in CQL)."""
    return (f"CREATE KEYSPACE IF NOT EXISTS {_checked(keyspace)} WITH replication = "
            f"{replication_map} AND durable_writes = true")


def _checked(keyspace: str) -> str:
    from views.stores.cassandra.config import KEYSPACE_RE

    if not KEYSPACE_RE.fullmatch(keyspace):
        msg = f"invalid keyspace name {keyspace!r}"
        raise SchemaError(msg)
    return keyspace


def pending(steps: list[Step], applied: dict[int, str]) -> list[Step]:
    """Steps not yet applied, in order."""
    return [s for s in steps if s.version not in applied]


# -- against a cluster -------------------------------------------------------------------------

def applied_versions(session: Any, keyspace: str, host: Any = None) -> dict[int, str] | None:
    """Map applied step versions to names; None when the keyspace does not exist.

    ``host`` asks one node (the one that applies the schema), any node when None.
    """
    keyspace = _checked(keyspace)
    if not list(session.execute(session.prepare(_KEYSPACE_EXISTS), (keyspace,), host=host)):
        return None
    if not list(session.execute(session.prepare(_TABLE_EXISTS), (keyspace,), host=host)):
        return {}
    rows = session.execute(f"SELECT version, name FROM {keyspace}.schema_version", host=host)
    return {int(version): str(name) for version, name in rows}


def apply_schema(session: Any, keyspace: str, replication_map: str,
                 steps: list[Step] | None = None) -> list[Step]:
    """Create the keyspace and apply the missing steps; return the steps applied.

    Every statement goes to one coordinator, which applies them in order, and the
    nodes are asked (through the coordinator) to agree on the schema only where a node
    other than the coordinator must know it: once the keyspace exists (``USE`` goes to
    every node), once ``schema_version`` does (its rows are read and written at a
    quorum), before a step that moves data, and at the end. Waiting for agreement after
    each statement, as the driver does by default, cost a 3-node ring about a second a
    table (``benchmarks/bench_schema.py``). A coordinator lost midway fails the apply;
    run it again (the steps are re-runnable).
    """
    steps = load_steps() if steps is None else steps
    coordinator = _coordinator(session)
    cluster = session.cluster
    waited, cluster.max_schema_agreement_wait = cluster.max_schema_agreement_wait, 0
    try:
        _ddl(session, keyspace_cql(keyspace, replication_map), coordinator)
        _agree(session, coordinator, "CREATE KEYSPACE " + keyspace)
        session.set_keyspace(keyspace)
        _ddl(session, VERSION_TABLE, coordinator)
        _agree(session, coordinator, "CREATE TABLE schema_version")  # its rows: a quorum
        todo = pending(steps, applied_versions(session, keyspace, coordinator) or {})
        for step in todo:
            for statement in step.statements:
                _ddl(session, statement, coordinator)
            if step.version in DATA_STEPS:  # before recording: an interrupted copy runs again
                _agree(session, coordinator, f"schema step {step.label}")
                DATA_STEPS[step.version](session)
            session.execute(_RECORD, (step.version, step.name, int(time.time() * 1000)),
                            host=coordinator)
            log.info("schema step %s applied to keyspace %s", step.label, keyspace)
        _agree(session, coordinator, f"the schema steps of keyspace {keyspace}")
    finally:
        cluster.max_schema_agreement_wait = waited
    return todo


def copy_celebrity_edges(session: Any) -> None:
    """Step 4's data: every celebrity edge as a row of its user's ``relations`` partition.

    Written at the newest batch timestamp the writer used, so that any later batch's
    write of the same edge (on or off) outranks the copy.
    """
    from cassandra.concurrent import execute_concurrent_with_args
    from cassandra.query import SimpleStatement

    clock = list(session.execute("SELECT write_ts FROM writer_clock WHERE id = 0"))
    ts = int(clock[0][0]) if clock and clock[0][0] else 1
    insert = session.prepare(in_keyspace(
        "INSERT INTO relations (user_id, relation, other_id, created_at) "
        "VALUES (?, 'celebrity', ?, 0) USING TIMESTAMP ?", session.keyspace))
    edges = session.execute(SimpleStatement(
        "SELECT user_id, celebrity_id FROM celebrity_follows", fetch_size=5000),
        timeout=DDL_TIMEOUT)
    copied = execute_concurrent_with_args(session, insert, ((u, c, ts) for u, c in edges),
                                          concurrency=32, raise_on_first_error=True)
    log.info("schema step 4: %d celebrity edges copied into relations", len(copied))


def list_dead_letter_partitions(session: Any) -> None:
    """Step 6's data: the partitions of ``dead_letters`` that hold letters already.

    One scan of the table's partition keys, at schema time only; from then on the
    writer lists a partition with each letter it writes.
    """
    from cassandra.query import SimpleStatement

    insert = session.prepare(in_keyspace("INSERT INTO dead_letter_partitions (bucket, topic, "
                                         "kafka_partition) VALUES (0, ?, ?)", session.keyspace))
    found = list(session.execute(SimpleStatement(
        "SELECT DISTINCT topic, kafka_partition FROM dead_letters", fetch_size=5000),
        timeout=DDL_TIMEOUT))
    for topic, partition in found:
        session.execute(insert, (topic, partition))
    log.info("schema step 6: %d partitions of dead letters listed", len(found))


def copy_home_timelines(session: Any) -> None:
    """Step 8's data: each user's ``home_timeline`` rows as one ``home_chunks`` row.

    At ``batch_ts`` 0 and write timestamp 0, below every batch's row and tombstone,
    so the copy folds first; then ``home_timeline`` is dropped. A full scan returns a
    partition's rows together, so each user's rows are written at once.
    """
    from cassandra.query import SimpleStatement

    from views.stores.cassandra.chunks import encode

    if not list(session.execute("SELECT table_name FROM system_schema.tables WHERE "
                                "keyspace_name = %s AND table_name = 'home_timeline'",
                                (session.keyspace,))):
        return
    insert = session.prepare(in_keyspace("INSERT INTO home_chunks (user_id, batch_ts, adds) "
                                         "VALUES (?, 0, ?) USING TIMESTAMP 0", session.keyspace))
    rows = session.execute(SimpleStatement(
        "SELECT user_id, created_at, tweet_id, author_id FROM home_timeline", fetch_size=5000),
        timeout=DDL_TIMEOUT)
    users = 0
    for user, entries in itertools.groupby(rows, key=lambda r: r[0]):
        session.execute(insert, (user, encode(np.array([r[1:] for r in entries], np.int64))))
        users += 1
    session.execute("DROP TABLE IF EXISTS home_timeline", timeout=DDL_TIMEOUT)
    log.info("schema step 8: %d users' home timelines copied into home_chunks", users)


#: Steps that move data as well as define tables: run after the step's statements.
DATA_STEPS: Final[dict[int, Callable[[Any], None]]] = {4: copy_celebrity_edges,
                                                       6: list_dead_letter_partitions,
                                                       8: copy_home_timelines}


def require_current(session: Any, keyspace: str) -> None:
    """Raise :class:`SchemaError` unless every known step is applied to ``keyspace``."""
    applied = applied_versions(session, keyspace)
    missing = pending(load_steps(), applied or {})
    if applied is None or missing:
        what = ("does not exist" if applied is None else
                f"lacks schema step(s) {', '.join(s.label for s in missing)}")
        msg = f"Cassandra keyspace {keyspace!r} {what}: run `fanout schema apply` first"
        raise SchemaError(msg)


def _ddl(session: Any, statement: str, host: Any) -> None:
    session.execute(statement, timeout=DDL_TIMEOUT, host=host)


def _agree(session: Any, coordinator: Any, after: str) -> None:
    """Wait until every live node holds the coordinator's schema; raise if not in time.

    The coordinator is asked (as the driver asks its control connection's node after
    each statement): its own version is the new one as soon as a statement it
    coordinated returns, and its ``system.peers_v2`` has each peer's as gossip brings it.
    """
    deadline = time.monotonic() + AGREEMENT_WAIT
    while len(set(_schema_versions(session, coordinator))) > 1:
        if time.monotonic() > deadline:
            msg = (f"the cluster did not agree on the schema after {after} within "
                   f"{AGREEMENT_WAIT:.0f}s; check that every node is up (nodetool "
                   "describecluster), then run the step again")
            raise SchemaError(msg)
        time.sleep(0.1)


def _schema_versions(session: Any, coordinator: Any) -> list[Any]:
    """The schema versions of the coordinator and of each peer the driver sees up."""
    up = {str(host.address) for host in session.cluster.metadata.all_hosts() if host.is_up}
    local = session.execute("SELECT schema_version FROM system.local", host=coordinator)
    peers = session.execute("SELECT native_address, schema_version FROM system.peers_v2",
                            host=coordinator)
    return [row[0] for row in local] + [row[1] for row in peers if str(row[0]) in up]


def _coordinator(session: Any) -> Any:
    """A node that is up and that the session has connections to: it applies the schema."""
    pooled = {pool.host for pool in session.get_pools()}
    for host in sorted(session.cluster.metadata.all_hosts(), key=str):
        if host.is_up and host in pooled:
            return host
    msg = "no Cassandra node of the session is up to apply the schema"
    raise SchemaError(msg)


def apply_at(url: str, wait: float = 60.0) -> list[Step]:
    """``fanout schema apply`` on a store URL: the keyspace and its missing steps.

    Waits up to ``wait`` seconds for a node to answer; returns the steps applied.
    """
    from views.stores.cassandra.config import parse_url

    config = parse_url(url)
    cluster, session = connect(config, wait)
    try:
        return apply_schema(session, config.keyspace, config.replication.cql_map())
    finally:
        cluster.shutdown()


def connect(config: Any, wait: float = 0.0) -> tuple[Any, Any]:
    """(Cluster, Session) for ``config``, retrying for up to ``wait`` seconds.

    The policy is :func:`ingest.retry.within`'s, pausing 2 s between attempts: a ring
    that is starting answers within seconds of its last node.
    """
    from cassandra.cluster import NoHostAvailable

    from views.stores.cassandra.config import new_cluster

    where = f"{','.join(config.hosts)}:{config.port}"

    def attempt() -> tuple[Any, Any]:
        cluster = new_cluster(config)
        try:
            return cluster, cluster.connect()
        except NoHostAvailable:
            cluster.shutdown()
            raise

    def say(attempt: int, exc: BaseException, pause: float, left: float) -> None:
        log.warning("no Cassandra node answers at %s yet; trying again for up to %.0fs",
                    where, left)

    try:
        return within(wait, first=2.0, most=2.0, say=say,
                      transient=lambda exc: isinstance(exc, NoHostAvailable))(attempt)
    except NoHostAvailable as exc:
        msg = f"no Cassandra node answered at {where} (waited {wait:.0f}s): {exc}"
        raise SchemaError(msg) from None
