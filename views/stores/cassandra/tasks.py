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

**Retries.** A task writes through a store made for it
(:meth:`CassandraStore.for_tasks`), whose requests that fail transiently run again
for up to the store's ``retry`` seconds (:mod:`views.stores.cassandra.executor`);
:func:`~views.stores.cassandra.store.task_store` keeps one open per executor process
and config.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from views.stores.cassandra import statements as cql
from views.stores.cassandra.changes import Changes, committed_op
from views.stores.plan import WritePlan

if TYPE_CHECKING:
    from views.stores.cassandra.store import CassandraStore


@dataclasses.dataclass
class UserCounts:
    """What one user-stage task wrote (``adds``: timeline rows, regenerated ones too)."""

    adds: int = 0
    removes: int = 0
    trims: int = 0


class TaskWriter:
    """One task's share of a batch, written through ``store``; see the module docstring."""

    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    # -- the tweet stage ---------------------------------------------------------------------
    def write_tweets(self, plan: WritePlan, ts: int) -> tuple[list[cql.Removed], int]:
        """Write the plan's tweets and dead letters; return its removes as timeline keys.

        The keys are (user, created_at, tweet), for the user stage to write; the int is
        how many removes had nothing to delete.
        """
        store = self.store
        found = store._lookup({"tweet_state": cql.lookup_ids(plan)})
        removes, skipped, moved = store._write_tweets(plan, found["tweet_state"],
                                                      ts + cql.REMOVE)
        changed = Changes.of(plan, moved)
        store._run(cql.dead_ops(plan.dead, int(time.time() * 1000))
                   + cql.dead_partition_ops(plan.dead) + changed.ops(ts))
        return removes, skipped

    # -- the user stage -----------------------------------------------------------------------
    def write_users(self, plan: WritePlan, ts: int, inactive_ms: int = 0) -> UserCounts:
        """Write everything of the plan's users, phase by phase (removes already resolved).

        ``inactive_ms`` is the job's store's (:attr:`ViewWriter.inactive_ms`; 0: off): one
        writer per process serves whatever job runs there.
        """
        store = self.store
        found = store._lookup({"home_get": sorted(cql.wipe_users(plan.wipes)),
                               "user_time": sorted(plan.users),
                               "meta_get": cql.meta_users(plan, store.blind(plan, ts))})
        removes, _ = cql.removed_keys(plan.removes, {}, {})
        meta = store._write_user_rows(plan, found, removes, ts + cql.REMOVE)
        adds, inserted = store._write_adds(plan, meta, ts, inactive_ms)
        store._write_trims(adds, meta, ts + cql.TRIM)
        store._run(Changes.of(plan).ops(ts))
        return UserCounts(inserted, len(removes))

    # -- the driver: before and after the tasks --------------------------------------------------
    def begin(self, batch_id: int, run_digest: str) -> int:
        """The batch's timestamp ``T``, before any task writes (retried while no node answers).

        See :meth:`CassandraStore._batch_timestamp`.
        """
        return self.store._batch_timestamp(batch_id, run_digest)

    def finish(self, record: cql.BatchRecord, offsets: dict[tuple[str, int], int]) -> None:
        """After every task succeeded: the applied offsets, the batch record, committed."""
        self.store._run(cql.offset_ops(offsets))
        self.store._run(record.ops())
        self.store._run([committed_op(record.write_ts)])
