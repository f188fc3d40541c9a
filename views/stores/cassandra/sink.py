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

Stage 1 runs over the packed deltas (one row per tweet, however many followers);
it unpacks them into one row per user, and those go through one shuffle to stage 2.
Stage 2 starts only when stage 1 has finished, so a tweet's hydration row is written
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa

from views.delta import DELTA_COLUMNS, DELTA_DDL, Delta, DeltaKind
from views.errors import StoreError
from views.row import BIGINT, INT, STRING, Column, arrow_schema, ddl
from views.sink import OnBatch, Sink, deltas_from_arrow, unpacked_batches
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

#: Stage 1's output: deltas one user each (``user_id``), and the shuffle key.
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
#: Kinds that reach stage 2 whole (they carry strings), routed by ``user_id``.
_KEYED: Final = (DeltaKind.USER, DeltaKind.RELATION, DeltaKind.OFFSET)
#: Kinds whose users a delta lists in ``raw``: a routed row's ``raw`` lists its one user
#: (a follow, the follower and the edge's time), so stage 2 folds it as it is.
_LISTED: Final = (DeltaKind.TL_WIPE, DeltaKind.CELEB_EDGE, DeltaKind.HORIZON)
_ROUTED_SCHEMA: Final = arrow_schema(_ROUTED_COLUMNS)
_TALLY_SCHEMA: Final = arrow_schema(_TALLY_COLUMNS)


# -- stage 1: by tweet ------------------------------------------------------------------------

#: Stage 1's columns that rows() takes as a scalar or an array per call.
_SPREAD: Final = ("kind", "tweet_id", "author_id", "created_at", "flag")


def _spread(parts: list[Any], counts: np.ndarray) -> np.ndarray:
    """One column: each scalar repeated ``count`` times, each array as it is, in order."""
    scalar = [not isinstance(p, np.ndarray) for p in parts]
    out = np.repeat(np.array([p if s else 0 for p, s in zip(parts, scalar, strict=True)],
                             dtype=np.int64), counts)
    if not all(scalar):
        ends = np.cumsum(counts)
        for i in (i for i, s in enumerate(scalar) if not s):
            out[ends[i] - counts[i]:ends[i]] = parts[i]
    return out


class _Routed:
    """Stage 1's output rows, gathered column-wise (fan-out rows arrive as arrays)."""

    def __init__(self) -> None:
        # Per call of rows(): its users, and each column's value (a scalar or an array
        # as long as the users). Expanded once, in table(): numpy's per-call overhead
        # (~10 us a broadcast) was most of stage 1 when taken per delta.
        self.users: list[np.ndarray] = []
        self.values: dict[str, list[Any]] = {n: [] for n in _SPREAD}
        self.keyed: list[Delta] = []  # rows with strings: profiles, relations, offsets, tallies

    def rows(self, kind: int, users: Any, *, tweet: Any = 0, author: Any = 0,
             created_at: Any = 0, flag: int = 0) -> None:
        self.users.append(np.asarray(users, dtype=np.int64).reshape(-1))
        for name, value in zip(_SPREAD, (kind, tweet, author, created_at, flag), strict=True):
            self.values[name].append(value)

    def table(self) -> pa.Table:
        counts = np.fromiter((len(u) for u in self.users), np.int64, len(self.users))
        users = np.concatenate(self.users) if self.users else np.zeros(0, np.int64)
        arrays = {name: _spread(parts, counts) for name, parts in self.values.items()}
        arrays.update(user_id=users, route=users)
        zeros = np.zeros(len(users), np.int64)  # the columns these rows do not use
        n = len(arrays["kind"])
        columns = {f.name: pa.nulls(n, f.type) if f.nullable and f.name not in arrays
                   else pa.array(arrays.get(f.name, zeros), f.type) for f in _ROUTED_SCHEMA}
        columns["raw"] = _raw(arrays["kind"], users, arrays["created_at"])
        bulk = pa.table(columns, schema=_ROUTED_SCHEMA)
        keyed = pa.table({f.name: pa.array([_route(d) if f.name == "route"
                                            else getattr(d, f.name) for d in self.keyed],
                                           f.type) for f in _ROUTED_SCHEMA},
                         schema=_ROUTED_SCHEMA)
        return pa.concat_tables([bulk, keyed])


def _raw(kinds: np.ndarray, users: np.ndarray, created_at: np.ndarray) -> pa.Array:
    """The ``raw`` of routed rows: the one user of a listing kind, a follow's pair, else null."""
    follow = kinds == DeltaKind.FOLLOW
    longs = np.where(np.isin(kinds, _LISTED), 1, 0) + np.where(follow, 2, 0)
    ends = np.cumsum(longs)
    values = np.empty(int(ends[-1]) if len(ends) else 0, np.int64)
    listed = longs > 0
    values[(ends - longs)[listed]] = users[listed]
    values[(ends - longs)[follow] + 1] = created_at[follow]
    offsets = np.concatenate(([0], ends * 8)).astype(np.int32)
    valid = pa.array(listed, pa.bool_()).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), len(kinds),
                                 [valid, pa.py_buffer(offsets), pa.py_buffer(values)])


def _route(d: Delta) -> int:
    return d.partition if d.kind == DeltaKind.OFFSET else d.user_id


def _longs(raw: bytes | None) -> np.ndarray:
    return np.frombuffer(raw or b"", dtype=np.int64)


def _unpack(d: Delta, out: _Routed) -> None:
    """One delta of stage 1's input as rows of one user each (tweet-side kinds excluded)."""
    kind = d.kind
    if kind == DeltaKind.TL_ADD:
        out.rows(kind, d.user_id, tweet=d.tweet_id, author=d.author_id,
                 created_at=d.created_at)
    elif kind == DeltaKind.FANOUT:
        out.rows(DeltaKind.TL_ADD, _longs(d.raw), tweet=d.tweet_id, author=d.author_id,
                 created_at=d.created_at)
    elif kind == DeltaKind.BACKFILL:
        pairs = _longs(d.raw)
        out.rows(DeltaKind.TL_ADD, np.full(len(pairs) // 2, d.user_id), tweet=pairs[1::2],
                 author=d.author_id, created_at=pairs[0::2])
    elif kind in (DeltaKind.TL_WIPE, DeltaKind.CELEB_EDGE):
        out.rows(kind, _longs(d.raw), author=d.author_id, flag=d.flag)
    elif kind == DeltaKind.HORIZON:
        out.rows(kind, _longs(d.raw), tweet=d.tweet_id, created_at=d.created_at)
    elif kind == DeltaKind.FOLLOW:
        pairs = _longs(d.raw)
        out.rows(kind, pairs[0::2], author=d.author_id, created_at=pairs[1::2], flag=d.flag)
    elif kind == DeltaKind.CELEB:
        out.rows(kind, d.author_id, author=d.author_id, flag=d.flag)
    elif kind == DeltaKind.ACTIVITY:  # to the task of the user's timeline (inactive users)
        out.rows(kind, d.user_id, created_at=d.created_at)
    elif kind in _KEYED:
        out.keyed.append(d)
    else:
        msg = f"the executor sink has no route for delta kind {kind}"
        raise StoreError(msg)


def route_removes(removes: list[cql.Removed], out: _Routed) -> None:
    """Stage 1's resolved removes (timeline keys) as TL_DEL rows, one user each."""
    if removes:
        cols = np.array(removes, dtype=np.int64)
        out.rows(DeltaKind.TL_DEL, cols[:, 0], created_at=cols[:, 1], tweet=cols[:, 2])


def tweet_stage(open_store: Opener, ts: int,
                 batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A task of stage 1: write its tweets, pass everything else on one user per row."""
    deltas = [d for b in batches for d in deltas_from_arrow(pa.Table.from_batches([b]))]
    out = _Routed()
    tweet_side = [d for d in deltas if d.kind in _TWEET_SIDE]
    if tweet_side:
        plan = ViewWriter.plan(tweet_side)
        removes, _ = TaskWriter(open_store()).write_tweets(plan, ts)
        route_removes(removes, out)
        out.keyed.append(Delta(TALLY, offset=len(plan.tweets) + len(plan.foreign_deletes)
                               + len(plan.reposts)
                               + len(plan.dead), partition=len(plan.dead)))
    for d in deltas:
        if d.kind not in _TWEET_SIDE:
            _unpack(d, out)
    yield from out.table().to_batches()


# -- stage 2: by user -------------------------------------------------------------------------

def _user_plan(table: pa.Table) -> tuple[WritePlan, int, int]:
    """Stage 2's rows as a plan of its users; and stage 1's tallies (rows, dead).

    Every row is a plain delta of one user, folded by :func:`~views.stores.plan.fold`
    as the driver's path folds the batch — the timeline adds, most of a batch's rows,
    taken column-wise as their fold would take them one by one. The rows come in
    whatever order the shuffle delivered them; the folds give the same plan for any
    order (``tests/views/stores/test_write_plan.py``).
    """
    plan = WritePlan()
    kinds = table.column("kind").to_numpy()
    add = kinds == DeltaKind.TL_ADD
    plan.adds.extend_columns(*(table.column(n).to_numpy()[add]
                               for n in ("user_id", "created_at", "tweet_id", "author_id")))
    tally = kinds == TALLY
    rows = int(table.column("offset").to_numpy()[tally].sum())
    dead = int(table.column("partition").to_numpy()[tally].sum())
    for d in deltas_from_arrow(table.filter(pa.array(~add & ~tally))):
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

    def __call__(self, frame: Any, batch_id: int) -> None:
        start = time.perf_counter()
        ts, digest = self.begin(batch_id)
        n = self.partitions or frame.sparkSession.sparkContext.defaultParallelism
        tallies = (frame.mapInArrow(unpacked_batches, DELTA_DDL)
                   .repartition(n, tweet_route())
                   .mapInArrow(functools.partial(tweet_stage, self.open_store, ts),
                               ROUTED_DDL)
                   .repartition(n, "route")
                   .mapInArrow(functools.partial(user_stage, self.open_store, ts,
                                                 inactive_ms=self.store.inactive_ms),
                               TALLY_DDL)
                   .collect())
        self.finish(batch_id, ts, digest, tallies, start)

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

