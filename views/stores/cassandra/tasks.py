"""Cassandra writes of one Spark task, and the driver's begin and end of a batch.

The executor sink (:mod:`views.stores.cassandra.sink`) splits a micro-batch into two stages,
each a set of Spark tasks; this module is what each task does to Cassandra, with
no Spark in it. The phases, timestamps and statements are those of
:class:`~views.stores.cassandra.CassandraStore` (``T + REMOVE``/``ADD``/``TRIM``,
:mod:`views.stores.cassandra.statements`); what changes is who runs them:

- :meth:`TaskWriter.write_tweets` — a task that owns a set of *tweets* and reposts
  (the batch routed by ``tweet_id``): reads their stored state, deletes the rows
  of reposts whose key moves (first, as the store does), writes ``tweets``,
  ``author_tweets`` and ``reposts_by_original`` at ``T + REMOVE`` and the dead
  letters, and resolves every timeline remove of those tweets to a row key (a
  remove of unknown time takes it from ``tweets``, only if the tweet is the removing
  author's).
- :meth:`TaskWriter.write_users` — a task that owns a set of *users* (routed by
  user): their follows, celebrity edges, blocks and mutes, profiles and account
  deletions, wipes and resolved removes at ``T + REMOVE``; their reads (inactive
  users), a returning user's regenerated cache and adds at ``T + ADD``; trims, the
  caches of users going dormant and ``timeline_meta`` at ``T + TRIM``. Every
  read-before-write of a user's rows (partition for wipes, ``timeline_meta``,
  profile time and deletion, follows and celebrity edges for a regeneration, the
  head for a trim) is in the one task that writes them; the ``author_tweets`` a
  regeneration reads were written by the tweet stage, which has finished.
- :meth:`TaskWriter.begin` / :meth:`TaskWriter.finish` — the driver, before and
  after the tasks: the batch's timestamp, then the applied offsets and batch record.

**Retries.** Every statement is an upsert or delete keyed by its primary key at an
explicit timestamp (the dead-letter insert is IF NOT EXISTS: the first sighting is
kept), so running one again writes the same cells. A request (a statement, or an
unlogged batch of them) that fails transiently — a timeout, too few replicas, a lost
connection, no node answering — is run again whole, with backoff (doubling to 15 s),
for up to the store's ``retry`` seconds (120 by default: long enough for a node to
restart), with a log line per attempt; only then does the task fail (and Spark may
run the task again, which is as safe). :func:`writer` keeps one opened writer
(Cluster, Session, prepared statements) per executor process and config.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

from cassandra import CoordinationFailure, OperationTimedOut, Timeout, Unavailable
from cassandra.cluster import NoHostAvailable
from cassandra.concurrent import execute_concurrent
from cassandra.connection import ConnectionException

from views.errors import StoreError
from views.stores.base import WritePlan
from views.stores.cassandra import rows as reads
from views.stores.cassandra import schema
from views.stores.cassandra import statements as cql
from views.stores.cassandra import store as cs
from views.stores.cassandra.changes import Changes, committed_op
from views.stores.cassandra.config import WRITE_PROFILE, CassandraConfig
from views.stores.cassandra.store import CassandraStore

log = logging.getLogger(__name__)

#: Backoff before the second run; doubled per attempt, capped at ``_BACKOFF_MAX``.
_BACKOFF_S: Final = 0.2
_BACKOFF_MAX: Final = 15.0
#: Failures worth running a statement again for: the node was slow, short of
#: replicas or unreachable. Anything else (a bad request) fails the task at once.
TRANSIENT: Final = (OperationTimedOut, Timeout, Unavailable, CoordinationFailure,
                    NoHostAvailable, ConnectionException)
#: Cassandra's "CAS operation result is unknown" (protocol error 0x1700): a conditional
#: insert's Paxos round reached too few replicas in time, as on a loaded or shrunken
#: ring. The driver has no class for it; the dead-letter insert it comes from is IF NOT
#: EXISTS, so running it again keeps the first sighting either way.
CAS_WRITE_UNKNOWN: Final = 0x1700


def transient(exc: BaseException) -> bool:
    """Whether a failed request is worth running again (see :data:`TRANSIENT`)."""
    return isinstance(exc, TRANSIENT) or getattr(exc, "code", None) == CAS_WRITE_UNKNOWN


@dataclasses.dataclass
class UserCounts:
    """What one user-stage task wrote (``adds``: timeline rows, regenerated ones too)."""

    adds: int = 0
    removes: int = 0
    trims: int = 0


class TaskWriter(CassandraStore):
    """A Cassandra store that writes one task's share of a batch; see the module docstring."""

    def __init__(self, config: CassandraConfig, cap: int = 800) -> None:
        # Tasks never run DDL: many clients changing a schema at once is how it diverges.
        super().__init__(dataclasses.replace(config, auto_schema=False), cap)

    def _connect(self) -> tuple[Any, Any]:
        """Wait for a node that is restarting, as the writes do (the store's ``retry``)."""
        return schema.connect(self.config, wait=self.config.retry_s)

    # -- running statements, retried ----------------------------------------------------
    def _run(self, ops: list[cql.Op], profile: object = WRITE_PROFILE,
             columns: Sequence[cs.Columns] = ()) -> list[reads.Rows]:
        """Run ops and ``columns`` writes concurrently (bounded; a partition's writes batched).

        A failed request (a statement, or a batch) runs again, with backoff.
        """
        return self._run_groups(ops, cql.units(ops, self._replica), profile, columns)

    def _run_groups(self, ops: list[cql.Op], groups: list[list[int]],
                    profile: object = WRITE_PROFILE,
                    columns: Sequence[cs.Columns] = ()) -> list[reads.Rows]:
        """:meth:`_run` with the requests given: groups of op indices, a request each."""
        with cs.gc_paused(bool(columns)):
            return self._execute(ops, groups, profile, self._requests(groups, ops, columns))

    def _execute(self, ops: list[cql.Op], groups: list[list[int]], profile: object,
                 requests: list[Any]) -> list[reads.Rows]:
        """Run the requests of :meth:`_run_groups`; a failed one again, with backoff."""
        session = self._require()
        results: list[reads.Rows] = [[] for _ in groups]
        pending = list(range(len(requests)))
        attempt = 0
        give_up = time.monotonic() + self.config.retry_s
        while pending:
            attempt += 1
            outcomes = execute_concurrent(session, [requests[g] for g in pending],
                                          concurrency=self.config.concurrency,
                                          raise_on_first_error=False,
                                          execution_profile=profile)
            failed: list[tuple[int, BaseException]] = []
            for g, (ok, value) in zip(pending, outcomes, strict=True):
                if not ok:
                    failed.append((g, value))
                elif g < len(groups):
                    results[g] = list(value)
            if not failed:
                break
            first = failed[0][1]
            g = failed[0][0]
            example = ops[groups[g][0]][0] if g < len(groups) else requests[g][0]
            pause = min(_BACKOFF_S * 2 ** (attempt - 1), _BACKOFF_MAX)
            if time.monotonic() + pause > give_up or not transient(first):
                msg = (f"Cassandra: {len(failed)} of {len(pending)} requests failed after "
                       f"{attempt} attempt(s) in {self.config.retry_s:.0f}s, e.g. "
                       f"{example}: {first}; start the job again (`fanout up`) "
                       "once the cluster answers")
                raise StoreError(msg) from first
            log.warning("Cassandra: %d of %d requests failed (attempt %d, e.g. %s: %s); "
                        "running them again in %.1fs (giving up after %.0fs)", len(failed),
                        len(pending), attempt, example, first, pause, self.config.retry_s)
            time.sleep(pause)
            pending = [g for g, _ in failed]
        return cs.unbatch(groups, results, len(ops))

    # -- the tweet stage ---------------------------------------------------------------------
    def write_tweets(self, plan: WritePlan, ts: int) -> tuple[list[cql.Op], int]:
        """Write the plan's tweets and dead letters; return its removes as row deletes.

        The returned ops are ``home_del`` at ``ts + REMOVE`` (user, created_at, tweet),
        for the user stage to run; the int is how many removes had nothing to delete.
        """
        found = self._lookup({"tweet_state": cql.lookup_ids(plan)})
        removes, skipped, moved = self._write_tweets(plan, found["tweet_state"],
                                                     ts + cql.REMOVE)
        changed = Changes.of(plan, moved)
        self._run(cql.dead_ops(plan.dead, int(time.time() * 1000))
                  + cql.dead_partition_ops(plan.dead) + ([changed.op(ts)] if changed else []))
        return removes, skipped

    # -- the user stage -----------------------------------------------------------------------
    def write_users(self, plan: WritePlan, ts: int, inactive_ms: int = 0) -> UserCounts:
        """Write everything of the plan's users, phase by phase (removes already resolved).

        ``inactive_ms`` is the job's store's (:attr:`ViewWriter.inactive_ms`; 0: off): one
        writer per process serves whatever job runs there.
        """
        found = self._lookup({"home_all": sorted(cql.wipe_users(plan.wipes)),
                              "user_time": sorted(plan.users), "meta_get": cql.meta_users(plan)})
        removes, _ = cql.remove_ops(plan.removes, {}, {}, ts + cql.REMOVE)
        meta = self._write_user_rows(plan, found, removes, ts + cql.REMOVE)
        adds, inserted = self._write_adds(plan, meta, ts, inactive_ms)
        self._write_trims(adds, meta, ts + cql.TRIM)
        changed = Changes.of(plan)
        if changed:
            self._run([changed.op(ts)])
        return UserCounts(inserted, len(removes))

    # -- the driver: before and after the tasks --------------------------------------------------
    def begin(self, batch_id: int, run_digest: str) -> int:
        """The batch's timestamp ``T``, before any task writes (retried while no node answers).

        See :meth:`CassandraStore._batch_timestamp`.
        """
        return self._batch_timestamp(batch_id, run_digest)

    def finish(self, record: cql.BatchRecord, offsets: dict[tuple[str, int], int]) -> None:
        """After every task succeeded: the applied offsets, the batch record, committed."""
        self._run(cql.offset_ops(offsets))
        self._run(record.ops())
        self._run([committed_op(record.write_ts)])


_WRITERS: dict[tuple[CassandraConfig, int], TaskWriter] = {}
_WRITERS_LOCK = threading.Lock()


def writer(config: CassandraConfig, cap: int) -> TaskWriter:
    """The open writer of this process for ``config`` (opened on first use, then kept)."""
    key = (config, cap)
    with _WRITERS_LOCK:
        found = _WRITERS.get(key)
        if found is None:
            found = TaskWriter(config, cap)
            _open(found)
            _WRITERS[key] = found
            log.info("executor process opened a Cassandra session for %s", config.keyspace)
        return found


def _open(found: TaskWriter) -> None:
    """Open ``found``, retrying while the cluster does not answer, as the writes do.

    Opening reads the schema's version at the read level: with the quorum lost (two
    nodes of three down), a new executor process would fail its task at once, and
    Spark's four attempts would end the job instead of waiting out the store's
    ``retry`` for the nodes to come back.
    """
    give_up = time.monotonic() + found.config.retry_s
    attempt = 0
    while True:
        attempt += 1
        try:
            found.open()
            return
        except Exception as exc:
            pause = min(_BACKOFF_S * 2 ** (attempt - 1), _BACKOFF_MAX)
            if not transient(exc) or time.monotonic() + pause > give_up:
                raise
            log.warning("Cassandra: opening the store failed (attempt %d: %s); trying again "
                        "in %.1fs (giving up after %.0fs)", attempt, exc, pause,
                        found.config.retry_s)
            time.sleep(pause)


def close_writers() -> None:
    """Shut every cached writer down (tests, and processes that outlive their jobs)."""
    with _WRITERS_LOCK:
        for cached in _WRITERS.values():
            cached.close()
        _WRITERS.clear()

