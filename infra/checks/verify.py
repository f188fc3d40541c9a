"""``fanout verify``: the live store against the DESIGN's SQL recomputed from the logs.

The changelogs are read in batch from the beginning (``views.changelog``), folded
into :class:`~views.reference.Reference` and evaluated as §4b's query — newest first
(``home_fast``), which is property-tested equal to the literal SQL. Each user's served
timeline — read page by page through ``serving.timeline``, the same path the API uses
(cache, celebrity entries, read-time fallback, then blocks, mutes, deleted accounts
and originals, reply visibility, one entry per original) — must equal the query's
first ``N`` entries (all ``cap``, or the first pages only), field by field: entry id,
time, actor, original tweet and its author. Checked users: every user the log says
follows someone, plus every user the store holds anything for (stale rows count as
divergence), minus deleted accounts, whose timelines are not served.

Reading what is served is most of the cost: on a generated 20,000-user social history
(800,000 events) a full 800-entry timeline takes about 90 ms of CPU to read through
``serving.timeline`` from SQLite and 2 ms to recompute. So the reads are what runs in
parallel, beside the recomputation (:func:`_reads`).
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import functools
import gc
import heapq
import itertools
import logging
import multiprocessing
import operator
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from infra.services.process import HEARTBEAT_S
from ingest.progress import progress as progress_bar
from ingest.settings import KafkaSettings
from serving.errors import NotFound
from serving.pageversions import PageVersions, page_versions
from serving.timeline import home_top
from views.changelog import Changelog, read_changelog
from views.delta import TOP, Key
from views.join import DEFAULT_LATENESS_MS
from views.kafka_offsets import EndOffsets
from views.reference import HomeRow, Reference
from views.stores.base import (
    Entry,
    HomeStart,
    Hydrated,
    ReaderProxy,
    Relations,
    Store,
    TimelineReader,
    TweetRow,
    UserRow,
)

log = logging.getLogger(__name__)


@dataclass
class VerifyResult:
    """Outcome of one verification."""

    users_checked: int = 0
    divergent: int = 0
    samples: list[str] = field(default_factory=list)
    events: int = 0
    invalid: int = 0
    #: Records past the lateness bound, left out of the query as the job leaves them out.
    late: int = 0
    lagging_partitions: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: Who diverged (all of them, not only the described ``samples``).
    divergent_users: list[int] = field(default_factory=list)
    #: The described users' missing entries (the reference's rows) by the index of their
    #: sample, for :func:`explain`.
    missing: dict[int, tuple[int, list[HomeRow]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.divergent == 0 and not self.lagging_partitions

    def render(self) -> str:
        lines = [f"verify: {self.users_checked} users checked, {self.divergent} divergent "
                 f"({self.events} events, {self.invalid} invalid records, "
                 f"{self.late} late, {self.seconds:.1f}s)"]
        if self.lagging_partitions:
            lines.append("  view is behind the log on: " + ", ".join(self.lagging_partitions))
        lines += [f"  {s}" for s in self.samples]
        return "\n".join(lines)


def end_offsets(kafka: KafkaSettings) -> dict[tuple[str, int], int]:
    """The end offset of every (logical topic, partition) of the changelogs."""
    offsets = EndOffsets(kafka.bootstrap)
    tps = offsets.topic_partitions(kafka.physical_topics())
    return {(kafka.logical(t), p): end for (t, p), end in offsets.ends(tps).items()}


def _ahead(store: TimelineReader, ends: dict[tuple[str, int], int]) -> bool:
    """Whether the view has applied a record at or past ``ends`` (a log read earlier)."""
    return any(offset >= ends.get(tp, 0) for tp, offset in store.applied_offsets().items())


def lagging(store: TimelineReader, ends: dict[tuple[str, int], int]) -> list[str]:
    """Partitions whose last record the store has not applied yet."""
    applied = store.applied_offsets()
    return [f"{t}[{p}] applied {applied.get((t, p), -1)} of {end - 1}"
            for (t, p), end in sorted(ends.items())
            if end > 0 and applied.get((t, p), -1) < end - 1]


def wait_caught_up(store: TimelineReader, ends: dict[tuple[str, int], int], timeout: float) -> bool:
    """Wait (bounded) until the store has applied every record up to ``ends``."""
    deadline = time.monotonic() + timeout
    while lagging(store, ends):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)
    return True


def verify(kafka: KafkaSettings, store: Store, cap: int, *, sample: int | None = None,
           wait: float = 0.0, seed: int = 0, max_samples: int = 5, progress: bool = False,
           entries: int | None = None, opener: Callable[[], Store] | None = None,
           workers: int | None = None,
           lateness: int | None = DEFAULT_LATENESS_MS) -> VerifyResult:
    """Compare served timelines with the recomputed query; see the module docstring.

    ``entries``, ``opener``, ``workers`` and ``lateness`` are :func:`compare`'s.
    """
    start = time.perf_counter()
    with _reader_pool(opener, workers) as pool:
        log.info("reading the changelogs from the start")
        log_ = read_changelog(kafka)
        if wait > 0 and not wait_caught_up(store, log_.ends, wait):
            log.warning("view did not catch up within %.0fs", wait)
        result = compare(log_, store, cap, sample=sample, seed=seed, max_samples=max_samples,
                         progress=progress, entries=entries, opener=opener, workers=workers,
                         lateness=lateness, pool=pool)
        if result.divergent_users and _ahead(store, log_.ends):
            # Records that reached the log after it was read (a write answered 503 whose
            # record landed later, say) were applied before the pages were: the users
            # who differ are compared again with the log read anew.
            log.info("the view applied records past the log as read; comparing the %d "
                     "divergent users again", result.divergent)
            log_ = read_changelog(kafka)
            if wait > 0:
                wait_caught_up(store, log_.ends, wait)
            again = compare(log_, store, cap, users=result.divergent_users, seed=seed,
                            max_samples=max_samples, entries=entries, opener=opener,
                            workers=workers, lateness=lateness, pool=pool)
            result.divergent, result.divergent_users = again.divergent, again.divergent_users
            result.samples, result.missing = again.samples, again.missing
    result.lagging_partitions = lagging(store, log_.ends)
    result.seconds = time.perf_counter() - start
    return result


#: Users whose served timelines are read at once from a store whose reads wait on
#: the network (a Cassandra round trip each page): their waits overlap.
READERS = 8
#: Users a reader process is handed at a time: few round trips, a bar that still moves.
CHUNK = 16

#: A served entry's fields in the order of the reference's rows (entry id, time, actor,
#: original and its author).
_ROW_FIELDS = operator.itemgetter(1, 0, 2, 3, 4)

#: What a user is served: the entries as the reference's rows (plain tuples of their
#: fields, which compare equal to them and cross from a reader process at a fraction of
#: the cost), or why nothing was.
Served = list[tuple[int, int, int, int, int]] | str


def compare(log_: Changelog, store: Store, cap: int, *, sample: int | None = None,
            seed: int = 0, max_samples: int = 5, progress: bool = False,
            entries: int | None = None, opener: Callable[[], Store] | None = None,
            workers: int | None = None, users: list[int] | None = None,
            lateness: int | None = DEFAULT_LATENESS_MS,
            pool: Executor | None = None) -> VerifyResult:
    """Compare without reading Kafka (the log already read); ``progress`` draws a bar.

    ``lateness`` is the job's lateness bound in ms (``ViewSettings.lateness_ms``; None:
    off): records past it are left out of the query, as the job leaves them out. The
    log's events are in offset order per partition, which the rule needs.

    ``users`` checks those users only (a second look at the divergent ones of an
    earlier pass, say) instead of every user or a ``sample``.

    ``entries`` checks only the first ``entries`` of each timeline (its first pages;
    default: all ``cap``). ``opener`` builds another, unopened store over the same data
    in a reader process, so it must pickle (``functools.partial(store_from_url, url,
    cap=cap)``); ``workers`` is how many such processes (default: one per core). See
    :func:`_reads` for when they are used. ``pool``: those processes, started already
    (:func:`_reader_pool`); the caller shuts it down.
    """
    n = _depth(cap, entries)
    log.info("recomputing the view from %d events", len(log_.events))
    ref = Reference(lateness).add(log_.events)
    if users is not None:
        users = sorted(set(users) - ref.deleted_accounts)
    else:
        users = sorted((set(ref.users()) | set(store.home_users())) - ref.deleted_accounts)
    if sample is not None and sample < len(users):
        users = sorted(random.Random(seed).sample(users, sample))
    result = VerifyResult(events=len(log_.events), invalid=sum(log_.invalid.values()),
                          late=len(ref.late))
    with (_reads(store, users, n, opener, workers, pool) as served_rows,
          progress_bar(total=len(users), desc="verify", unit="user", log_interval=HEARTBEAT_S,
                       disable=not progress) as bar):
        for user, got in zip(users, served_rows, strict=True):
            _check(result, user, ref.home_fast(user, n), got, max_samples)
            bar.update()
    explain(store, result)
    return result


def _depth(cap: int, entries: int | None) -> int:
    """How many entries of each timeline are compared."""
    if entries is None:
        return cap
    if entries < 1:
        msg = f"entries must be at least 1, got {entries}"
        raise ValueError(msg)
    return min(entries, cap)


def _check(result: VerifyResult, user: int, want: list[HomeRow], got: Served,
           max_samples: int) -> None:
    result.users_checked += 1
    if got != want:
        result.divergent += 1
        result.divergent_users.append(user)
        if len(result.samples) < max_samples:
            result.samples.append(_describe(user, want, got))
            if not isinstance(got, str):
                served_ids = {r[0] for r in got}
                result.missing[user] = (len(result.samples) - 1,
                                        [r for r in want if r.entry_id not in served_ids][:3])


def explain(store: TimelineReader, result: VerifyResult) -> None:
    """Say, under each described user, what the store holds of the entries it misses.

    An entry can be missing because the user's cached timeline has no row of it, or
    because its row is there but is not served: the ``tweets`` row names another
    author or says deleted. The store's rows tell which, and so which writes went
    astray. Reads at most three entries of at most ``max_samples`` users.
    """
    for user, (i, rows) in result.missing.items():
        if not rows:
            continue
        notes = []
        stored = store.tweets([r.entry_id for r in rows])
        horizon = store.horizon(user)
        at = "no horizon" if horizon is None else f"horizon {horizon}"
        for row in rows:
            tweet = stored.get(row.entry_id)
            what = ("no tweets row" if tweet is None else
                    f"tweets row: author {tweet.author_id} at {tweet.created_at}"
                    + (", deleted" if tweet.deleted else ""))
            above = (row.created_at, row.entry_id + 1)
            found = store.cached(user, above, 1)
            cached = (f"cache row listing author {found[0].author_id}"
                      if found and (found[0].created_at, found[0].tweet_id)
                      == (row.created_at, row.entry_id) else "no cache row")
            notes.append(f"{row.entry_id} ({what}; {cached}; {at})")
        result.samples[i] += "\n    store: " + "; ".join(notes)


@contextlib.contextmanager
def _reader_pool(opener: Callable[[], Store] | None,
                 workers: int | None) -> Iterator[ProcessPoolExecutor | None]:
    """The reader processes (with an ``opener``), started at once and shut down after.

    A process's start (its imports, the store's connection and prepared statements)
    takes a second or two, which overlaps reading the log and recomputing the view.
    """
    if opener is None:
        yield None
        return
    count = workers or os.cpu_count() or 1
    pool = ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_open_reader, initargs=(opener,))
    try:
        for _ in range(count):
            pool.submit(int)  # each submit to a busy pool starts another process
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)


@contextlib.contextmanager
def _reads(store: TimelineReader, users: list[int], n: int, opener: Callable[[], Store] | None,
           workers: int | None, started: Executor | None = None) -> Iterator[Iterator[Served]]:
    """Each user's served rows, in ``users``' order, read while the caller recomputes.

    Reading a timeline is CPU work in Python (assembling it entry by entry) under this
    process's one GIL, beside the recomputation; so with an ``opener`` the reads run in
    ``workers`` processes (default: one per core). A store that answers reads in process
    (``reads_in_process``: SQLite) is read serially in each (on SQLite, 8 threads checked
    fewer users a second than the same reads done serially, at a quarter more CPU a
    user), through a :class:`RowCache`. A store whose reads wait on the network is read
    by :data:`READERS` threads in each, whose waits overlap, through the store's page
    reader (rows shared by many timelines read once, as the API's page renders do:
    :meth:`PageVersions.reader`).
    Without an opener: those threads in this process, or inline. ``started``: the
    processes, started already (:func:`_reader_pool`), left to their owner to stop.
    """
    if opener is not None:
        with contextlib.ExitStack() as own:
            readers = started or own.enter_context(_reader_pool(opener, workers))
            assert readers is not None  # an opener: processes
            if store.reads_in_process:
                yield readers.map(_served_here, users, itertools.repeat(n), chunksize=CHUNK)
            else:
                chunks = [users[i:i + CHUNK] for i in range(0, len(users), CHUNK)]
                yield itertools.chain.from_iterable(
                    readers.map(_served_chunk, chunks, itertools.repeat(n)))
        return
    versions = page_versions(store)
    pool: Executor | None = None
    try:
        if store.reads_in_process:
            rows = RowCache(store, versions)
            yield (served(rows.current(), user, n) for user in users)
        else:
            pool = ThreadPoolExecutor(READERS)
            yield pool.map(functools.partial(_served_current, versions, versions.reader(store),
                                             n=n), users)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        versions.close()


def _served_current(versions: PageVersions, reader: TimelineReader, user: int, n: int) -> Served:
    """:func:`served` through ``versions``' reader, its tokens brought current first."""
    if reader is not versions.store:
        versions.position()
    return served(reader, user, n)


def served(store: TimelineReader, user: int, n: int) -> Served:
    """``user``'s first ``n`` entries as the API serves them, page by page."""
    try:
        entries = home_top(store, user, n)
    except NotFound as exc:
        return f"not served: {exc}"
    return list(map(_ROW_FIELDS, entries))


_Row = TypeVar("_Row", TweetRow, UserRow)


class RowCache(ReaderProxy):
    """A store read in process, with the rows many timelines share kept across users.

    Verify reads every user's timeline, and the same tweets, authors, reposts and
    celebrities' lists appear in many of them. Kept at one position of the store's page
    versions (:class:`~serving.pageversions.PageVersions`): the rows read by id (tweets,
    profiles; on the demo's history reading each once cut the CPU of the reads by about
    30 %), each original's shown reposts (read once for every reader, then filtered
    here by the reader's bound and followees, as the store's query filters them), and
    each author's newest entries, read from the top down as deep as asked. One user's
    own rows (horizon, celebrities followed, blocks and mutes, followees, and the cached
    entries, read from the top down as deep as asked) are kept while that user's pages
    are read, since a timeline of ``N`` entries is several pages, each starting with the
    same reads. :meth:`current`, called before each user, drops everything kept when
    the store has committed a page-visible change since, so a user's page is assembled
    from rows the store holds, as the API's is.
    """

    def __init__(self, inner: TimelineReader, versions: PageVersions) -> None:
        super().__init__(inner)
        self.versions = versions
        self._position: object = object()  # no position yet: the first call reads one
        self._tweets: dict[int, TweetRow | None] = {}
        self._users: dict[int, UserRow | None] = {}
        self._reposts: dict[int, list[Entry]] = {}
        self._authors: dict[int, _Newest] = {}
        self._own: _Own | None = None

    def current(self) -> RowCache:
        """Self, with its rows dropped if the store moved since they were read."""
        position = self.versions.position()
        if position != self._position:
            self._tweets.clear()
            self._users.clear()
            self._reposts.clear()
            self._authors.clear()
            self._own = None
            self._position = position
        return self

    def tweets(self, ids: Sequence[int]) -> dict[int, TweetRow]:
        return _kept(self._tweets, ids, self.inner.tweets)

    def users(self, ids: Sequence[int]) -> dict[int, UserRow]:
        return _kept(self._users, ids, self.inner.users)

    def reposts_of(self, originals: Sequence[int], above: Mapping[int, Key] | None = None,
                   reader: int | None = None) -> dict[int, list[Entry]]:
        """The store's answer, from each original's shown reposts read once.

        The contract's filters applied here: reposts above the original's bound in
        ``above`` (all of them without one), and by the reader's followees.
        """
        asked = list(dict.fromkeys(originals))
        missing = [o for o in asked if o not in self._reposts]
        if missing:
            found = self.inner.reposts_of(missing)
            for o in missing:
                self._reposts[o] = found.get(o, [])
        by = None if reader is None else self._user(reader).followee_set
        out: dict[int, list[Entry]] = {}
        for o in asked:
            if not (reposts := self._reposts[o]):
                continue
            c, t = above.get(o, _NO_BOUND) if above else _NO_BOUND
            # (created_at, tweet_id, author) < (c, t, _PAST) is (created_at, tweet_id) ≤ (c, t).
            bound = (c, t, _PAST)
            shown = []
            for r in reposts:  # newest first: stop at the bound
                if r < bound:
                    break
                if by is None or r[2] in by:
                    shown.append(r)
            if shown:
                out[o] = shown
        return out

    def author_tweets(self, authors: Sequence[int], below: Key | None,
                      limit: int) -> list[Entry]:
        below = below if below is not None else TOP
        lists = [self._author(a).below(below, limit) for a in authors]
        if len(lists) == 1:
            return lists[0]
        return list(itertools.islice(heapq.merge(*lists, reverse=True), limit))

    def _author(self, author: int) -> _Newest:
        newest = self._authors.get(author)
        if newest is None:
            newest = self._authors[author] = _Newest(
                functools.partial(_one_author, self.inner, author))
        return newest

    def _user(self, user: int) -> _Own:
        if self._own is None or self._own.user != user:
            self._own = _Own(self.inner, user)
        return self._own

    def home_start(self, user: int, below: Key | None, limit: int) -> HomeStart:
        # The contract's own composition, so that it reads through the kept rows.
        return TimelineReader.home_start(self, user, below, limit)

    def cached(self, user: int, below: Key | None, limit: int) -> list[Entry]:
        return self._user(user).cached.below(below if below is not None else TOP, limit)

    def horizon(self, user: int) -> Key | None:
        return self._user(user).horizon

    def celebrities_followed(self, user: int) -> list[int]:
        return list(self._user(user).celebrities)

    def relations(self, user: int) -> Relations:
        return self._user(user).relations

    def followees(self, user: int) -> list[int]:
        return list(self._user(user).followees)

    def hydrate(self, tweets: Sequence[int], users: Sequence[int], reposts: Mapping[int, Key],
                reader: int | None = None, followees: bool = False) -> Hydrated:
        # The contract's own composition, so that it reads through the kept rows above.
        return TimelineReader.hydrate(self, tweets, users, reposts, reader, followees)


#: Below every key: all of an original's reposts (the contract's bound when none is given).
_NO_BOUND: Key = (-1, -1)
#: Above every author id.
_PAST = 2**63


def _one_author(store: TimelineReader, author: int, below: Key, limit: int) -> list[Entry]:
    return store.author_tweets([author], below, limit)


class _Newest:
    """A list of entries newest first (a cache, an author's), read from the top down.

    ``read(below, limit)`` is the store's read of the list; what it returned is kept,
    so a read below a position kept answers from memory and reads only what is deeper.
    The same rows as the store's read: the newest ``limit`` strictly below ``below``.
    """

    #: Fewest rows read at a time (a page's first batch is more).
    STEP = 64

    def __init__(self, read: Callable[[Key, int], list[Entry]]) -> None:
        self.read = read
        self.entries: list[Entry] = []
        self._keys: list[tuple[int, int]] = []  # the entries' keys negated: ascending
        self._complete = False

    def below(self, below: Key, limit: int) -> list[Entry]:
        i = bisect.bisect_right(self._keys, (-below[0], -below[1]))
        while not self._complete and len(self.entries) - i < limit:
            want = max(limit - (len(self.entries) - i), len(self.entries), self.STEP)
            more = self.read(self.entries[-1].key if self.entries else TOP, want)
            self.entries += more
            self._keys += [(-e.created_at, -e.tweet_id) for e in more]
            self._complete = len(more) < want
            i = bisect.bisect_right(self._keys, (-below[0], -below[1]))
        return self.entries[i:i + limit]


class _Own:
    """One user's own rows, each read on first use."""

    def __init__(self, store: TimelineReader, user: int) -> None:
        self.store, self.user = store, user
        self.cached = _Newest(functools.partial(store.cached, user))

    @functools.cached_property
    def horizon(self) -> Key | None:
        return self.store.horizon(self.user)

    @functools.cached_property
    def celebrities(self) -> list[int]:
        return self.store.celebrities_followed(self.user)

    @functools.cached_property
    def relations(self) -> Relations:
        return self.store.relations(self.user)

    @functools.cached_property
    def followees(self) -> list[int]:
        return self.store.followees(self.user)

    @functools.cached_property
    def followee_set(self) -> frozenset[int]:
        return frozenset(self.followees)


def _kept(kept: dict[int, _Row | None], ids: Sequence[int],
          read: Callable[[Sequence[int]], dict[int, _Row]]) -> dict[int, _Row]:
    """The rows of ``ids``: those kept, and the rest read once (a missing row kept as None)."""
    missing = [i for i in ids if i not in kept]
    if missing:
        found = read(missing)
        for i in missing:
            kept[i] = found.get(i)
    return {i: row for i in ids if (row := kept[i]) is not None}


#: The store a reader process reads, opened once by :func:`_open_reader`, and its rows.
_reader: list[Store] = []
_rows: list[RowCache] = []


def _open_reader(opener: Callable[[], Store]) -> None:
    store = opener().open()
    atexit.register(store.close)
    _reader.append(store)


def _served_here(user: int, n: int) -> Served:
    """A reader process's read of ``user``, from a store read in process."""
    if not _rows:
        versions = page_versions(_reader[0])
        atexit.register(versions.close)  # before the store's (atexit runs last-in first)
        _rows.append(RowCache(_reader[0], versions))
    return served(_rows[0].current(), user, n)


#: In a reader process of a network store: its page tokens, their reader, its threads.
_network: list[Any] = []


def _served_chunk(users: list[int], n: int) -> list[Served]:
    """A reader process's share of a network store's users, :data:`READERS` at once."""
    if not _network:
        versions = page_versions(_reader[0])
        atexit.register(versions.close)  # before the store's (atexit runs last-in first)
        _network.extend((versions, versions.reader(_reader[0]), ThreadPoolExecutor(READERS)))
    versions, reader, threads = _network
    served_rows = list(threads.map(functools.partial(_served_current, versions, reader, n=n),
                                   users))
    # What this process keeps (rows shared across users) only grows: frozen, the
    # collector's full passes stop walking it again and again, which cost a reader a
    # tenth of its CPU or more. No reference cycles are made here (the driver's are
    # broken: views.stores.cassandra.config.release_finished_requests), so frozen
    # objects are still freed by their reference counts.
    gc.freeze()
    return served_rows


def _describe(user: int, want: list[HomeRow], served_rows: Served) -> str:
    """What differs, by entry id first, then field by field."""
    if isinstance(served_rows, str):
        return f"user {user}: expected {len(want)} entries, {served_rows}"
    got = [HomeRow._make(r) for r in served_rows]
    head = f"user {user}: expected {len(want)} entries, served {len(got)}"
    wanted, served = {r.entry_id: r for r in want}, {r.entry_id: r for r in got}
    missing = [t for t in wanted if t not in served][:5]
    extra = [t for t in served if t not in wanted][:5]
    if missing or extra:
        return f"{head}; missing {missing}, unexpected {extra}"
    for i, (w, g) in enumerate(zip(want, got, strict=False)):
        if w != g:
            return f"{head}; entry {i} should be {tuple(w)}, served {tuple(g)}"
    return f"{head}; the same entries, some repeated"
