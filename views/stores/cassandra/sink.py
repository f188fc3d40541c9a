"""The Cassandra sink: a micro-batch written from the executors, partitioned by user.

Cassandra takes writes from many clients at once, so nothing of a batch goes to the
driver: the batch's deltas are repartitioned and written by Spark tasks, each with
its process's own Session and prepared statements
(:mod:`views.stores.cassandra.tasks`). SQLite has one writer per file, so its sink
(:mod:`views.sink`) collects the batch to the driver and writes it in one
transaction instead; spreading SQLite writes over tasks would only queue them on
the file's lock.

**Routing.** Every row a read-before-write depends on is written by the task that
does the read, so tasks never race on a row:

========================  ===========  =============================================
stage                     routed by    writes
========================  ===========  =============================================
1 (``tweet_stage``)       tweet_id     ``tweets``, ``author_tweets`` (read first: the
                                       stored state); reposts (``tweets``,
                                       ``author_tweets``, ``reposts_by_original``;
                                       read first: the stored key, whose rows go
                                       when a copy moves the repost); the timeline
                                       removes of those tweets are resolved to
                                       timeline keys here (a delete of unknown time
                                       reads it from ``tweets``); dead letters (any
                                       task)
2 (``user_stage``)        user_id      ``home_chunks``: wipes (read the partition),
                                       removes, adds, merges and trims (read the
                                       partition),
                                       ``timeline_meta`` (read: horizon, size, newest
                                       read), inactive users: the user's reads
                                       (ACTIVITY), a dormant user's partition
                                       dropped, a returning user's cache
                                       regenerated (read: follows, celebrity edges,
                                       ``author_tweets``),
                                       ``follows`` (by follower), ``celebrity_follows``,
                                       ``users`` (read: the stored profile's time and
                                       deletion), ``relations`` (by the acting user, no
                                       read; a block's two rows from one task),
                                       ``celebrities`` (by author, no read)
========================  ===========  =============================================

Stage 1 runs over the batch's deltas (a fan-out is one row, however many followers).
What it passes on crosses one shuffle to stage 2 still packed: a delta that lists
users is split only by the task its users fall to (:func:`routed`), so the shuffle
carries about a row per delta and task, not a row per timeline entry, and stage 2
folds each task's rows with :func:`~views.stores.plan.fold` as the driver's path
folds a batch. Stage 2 starts only when stage 1 has finished, so a tweet's hydration row is written
before any timeline row that shows it, and a returning user's cache is regenerated
from ``author_tweets`` with the batch's tweets in it, as on the driver path.

**Exactly once in effect.** The driver picks the batch's write timestamp ``T``
(:meth:`TaskWriter.begin`: the recorded one when this checkpoint's batch was applied
before, else above every earlier batch's) and every task writes at ``T + phase``, so
task retries and a rerun of an applied batch write the same cells, and a rerun of a
batch cut short outranks whatever the cut-short attempt left. The one action on the
batch DataFrame is ``collect()`` of the tasks' tallies: a few rows per task (counts,
and the highest offset seen per Kafka partition). Only after every task succeeded
does the driver write the applied offsets and the batch record; if a task fails for
good the call raises, Spark does not commit the batch, and the next run redoes it.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from views.delta import DELTA_COLUMNS, DELTA_DDL, Delta, DeltaKind
from views.errors import StoreError
from views.row import BIGINT, INT, STRING, Column, arrow_schema, ddl
from views.sink import OnBatch, Sink, deltas_from_arrow, deltas_table, unpacked_batches
from views.stores.cassandra import statements as cql
from views.stores.cassandra.tasks import TaskWriter
from views.stores.contract import BatchStats, ViewWriter
from views.stores.plan import WritePlan, fold

if TYPE_CHECKING:
    from views.stores.cassandra.store import CassandraStore

#: What opens the store a task writes through, in the task's process
#: (:meth:`CassandraStore.task_stores`).
Opener = Callable[[], "CassandraStore"]

log = logging.getLogger(__name__)

#: Stage 1's output: deltas of the users of one task of stage 2, and the shuffle key.
_ROUTED_COLUMNS: Final = (*DELTA_COLUMNS, Column("route", BIGINT))
ROUTED_DDL: Final = ddl(_ROUTED_COLUMNS)
#: Stage 2's output, collected to the driver: a tally row per task (``topic`` null),
#: and per Kafka partition the highest offset and event time the task saw.
_TALLY_COLUMNS: Final = (
    Column("topic", STRING, nullable=True), Column("partition", INT),
    *(Column(n, BIGINT) for n in ("offset", "max_event_time", "rows", "adds", "removes",
                                  "dead")))
TALLY_DDL: Final = ddl(_TALLY_COLUMNS)
#: Not a :class:`DeltaKind`: stage 1's counts (rows in ``offset``, dead letters in
#: ``partition``), riding to stage 2 in a routed row.
TALLY: Final = 0
#: Kinds stage 1 consumes: everything it needs to write ``tweets`` and resolve removes.
_TWEET_SIDE: Final = frozenset({DeltaKind.TWEET, DeltaKind.REPOST, DeltaKind.TL_DEL,
                                DeltaKind.UNFANOUT, DeltaKind.DEAD})
#: Kinds routed to stage 1 by tweet id (the rest by their user or author).
_BY_TWEET: Final = (DeltaKind.TWEET, DeltaKind.REPOST, DeltaKind.TL_DEL, DeltaKind.UNFANOUT,
                    DeltaKind.TL_ADD, DeltaKind.FANOUT)
#: Kinds whose users a delta lists in ``raw`` (user ids): split by the task of each user.
_LISTED: Final = (DeltaKind.FANOUT, DeltaKind.TL_WIPE, DeltaKind.CELEB_EDGE, DeltaKind.HORIZON)
#: Kinds that go whole to the task of their ``user_id``.
_BY_USER: Final = (DeltaKind.TL_ADD, DeltaKind.BACKFILL, DeltaKind.ACTIVITY, DeltaKind.USER,
                   DeltaKind.RELATION)
#: Every kind stage 1 passes on: the rest of stage 2's, the resolved removes, the tally.
_ROUTED_KINDS: Final = frozenset({*_LISTED, DeltaKind.FOLLOW, *_BY_USER, DeltaKind.OFFSET,
                                  DeltaKind.CELEB, DeltaKind.TL_DEL, TALLY})
_ROUTED_SCHEMA: Final = arrow_schema(_ROUTED_COLUMNS)
_DELTA_SCHEMA: Final = arrow_schema(DELTA_COLUMNS)
_TALLY_SCHEMA: Final = arrow_schema(_TALLY_COLUMNS)


# -- stage 1: by tweet ------------------------------------------------------------------------

def spread(users: np.ndarray, n: int) -> np.ndarray:
    """Which of stage 2's ``n`` tasks takes each user's rows (a fixed mix of the id).

    Any function of the user alone keeps every row of a user in one task; this one
    spreads consecutive ids evenly.
    """
    mixed = users.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((mixed >> np.uint64(32)) % np.uint64(n)).astype(np.int64)


def routed(table: pa.Table, routes: Sequence[int]) -> pa.Table:
    """Stage 1's output: deltas that stage 2 writes, each with the route of its users' task.

    ``routes`` holds a value of the shuffle key per task of stage 2 (:func:`routes_for`):
    a row whose ``route`` is ``routes[p]`` goes to task ``p``. A fan-out, a follow's
    edges and the other deltas that list users in ``raw`` cross the shuffle packed, one
    row per task their users fall to, not a row per user; stage 2 folds them as the
    driver's path does (:func:`~views.stores.plan.fold`). Column-wise: a batch's rows
    are many, each small.
    """
    to = np.asarray(routes, dtype=np.int64)
    kinds = table.column("kind").to_numpy()
    unknown = sorted(set(np.unique(kinds).tolist()) - _ROUTED_KINDS)
    if unknown:
        msg = f"the executor sink has no route for delta kind {unknown[0]}"
        raise StoreError(msg)
    listed = np.isin(kinds, _LISTED)
    follow = kinds == DeltaKind.FOLLOW
    whole = table.filter(pa.array(~(listed | follow)))
    whole_kinds = kinds[~(listed | follow)]
    key = np.where(whole_kinds == DeltaKind.OFFSET,
                   whole.column("partition").to_numpy().astype(np.int64),
                   np.where(whole_kinds == DeltaKind.CELEB,
                            whole.column("author_id").to_numpy(),
                            whole.column("user_id").to_numpy()))
    parts = [(whole, to[spread(key, len(to))]),
             _split(table.filter(pa.array(listed)), 1, to),
             _split(table.filter(pa.array(follow)), 2, to)]
    return pa.concat_tables(
        pa.Table.from_arrays([*(t.column(f.name) for f in DELTA_COLUMNS), pa.array(r)],
                             schema=_ROUTED_SCHEMA) for t, r in parts)


def _split(rows: pa.Table, width: int, to: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """``rows`` as one row per task their users fall to; and each row's route.

    Each row lists users in ``raw``, ``width`` longs a user, its id first.
    """
    raw = rows.column("raw").combine_chunks()
    if len(raw) == 0:
        return rows, np.zeros(0, np.int64)
    offsets = np.frombuffer(raw.buffers()[1], np.int32)[raw.offset:raw.offset + len(raw) + 1]
    data = raw.buffers()[2]
    longs = (np.frombuffer(data, np.int64, (offsets[-1] - offsets[0]) // 8, offsets[0])
             if data is not None else np.zeros(0, np.int64))
    users = longs.reshape(-1, width)
    row = np.repeat(np.arange(len(raw)), np.diff(offsets) // (8 * width))
    task = spread(users[:, 0], len(to))
    order = np.lexsort((task, row))
    row, task, users = row[order], task[order], users[order]
    first = np.ones(len(row), bool)
    first[1:] = (row[1:] != row[:-1]) | (task[1:] != task[:-1])
    starts = np.flatnonzero(first)
    bounds = (np.append(starts, len(row)) * 8 * width).astype(np.int32)
    split = pa.Array.from_buffers(pa.binary(), len(starts),
                                  [None, pa.py_buffer(bounds), pa.py_buffer(users.tobytes())])
    out = rows.take(pa.array(row[starts]))
    return out.set_column(out.schema.get_field_index("raw"), "raw", split), to[task[starts]]


def routes_for(n: int, hashes: Sequence[int]) -> list[int]:
    """A value of the shuffle key per task: the first ``v`` with ``hashes[v] % n == p``.

    ``hashes[v]`` is Spark's partitioning hash of ``v`` (``hash(v)``, pmod ``n``), so
    ``repartition(n, "route")`` sends a row of route ``routes[p]`` to partition ``p``.
    """
    found: dict[int, int] = {}
    for value, h in enumerate(hashes):
        found.setdefault(h % n, value)
        if len(found) == n:
            return [found[p] for p in range(n)]
    msg = f"no value of the shuffle key lands in each of {n} partitions"
    raise StoreError(msg)


def spark_routes(spark: Any, n: int) -> list[int]:
    """:func:`routes_for` with Spark's partitioning hash (``hash``: Murmur3, seed 42)."""
    from pyspark.sql import functions as F

    probe = spark.range(0, 64 * n).select(F.expr(f"pmod(hash(id), {n})").alias("p"))
    return routes_for(n, [row.p for row in probe.collect()])


def removed_deltas(removes: list[cql.Removed]) -> list[Delta]:
    """Stage 1's resolved removes (timeline keys) as TL_DEL deltas, one user each."""
    return [Delta.timeline_remove(user, tweet, 0, created_at)
            for user, created_at, tweet in removes]


def tweet_stage(open_store: Opener, ts: int, routes: Sequence[int],
                batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A task of stage 1: write its tweets, pass everything else on to its users' tasks."""
    given = list(batches)  # Spark's schema: DELTA_DDL's, nullability aside
    table = (pa.Table.from_batches(given).cast(_DELTA_SCHEMA) if given
             else _DELTA_SCHEMA.empty_table())
    tweet_side = pa.array(np.isin(table.column("kind").to_numpy(), list(_TWEET_SIDE)))
    plan = ViewWriter.plan(deltas_from_arrow(table.filter(tweet_side)))
    extra: list[Delta] = []
    if plan.rows():
        removes, _ = TaskWriter(open_store()).write_tweets(plan, ts)
        extra = [*removed_deltas(removes),
                 Delta(TALLY, offset=len(plan.tweets) + len(plan.foreign_deletes)
                       + len(plan.reposts) + len(plan.dead), partition=len(plan.dead))]
    rest = pa.concat_tables([table.filter(pc.invert(tweet_side)), deltas_table(extra)])
    yield from routed(rest, routes).to_batches()


# -- stage 2: by user -------------------------------------------------------------------------

def _user_plan(table: pa.Table) -> tuple[WritePlan, int, int]:
    """Stage 2's rows as a plan of its users; and stage 1's tallies (rows, dead).

    Every row is a delta of this task's users, folded by :func:`~views.stores.plan.fold`
    as the driver's path folds the batch. The rows come in whatever order the shuffle
    delivered them; the folds give the same plan for any order
    (``tests/views/stores/test_write_plan.py``).
    """
    plan = WritePlan()
    tally = pc.equal(table.column("kind"), TALLY)
    counts = table.filter(tally)
    rows = int(pc.sum(counts.column("offset")).as_py() or 0)
    dead = int(pc.sum(counts.column("partition")).as_py() or 0)
    for d in deltas_from_arrow(table.filter(pc.invert(tally))):
        fold(plan, d)
    return plan, rows, dead


def user_stage(open_store: Opener, ts: int, batches: Iterator[pa.RecordBatch],
               inactive_ms: int = 0) -> Iterator[pa.RecordBatch]:
    """A task of stage 2: write its users' rows; yield its tally and offsets.

    ``inactive_ms``: the job's store's (inactive users; 0: off).
    """
    table = pa.Table.from_batches(list(batches), schema=_ROUTED_SCHEMA)
    plan, rows, dead = _user_plan(table)
    adds = removes = 0
    if plan.rows():
        counts = TaskWriter(open_store()).write_users(plan, ts, inactive_ms)
        adds, removes = counts.adds, counts.removes
    offsets = sorted(plan.offsets.items())
    yield pa.RecordBatch.from_pydict({
        "topic": [None] + [t for (t, _), _ in offsets],
        "partition": [0] + [p for (_, p), _ in offsets],
        "offset": [0] + [o for _, o in offsets],
        "max_event_time": [plan.max_event_time] * (1 + len(offsets)),
        "rows": [rows + plan.rows()] + [0] * len(offsets),
        "adds": [adds] + [0] * len(offsets),
        "removes": [removes] + [0] * len(offsets),
        "dead": [dead] + [0] * len(offsets)}, schema=_TALLY_SCHEMA)


# -- the driver ---------------------------------------------------------------------------------

def tweet_route() -> Any:
    """Stage 1's shuffle key: the tweet for tweet-side kinds, else the user or author."""
    from pyspark.sql import functions as F

    kind = F.col("kind")
    return (F.when(kind.isin(*(int(k) for k in _BY_TWEET)), F.col("tweet_id"))
            .when(kind == int(DeltaKind.USER), F.col("user_id"))
            .otherwise(F.col("author_id").bitwiseXOR(F.col("user_id"))
                       .bitwiseXOR(F.col("offset"))))


class ExecutorSink(Sink):
    """``foreachBatch`` callable writing Cassandra from the executors (module docstring)."""

    def __init__(self, store: CassandraStore, checkpoint: Path | None = None, *,
                 partitions: int | None = None, on_batch: OnBatch | None = None) -> None:
        super().__init__(store, on_batch)
        self.open_store = store.task_stores()
        self.checkpoint = checkpoint
        self.partitions = partitions
        self._routes: dict[int, list[int]] = {}

    def __call__(self, frame: Any, batch_id: int) -> None:
        start = time.perf_counter()
        ts, digest = self.begin(batch_id)
        n = self.partitions or frame.sparkSession.sparkContext.defaultParallelism
        tallies = (frame.mapInArrow(unpacked_batches, DELTA_DDL)
                   .repartition(n, tweet_route())
                   .mapInArrow(functools.partial(tweet_stage, self.open_store, ts,
                                                 self.routes(frame.sparkSession, n)),
                               ROUTED_DDL)
                   .repartition(n, "route")
                   .mapInArrow(functools.partial(user_stage, self.open_store, ts,
                                                 inactive_ms=self.store.inactive_ms),
                               TALLY_DDL)
                   .collect())
        self.finish(batch_id, ts, digest, tallies, start)

    def routes(self, spark: Any, n: int) -> list[int]:
        """Stage 2's shuffle key per task (:func:`spark_routes`), found once per ``n``."""
        if n not in self._routes:
            self._routes[n] = spark_routes(spark, n)
        return self._routes[n]

    def begin(self, batch_id: int) -> tuple[int, str]:
        """The batch's write timestamp (durable before any task writes), and its name."""
        digest = self._run_digest(batch_id)
        return self._open().begin(batch_id, digest), digest

    def finish(self, batch_id: int, ts: int, digest: str, tallies: list[Any],
               start: float) -> BatchStats:
        """Record a batch whose tasks all succeeded: offsets, batch log, stats."""
        offsets: dict[tuple[str, int], int] = {}
        for row in tallies:
            if row.topic is not None:
                where = (row.topic, row.partition)
                offsets[where] = max(offsets.get(where, -1), row.offset)
        rows = sum(r.rows for r in tallies)
        record = cql.BatchRecord(batch_id, ts, digest, int(time.time() * 1000), rows,
                                 time.perf_counter() - start,
                                 max((r.max_event_time for r in tallies), default=0))
        self._open().finish(record, offsets)
        stats = BatchStats(batch_id, rows, sum(r.adds for r in tallies),
                           sum(r.removes for r in tallies), sum(r.dead for r in tallies),
                           time.perf_counter() - start)
        self._record(stats)
        return stats

    def _record(self, stats: BatchStats) -> None:
        self.history.append((stats.batch_id, stats.seconds, stats))
        log.info("batch %d: %d rows (%d timeline adds, %d removes, %d dead) written from "
                 "the executors in %.2fs", stats.batch_id, stats.deltas, stats.timeline_adds,
                 stats.timeline_removes, stats.dead_letters, stats.seconds)
        if self.on_batch is not None:
            self.on_batch(stats, stats.seconds)

    def _open(self) -> TaskWriter:
        return TaskWriter(self.open_store())  # the driver's store, kept like an executor's

    def _run_digest(self, batch_id: int) -> str:
        """Name of this checkpoint's batch: the query id Spark keeps in it, and the batch id."""
        run = _query_id(self.checkpoint) if self.checkpoint is not None else None
        return "" if run is None else cql.offsets_digest({(f"run:{run}", 0): batch_id})

    def close(self) -> None:
        """Nothing pending: each call writes its batch before returning."""


def _query_id(checkpoint: Path) -> str | None:
    """The id in ``<checkpoint>/metadata`` (written by Spark when the query first starts)."""
    try:
        first = (checkpoint / "metadata").read_text().splitlines()[0]
        return str(json.loads(first)["id"])
    except (OSError, IndexError, ValueError, KeyError, TypeError):
        return None

