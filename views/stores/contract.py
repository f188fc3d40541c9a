"""The store contract: what the sink writes and what the read path reads.

A store has three sides, each a small abstract class, so that every caller types
against the side it uses and none asks which backend it holds:

- :class:`TimelineReader`, what serving reads (a page's rows, the celebrities, the
  applied offsets), with the capabilities a server needs: whether reads are answered
  in process (:attr:`~TimelineReader.reads_in_process`) and where its committed state
  stands, for caches kept across reads (:meth:`~TimelineReader.version`);
- :class:`ViewWriter`, what the view job writes through (:meth:`~ViewWriter.apply`,
  or the sink a backend builds for the job's checkpoint, :meth:`~ViewWriter.job_sink`);
- :class:`StoreAdmin`, what operators, metrics and ``verify`` read about the store
  itself (dead letters, the batch log, row counts, the users to check).

:class:`Store` is all three, with the lifecycle: constructors never touch the network
or the disk, :meth:`Store.open` does.

:meth:`ViewWriter.apply` does the fixed work for every backend — it folds a
micro-batch's deltas into a :class:`WritePlan` (netting, ordering, per-partition
offsets) and hands it to the backend's one I/O hook, :meth:`ViewWriter._write`, which
applies the plan atomically and idempotently and trims timelines to the cap. Backends
implement that hook and the read methods; nothing else.

Applying the same plan twice leaves the store as applying it once (every write is an
upsert or a delete keyed by its primary key), which is what makes a micro-batch
replayed after a crash invisible (DESIGN §4, exactly-once in effect).
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from views.delta import Delta, Key
from views.stores.plan import WritePlan, fold
from views.stores.rows import (
    BatchInfo,
    DeadLetter,
    Entry,
    HomeStart,
    Hydrated,
    Relations,
    TweetRow,
    UserRow,
)
from views.stores.versions import StoreVersion

if TYPE_CHECKING:
    from views.sink import Sink


@dataclass(frozen=True)
class BatchStats:
    """What one :meth:`ViewWriter.apply` did."""

    batch_id: int
    deltas: int
    timeline_adds: int
    timeline_removes: int
    dead_letters: int
    seconds: float


class TimelineReader(abc.ABC):
    """What serving reads: a page's rows, the celebrities, and how far the view has applied.

    Reads see committed rows only. Besides the reads, a reader declares what a server
    needs to know of it, so that no caller asks which backend it holds:
    :attr:`reads_in_process`, :attr:`rows_shared` and :meth:`version`.
    """

    #: Whether reads are answered in this process in microseconds (no network), so a
    #: server may run them inline rather than on a worker thread.
    reads_in_process: bool = False

    #: Whether a batch becomes visible at once (SQLite: one transaction), so that
    #: applied offsets unchanged across reads mean the reads saw no part of a later batch.
    #: Cassandra's executors write a batch's rows before its offsets commit.
    atomic_batches: bool = False

    #: Whether the rows a page reads by id (tweets, profiles, the reposts of an original)
    #: read the same for every reader, so a cache may keep them for all readers. SQLite's
    #: ``reposts_of`` with a reader lists only the reposts by that reader's followees.
    rows_shared: bool = True

    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        """Reads inside see one committed state (where the backend can offer it)."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def cached(self, user: int, below: Key | None, limit: int) -> list[Entry]:
        """Cached home entries of ``user`` with key < ``below``, newest first."""

    def home_start(self, user: int, below: Key | None, limit: int) -> HomeStart:
        """The reads a home page starts with, none of which needs another's answer.

        :meth:`horizon`, :meth:`celebrities_followed` and :meth:`relations` of ``user``,
        and :meth:`cached` ``(user, below, limit)``. A backend that pays a round trip
        per read issues them at once; this default reads them in turn.
        """
        return HomeStart(self.horizon(user), self.celebrities_followed(user),
                         self.relations(user), self.cached(user, below, limit))

    @abc.abstractmethod
    def horizon(self, user: int) -> Key | None:
        """The key below which ``user``'s cache may be incomplete (None: complete).

        :data:`DORMANT` for an inactive user: nothing of the cache is trusted.
        """

    @abc.abstractmethod
    def celebrities_followed(self, user: int) -> list[int]:
        """Celebrities ``user`` follows (merged at read time)."""

    @abc.abstractmethod
    def followees(self, user: int) -> list[int]:
        """Everyone ``user`` follows."""

    @abc.abstractmethod
    def author_tweets(self, authors: Sequence[int], below: Key | None,
                      limit: int) -> list[Entry]:
        """Live tweets of ``authors`` with key < ``below``, newest first, at most ``limit``."""

    def recent_by_author(self, authors: Sequence[int], n: int) -> dict[int, list[Entry]]:
        """Each author's newest ``n`` live tweets, newest first (backends batch this)."""
        return {a: self.author_tweets([a], None, n) for a in authors}

    @abc.abstractmethod
    def tweets(self, ids: Sequence[int]) -> dict[int, TweetRow]:
        """Tweets and reposts by id (deleted or hidden ones included, flagged)."""

    @abc.abstractmethod
    def users(self, ids: Sequence[int]) -> dict[int, UserRow]:
        """Profiles by id; a deleted account is a row with ``deleted`` set."""

    @abc.abstractmethod
    def relations(self, user: int) -> Relations:
        """The blocks (both ways) and mutes that filter ``user``'s home timeline."""

    @abc.abstractmethod
    def reposts_of(self, originals: Sequence[int], above: Mapping[int, Key] | None = None,
                   reader: int | None = None) -> dict[int, list[Entry]]:
        """Shown reposts of each original tweet, newest first (``author_id``: the reposter).

        Originals with none are left out. What the read path needs to keep one entry
        per original tweet (the newest appearance) across pages. ``above``: only the
        reposts whose key is above the original's key there (a page asks only for those
        newer than its own entry: a viral tweet's older reposts are not read).
        ``reader``: the store may leave out reposts by authors ``reader`` does not
        follow, where it can tell without another round trip (only a followee's repost
        shows on a home page; the caller filters by the followees anyway).
        """

    def hydrate(self, tweets: Sequence[int], users: Sequence[int], reposts: Mapping[int, Key],
                reader: int | None = None, followees: bool = False) -> Hydrated:
        """Tweets, profiles, reposts above bounds and the reader's followees, read together.

        :meth:`tweets`, :meth:`users`, :meth:`reposts_of` (``reposts``: each original's
        bound) and, with ``followees``, :meth:`followees` of ``reader``. What a page
        decides on once it has its entries' rows: one round trip on a store that can run
        them at once (Cassandra); in turn here.
        """
        return Hydrated(self.tweets(tweets) if tweets else {},
                        self.users(users) if users else {},
                        self.reposts_of(list(reposts), reposts, reader) if reposts else {},
                        self.followees(reader) if followees and reader is not None else None)

    @abc.abstractmethod
    def celebrities(self) -> list[int]:
        """Every author on the celebrity path."""

    @abc.abstractmethod
    def applied_offsets(self) -> dict[tuple[str, int], int]:
        """Highest applied offset per (logical topic, partition).

        Where the view stands: what an ``?after=`` read waits for, what ``verify`` and
        the health check report, and the default :meth:`version`.
        """

    def version(self) -> StoreVersion:
        """Where this store's committed state stands, for caches kept across reads.

        A :class:`~views.stores.versions.StoreVersion` (this default: the applied
        offsets), or a :class:`~views.stores.versions.ChangeFeed` when the backend keeps
        one; what serving's page caches build their tokens on
        (:mod:`serving.pageversions`). One per reading process, built after the store is
        opened; close it before the store.
        """
        return StoreVersion(self)



class ReaderProxy(TimelineReader):
    """A :class:`TimelineReader` that passes every read to ``inner``; subclasses override some."""

    def __init__(self, inner: TimelineReader) -> None:
        self.inner = inner
        self.reads_in_process = inner.reads_in_process
        self.rows_shared = inner.rows_shared
        self.atomic_batches = inner.atomic_batches

    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        return self.inner.snapshot()

    def cached(self, user: int, below: Key | None, limit: int) -> list[Entry]:
        return self.inner.cached(user, below, limit)

    def home_start(self, user: int, below: Key | None, limit: int) -> HomeStart:
        return self.inner.home_start(user, below, limit)

    def horizon(self, user: int) -> Key | None:
        return self.inner.horizon(user)

    def celebrities_followed(self, user: int) -> list[int]:
        return self.inner.celebrities_followed(user)

    def followees(self, user: int) -> list[int]:
        return self.inner.followees(user)

    def author_tweets(self, authors: Sequence[int], below: Key | None,
                      limit: int) -> list[Entry]:
        return self.inner.author_tweets(authors, below, limit)

    def recent_by_author(self, authors: Sequence[int], n: int) -> dict[int, list[Entry]]:
        return self.inner.recent_by_author(authors, n)

    def tweets(self, ids: Sequence[int]) -> dict[int, TweetRow]:
        return self.inner.tweets(ids)

    def users(self, ids: Sequence[int]) -> dict[int, UserRow]:
        return self.inner.users(ids)

    def relations(self, user: int) -> Relations:
        return self.inner.relations(user)

    def reposts_of(self, originals: Sequence[int], above: Mapping[int, Key] | None = None,
                   reader: int | None = None) -> dict[int, list[Entry]]:
        return self.inner.reposts_of(originals, above, reader)

    def hydrate(self, tweets: Sequence[int], users: Sequence[int], reposts: Mapping[int, Key],
                reader: int | None = None, followees: bool = False) -> Hydrated:
        return self.inner.hydrate(tweets, users, reposts, reader, followees)

    def celebrities(self) -> list[int]:
        return self.inner.celebrities()

    def applied_offsets(self) -> dict[tuple[str, int], int]:
        return self.inner.applied_offsets()

    def version(self) -> StoreVersion:
        return self.inner.version()


class ViewWriter(abc.ABC):
    """What the view job writes through: one micro-batch of deltas at a time.

    :meth:`apply` does the fixed work (module docstring) and hands the plan to the
    backend's one I/O hook, :meth:`_write`. A backend that takes its writes another
    way builds its own sink for the job (:meth:`job_sink`).
    """

    #: Entries a user's cached timeline keeps; older ones are trimmed below a horizon.
    cap: int
    #: Inactive users (DESIGN §4b): a user whose newest read is older than this (in
    #: event time) than an entry meant for them gets no more fan-out writes until they
    #: read again (0: off). See :data:`DORMANT`.
    inactive_ms: int
    #: Records a micro-batch takes while the job is behind, unless
    #: ``FANOUT_MAX_RECORDS_PER_BATCH`` says (views.settings). At 1M users a bulk batch
    #: of follows rewrites nearly every state page (~220 MB): with 20k records a batch
    #: the graph replayed at 4,765 events/s, with 200k at 25,094/s (20k users: 23,209/s).
    catch_up_records: int = 200_000

    def apply(self, deltas: Iterable[Delta], batch_id: int = -1) -> BatchStats:
        """Apply one micro-batch of deltas atomically and idempotently."""
        start = time.perf_counter()
        plan = self.plan(deltas)
        self._write(plan, batch_id)
        return BatchStats(batch_id, plan.rows(), len(plan.adds), len(plan.removes),
                          len(plan.dead), time.perf_counter() - start)

    @staticmethod
    def plan(deltas: Iterable[Delta]) -> WritePlan:
        """Fold deltas into a plan: last write per row wins, deletes of tweets stick.

        Timeline changes apply as wipes, then removes, then adds. They need no netting
        here: a (user, tweet) pair only ever comes from the tweet's author's key, which
        the join already netted (and it cancelled any add a later wipe undoes).
        """
        plan = WritePlan()
        for d in deltas:
            fold(plan, d)
        return plan

    @abc.abstractmethod
    def _write(self, plan: WritePlan, batch_id: int) -> None:
        """Apply ``plan`` in one atomic step and trim touched timelines to ``cap``."""

    def job_sink(self, checkpoint: Path) -> Sink | None:
        """The sink the view job writes this store through, when the backend has its own.

        None (the default): the job's batches come to the driver and go through
        :meth:`apply` (``views.sink``, spooled). A backend that takes writes from
        many clients at once gives its own, bound to the job's ``checkpoint``.
        """
        return None


class StoreAdmin(abc.ABC):
    """What operators, metrics and ``verify`` read about the store rather than a page."""

    @abc.abstractmethod
    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest dead letters."""

    @abc.abstractmethod
    def dead_letter_count(self) -> int:
        """How many dead letters the store holds; read on every metrics scrape."""

    @abc.abstractmethod
    def batches(self, limit: int = 100) -> list[BatchInfo]:
        """The newest ``limit`` logged micro-batches, newest (highest batch_id) first.

        ``max_event_time`` is the newest event time applied in the batch (0: none),
        so view lag is now minus the largest of these. Read on every metrics scrape:
        must cost O(limit), not a table scan.
        """

    @abc.abstractmethod
    def counts(self) -> dict[str, int]:
        """Row counts per table (for summaries and metrics)."""

    @abc.abstractmethod
    def home_users(self) -> list[int]:
        """Users with at least one followee (what verify walks)."""


class Store(TimelineReader, ViewWriter, StoreAdmin):
    """A materialized-view store: its three sides and its lifecycle (module docstring)."""

    def __init__(self, cap: int = 800, inactive_days: float = 0.0) -> None:
        self.cap = cap
        self.inactive_ms = round(inactive_days * 86_400_000)

    @abc.abstractmethod
    def open(self) -> Store:
        """Connect and create the schema if needed; return self."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""

    def __enter__(self) -> Store:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

