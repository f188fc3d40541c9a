"""Keyspaces on the test session's Cassandra (``cassandra_hosts``, ``tests/plugins/cassandra.py``).

Each test module (or test) works in a keyspace of its own, with the store's schema, so
tests never see each other's rows. Making one costs the node ~1.5 s of schema changes
and dropping it ~1 s, which hundreds of tests and Hypothesis examples paid; so a
keyspace a test is done with is emptied (``TRUNCATE`` of each table but the record of
applied schema steps: its rows and tombstones go, as in a new keyspace) and handed to
the process's next test — but only when its tables and steps are still exactly the
schema's, else it is dropped. What a pool keeps is dropped when the process exits.
``FANOUT_CASSANDRA_OPTIONS`` adds store URL options for an external cluster (e.g.
``local_dc=dc1&rf=3``).
"""

from __future__ import annotations

import atexit
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from views.stores import store_from_url
from views.stores.cassandra.config import parse_url
from views.stores.cassandra.schema import applied_versions, apply_schema, connect
from views.stores.cassandra.store import CassandraStore
from views.stores.contract import Store

#: The table of applied schema steps, kept when a keyspace is emptied.
_STEPS_TABLE = "schema_version"


def keyspace_url(hosts: str, keyspace: str, options: str = "") -> str:
    """``cassandra://hosts/keyspace?options``, with FANOUT_CASSANDRA_OPTIONS added."""
    extra = "&".join(filter(None, (os.environ.get("FANOUT_CASSANDRA_OPTIONS", ""), options)))
    return f"cassandra://{hosts}/{keyspace}" + (f"?{extra}" if extra else "")


def new_keyspace_name(prefix: str = "fanout_test") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


S = TypeVar("S", bound=CassandraStore)


def writing(kind: type[S], url: str, cap: int = 800, inactive_days: float = 0.0) -> S:
    """A store of ``kind`` (not open) that runs a timed-out write again within the URL's
    ``retry``, as the job's writers do (:meth:`CassandraStore.for_tasks`); ``from_url``'s
    fails at the first timeout, which a node starved by the suite's other workers now
    and then gives."""
    config = parse_url(url)
    return kind(config, cap=cap, inactive_days=inactive_days, retry_s=config.retry_s)


def writing_store(url: str, cap: int = 800, inactive_days: float = 0.0) -> CassandraStore:
    """:func:`writing` of the plain store."""
    return writing(CassandraStore, url, cap, inactive_days)


def writer_from_url(url: str, cap: int = 800, inactive_days: float = 0.0) -> Store:
    """``store_from_url``'s store for a test that writes: :func:`writing_store` for a
    Cassandra URL."""
    if url.startswith("cassandra:"):
        return writing_store(url, cap, inactive_days)
    return store_from_url(url, cap=cap, inactive_days=inactive_days)


class _Pool:
    """Emptied keyspaces with the schema, of one cluster and replication, and a session."""

    def __init__(self, config: Any) -> None:
        self.cluster, self.session = connect(config, wait=60)
        self.replication = config.replication.cql_map()
        self.free: list[str] = []
        self.shape: frozenset[tuple[Any, ...]] | None = None  # the schema's, once seen

    def take(self) -> str:
        if self.free:
            return self.free.pop()
        keyspace = new_keyspace_name()
        apply_schema(self.session, keyspace, self.replication)
        if self.shape is None:
            self.shape = self._shape(keyspace)
        return keyspace

    def give_back(self, keyspace: str) -> None:
        """Empty ``keyspace`` for the next test if it still has just the schema, else drop it."""
        if self._shape(keyspace) != self.shape:
            self.drop(keyspace)
            return
        for table in {t for t, *_ in self.shape} - {_STEPS_TABLE}:
            self.session.execute(f"TRUNCATE {keyspace}.{table}", timeout=120)
        self.free.append(keyspace)

    def drop(self, keyspace: str) -> None:
        self.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)

    def close(self) -> None:
        try:
            for keyspace in self.free:
                self.drop(keyspace)
        finally:
            self.cluster.shutdown()

    def _shape(self, keyspace: str) -> frozenset[tuple[Any, ...]]:
        """Its tables' columns, and the schema steps recorded as applied (not when)."""
        columns = self.session.execute(
            "SELECT table_name, column_name, type, kind FROM system_schema.columns "
            "WHERE keyspace_name = %s", (keyspace,))
        steps = applied_versions(self.session, keyspace) or {}
        return frozenset(tuple(r) for r in columns) | {(_STEPS_TABLE, *s) for s in steps.items()}


_pools: dict[tuple[str, str], _Pool] = {}


def close_pools(hosts: str | None = None) -> None:
    """Drop the pooled keyspaces on ``hosts`` (every cluster's if None), and disconnect.

    The session's fixture calls it before it stops a local node; what is left is
    closed when the process exits (an external cluster's pools).
    """
    for key in [k for k in _pools if hosts is None or k[0] == hosts]:
        _pools.pop(key).close()


atexit.register(close_pools)


@contextmanager
def fresh_keyspace(hosts: str, options: str = "", *, schema: bool = True) -> Iterator[str]:
    """An empty keyspace's store URL, with the schema applied unless ``schema=False``.

    With the schema it may be one an earlier test used, emptied (module docstring);
    without, it is new and dropped at the end.
    """
    config = parse_url(keyspace_url(hosts, "pooled", options))
    key = (hosts, config.replication.cql_map())
    if key not in _pools:
        _pools[key] = _Pool(config)
    pool = _pools[key]
    if not schema:
        keyspace = new_keyspace_name()
        try:
            yield keyspace_url(hosts, keyspace, options)
        finally:
            pool.drop(keyspace)
        return
    keyspace = pool.take()
    try:
        yield keyspace_url(hosts, keyspace, options)
    finally:
        pool.give_back(keyspace)
