"""Home-timeline assembly: candidates from the cache, celebrities and read time, then §4b.

A page of ``user``'s home timeline, strictly older than the cursor position, is the
newest ``limit`` entries that DESIGN §4b serves. They are drawn from a stream of
*candidates*, newest first, merged from three sources (DESIGN §4, §7):

1. the cached entries (posts and reposts fanned out on write), trusted only *above*
   the user's horizon;
2. the recent posts and reposts of the celebrities the user follows, above the
   horizon too;
3. below the horizon — where the cache was trimmed to the cap, or a backfill
   brought only an author's newest entries — the followees' ``author_tweets``,
   read at read time.

What depends on the reader alone — the horizon, the celebrities followed, blocks and
mutes, and the first batch's cached entries — is read together up front
(:meth:`~views.stores.contract.TimelineReader.home_start`), one round trip on a networked
store.

Each batch of candidates goes through :class:`serving.visibility.Viewer` (blocks,
mutes, deleted accounts and originals, reply visibility, one entry per original).
When filtering leaves the page short, the next batch starts below the last
candidate, as large as the missing entries need at the share of candidates served so
far (twice the last if none was), until the page is full or the stream ends. Whether an
entry is served never depends on the page it falls in, so the concatenated pages
equal the query with no limit, and the cursor — the last served entry's key — is
stable. ``fanout verify`` and the HTTP API both read through here.

What is new above a position (``?since=``, :func:`home_since`) is drawn from the same
stream and the same filter, cut at that position: the entries the concatenated pages
hold above it, the newest first, or, to fill a gap, the oldest first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from serving.celebrities import CelebrityCache
from serving.cursor import Since
from serving.errors import NotFound
from serving.visibility import HomeEntry, Viewer
from views.delta import TOP, Key
from views.stores.contract import TimelineReader
from views.stores.rows import Entry, HomeStart, TweetRow, UserRow

__all__ = ("HomeEntry", "Page", "PageFn", "Since", "author_page", "home_page", "home_since",
           "home_top", "read_time_page", "read_time_since")

#: The largest candidate batch one round reads (a reader who blocked a prolific
#: followee may need several rounds; each grows, up to this).
MAX_BATCH = 1000

#: The most candidates a gap is read for to fill it from the bottom up
#: (:func:`home_since`); a gap that holds more is answered from its top down instead.
MAX_GAP_SCAN = 5 * MAX_BATCH

#: The newest candidates below a key, at most n, and whether more may follow.
Batch = Callable[[Key, int], tuple[list[Entry], bool]]


class AccountGone(NotFound):
    """The account is deleted: its timelines are not served (DESIGN §4b)."""


@dataclass(frozen=True)
class Page:
    """Served entries, newest first, the position to continue from, and their rows.

    ``tweets`` and ``users`` hold every row the page was decided on (read in the same
    snapshot), so rendering it reads nothing more; ``asked`` names every row the
    decision read, found or not (``("t", tweet_id)``, ``("u", user_id)``, and
    ``("a", author_id)`` for an author's list of tweets): what a cached copy of the
    page depends on besides its user's own rows. ``gap``, on a page of what is new
    (:func:`home_since`): the span of new entries the page left out, if any, and
    ``gap_above`` whether that span is above the page's entries (else below).
    """

    entries: list[HomeEntry]
    next_key: Key | None
    tweets: Mapping[int, TweetRow] = field(default_factory=dict)
    users: Mapping[int, UserRow] = field(default_factory=dict)
    asked: frozenset[tuple[str, int]] = frozenset()
    gap: Since | None = None
    gap_above: bool = False


def home_page(store: TimelineReader, user: int, below: Key | None, limit: int,
              celebrities: CelebrityCache | None = None) -> Page:
    """One page of ``user``'s home timeline strictly older than ``below``.

    With ``celebrities``, followed celebrities' entries come from that in-process
    cache (bounded staleness, see :mod:`serving.celebrities`) instead of the store.
    Raises :class:`AccountGone` for a deleted account.
    """
    with store.snapshot():
        first = (below or TOP, _first_batch(limit, store))
        start = store.home_start(user, *first)
        viewer = Viewer(store, user, start.relations)
        source = _Home(store, user, viewer, celebrities, start, first)
        return _page(viewer, source.batch, below, limit, viewer.home)


def read_time_page(store: TimelineReader, user: int, below: Key | None, limit: int) -> Page:
    """The same page evaluated at read time from the follow graph: fan-out on read.

    No cache and no celebrity path: the baseline that load tests put beside the
    materialized view (DESIGN §8). Equal to :func:`home_page` on the same data.
    """
    with store.snapshot():
        viewer = Viewer(store, user)
        return _page(viewer, _read_time(viewer), below, limit, viewer.home)


def _read_time(viewer: Viewer) -> Batch:
    """The candidates of fan-out on read: the followees' own lists of tweets."""

    def batch(below: Key, n: int) -> tuple[list[Entry], bool]:
        entries = viewer.author_tweets(sorted(viewer.followees()), below, n)
        return entries, len(entries) == n

    return batch


def home_since(store: TimelineReader, user: int, since: Since, limit: int,
               celebrities: CelebrityCache | None = None, *,
               from_bottom: bool | None = None) -> Page:
    """What is new in ``user``'s home timeline: the entries inside ``since``'s span.

    Entries strictly above ``since.floor``, and below ``since.ceiling`` if it has one,
    newest first, at most ``limit``, served by the same candidates and the same §4b
    filter as :func:`home_page`, so they are exactly the entries of the concatenated
    pages inside the span. When more than ``limit`` are there, the page's ``gap`` is
    the span it left out. Without a ceiling the page holds the newest ``limit`` (the
    gap is below them, down to the floor); with one (a gap being filled) the oldest
    ``limit``, just above the floor (the gap left is above them, up to the ceiling),
    unless the span holds more than :data:`MAX_GAP_SCAN` candidates: then the newest,
    as without a ceiling. ``from_bottom`` chooses the other way for a span with a
    ceiling or without (counting reads newest first: it is cheaper). ``next_key`` is
    None: a page of what is new is not paged down.
    """
    with store.snapshot():
        first = (since.ceiling or TOP, _first_batch(limit, store))
        start = store.home_start(user, *first)
        viewer = Viewer(store, user, start.relations)
        source = _Home(store, user, viewer, celebrities, start, first, since.floor)
        return _span(viewer, source.batch, since, limit, from_bottom)


def read_time_since(store: TimelineReader, user: int, since: Since, limit: int, *,
                    from_bottom: bool | None = None) -> Page:
    """:func:`home_since` evaluated at read time from the follow graph (fan-out on read)."""
    with store.snapshot():
        viewer = Viewer(store, user)
        return _span(viewer, _read_time(viewer), since, limit, from_bottom)


def _span(viewer: Viewer, batch: Batch, since: Since, limit: int,
          from_bottom: bool | None) -> Page:
    """The page of :func:`home_since`, from ``batch``'s candidates and ``viewer``'s filter."""
    up = since.ceiling is not None if from_bottom is None else from_bottom
    out = _span_up(viewer, batch, since, limit) if up else None
    if out is not None:
        entries = out[-limit:]
        gap = Since(entries[0].key, since.ceiling) if len(out) > limit else None
    else:
        out = _span_down(viewer, batch, since, limit)
        entries = out[:limit]
        gap = Since(since.floor, entries[-1].key) if len(out) > limit else None
    if viewer.reader_deleted():
        raise _gone(viewer.user or 0)
    return Page(entries, None, viewer.tweets, viewer.users, frozenset(viewer.asked), gap,
                gap_above=gap is not None and gap.floor != since.floor)


def _span_down(viewer: Viewer, batch: Batch, since: Since, limit: int) -> list[HomeEntry]:
    """The newest ``limit + 1`` served entries inside the span (fewer: all of them)."""
    position, size, out = since.ceiling or TOP, _first_batch(limit, viewer.store), list[HomeEntry]()
    decided = 0
    while True:
        candidates, more = batch(position, size)
        inside = _above(candidates, since.floor)
        out += viewer.home(inside)
        decided += len(inside)
        if len(out) > limit or not (more and candidates) or len(inside) < len(candidates):
            return out
        position = candidates[-1].key
        size = _next_batch(limit + 1 - len(out), len(out), decided, size)


def _span_up(viewer: Viewer, batch: Batch, since: Since,
             limit: int) -> list[HomeEntry] | None:
    """The oldest ``limit + 1`` served entries inside the span (fewer: all of them).

    Candidates come newest first only, so every candidate inside the span is read (the
    span's size, not the page's: filling a gap of ``g`` entries in slices of ``limit``
    reads about ``g²/2·limit`` candidates in all), and the filter decides on them from
    the floor up, a first batch at a time, until one more than a page is served.
    Whether an entry is served does not depend on which others are decided with it.
    None when the span holds more than :data:`MAX_GAP_SCAN` candidates.
    """
    position, size, inside = (since.ceiling or TOP, _first_batch(limit, viewer.store),
                              list[Entry]())
    while True:
        candidates, more = batch(position, size)
        above = _above(candidates, since.floor)
        inside += above
        if len(inside) > MAX_GAP_SCAN:
            return None
        if not (more and candidates) or len(above) < len(candidates):
            break
        position, size = candidates[-1].key, min(size * 2, MAX_BATCH)
    out: list[HomeEntry] = []
    end, step = len(inside), _first_batch(limit, viewer.store)
    while end > 0 and len(out) <= limit:
        start = max(0, end - step)
        while 0 < start and inside[start - 1].key == inside[start].key:
            start -= 1  # one position's candidates are decided together (id claims)
        out = viewer.home(inside[start:end]) + out
        end = start
    return out


def _above(candidates: list[Entry], floor: Key) -> list[Entry]:
    """The candidates (newest first) strictly above ``floor``: a prefix."""
    if not candidates or candidates[-1].key > floor:
        return candidates
    return [c for c in candidates if c.key > floor]


def author_page(store: TimelineReader, author: int, below: Key | None, limit: int) -> Page:
    """One page of an author's own posts and reposts, newest first.

    A repost is listed while its original is live and its author's account is not
    deleted; a deleted account's page is not served (:class:`AccountGone`).
    """
    with store.snapshot():
        viewer = Viewer(store, None)
        viewer.load_users([author])
        if viewer.deleted(author):
            raise _gone(author)

        def batch(below: Key, n: int) -> tuple[list[Entry], bool]:
            entries = viewer.author_tweets([author], below, n)
            return entries, len(entries) == n

        return _page(viewer, batch, below, limit, viewer.own)


def _page(viewer: Viewer, batch: Batch, below: Key | None, limit: int,
          keep: Callable[[list[Entry]], list[HomeEntry]]) -> Page:
    """Candidates from ``batch`` filtered by ``keep`` until ``limit`` are served."""
    position, size, out = below or TOP, _first_batch(limit, viewer.store), list[HomeEntry]()
    decided = 0
    while True:
        candidates, more = batch(position, size)
        out += keep(candidates)
        decided += len(candidates)
        ended = not (more and candidates)
        if len(out) >= limit or ended:
            break
        position, size = candidates[-1].key, _next_batch(limit - len(out), len(out), decided,
                                                          size)
    if viewer.reader_deleted():
        raise _gone(viewer.user or 0)
    more = len(out) > limit or (len(out) == limit and not ended)
    out = out[:limit]
    return Page(out, out[-1].key if more else None, viewer.tweets, viewer.users,
                frozenset(viewer.asked))


def _first_batch(limit: int, store: TimelineReader) -> int:
    """Candidates read first: a page and a half in process, two pages over a network.

    A page that loses some entries to the filter (replies to strangers, blocks, mutes)
    is then usually full after one batch. Where reads are answered in process, another
    round costs about what deciding on a few more rows does; over a network a round is
    several requests, each costing the driver more CPU than a row. On the demo's social
    history (a third of the candidates are replies to strangers) a page and a half
    left most first pages short: on Cassandra two pages' worth sends 9.0 requests a
    page instead of 12.3, and on SQLite costs 13 % more CPU a page
    (``benchmarks/bench_first_page.py``).
    """
    if store.reads_in_process:
        return limit + (limit >> 1) + 1
    return 2 * limit + 1


def _next_batch(missing: int, served: int, decided: int, last: int) -> int:
    """Candidates read next: enough for the ``missing`` entries at the share served so far.

    With half again for the share's error. None served yet: twice the last batch. A
    page that filtering left a few entries short reads a few dozen more candidates, not
    twice its first batch.
    """
    if not served:
        return min(last * 2, MAX_BATCH)
    return min(MAX_BATCH, missing * decided * 3 // (served * 2) + 1)


def _gone(user: int) -> AccountGone:
    return AccountGone(f"user {user}'s account is deleted", field="user_id")


class _Home:
    """The fan-out side's candidate stream for one reader (see the module docstring).

    ``start`` holds the reader's rows read up front, its cached entries those of the
    stream's first batch, ``first`` (position, size). ``stop``: only candidates above
    it are wanted (a read of what is new), so none is read below the horizon when the
    horizon is not above it.
    """

    def __init__(self, store: TimelineReader, user: int, viewer: Viewer,
                 cache: CelebrityCache | None, start: HomeStart,
                 first: tuple[Key, int], stop: Key | None = None) -> None:
        self.store, self.user, self.viewer, self.cache = store, user, viewer, cache
        self.horizon = start.horizon
        self.stop = stop
        self.floor = self.horizon or (-1, -1)
        self.celebs = start.celebrities
        self._first: tuple[tuple[Key, int], list[Entry]] | None = (first, start.cached)

    def batch(self, below: Key, n: int) -> tuple[list[Entry], bool]:
        """The newest ``n`` candidates strictly older than ``below``; more may follow.

        The cache and the celebrity lists may share entries (merged once), so a short
        merge does not mean they are exhausted: only when neither may hold more above
        the horizon does the read go below it.
        """
        cached = self._cached(below, n)
        starred = self._starred(below, n)
        entries = _newest(self._above_floor(cached), self._above_floor(starred), n)
        above = any(len(got) == n and got[-1].key > self.floor for got in (cached, starred))
        if len(entries) == n or above or self.horizon is None \
                or (self.stop is not None and self.stop >= self.horizon):
            return entries, len(entries) == n or above
        # Keys ≤ horizon: evaluate the query here (tweet ids are ≥ 1).
        deeper = min(below, (self.horizon[0], self.horizon[1] + 1))
        rest = self.viewer.author_tweets(sorted(self.viewer.followees()), deeper,
                                        n - len(entries))
        return entries + rest, len(rest) == n - len(entries)

    def _above_floor(self, entries: list[Entry]) -> list[Entry]:
        """The entries (newest first) above the horizon: a prefix, all of them if none."""
        if self.horizon is None or not entries or entries[-1].key > self.floor:
            return entries
        return [e for e in entries if e.key > self.floor]

    def _cached(self, below: Key, n: int) -> list[Entry]:
        """The cached entries, the first batch's as read up front."""
        first, self._first = self._first, None
        if first is not None and first[0] == (below, n):
            return first[1]
        return self.store.cached(self.user, below, n)

    def _starred(self, below: Key, n: int) -> list[Entry]:
        if not self.celebs:
            return []
        cached = self.cache.page(self.celebs, below, n) if self.cache is not None else None
        return cached if cached is not None else self.viewer.author_tweets(self.celebs, below, n)


def _newest(a: list[Entry], b: list[Entry], limit: int) -> list[Entry]:
    """The newest ``limit`` of two lists, newest first, an entry in both once."""
    if not b or not a:  # one list from the store: its keys are distinct
        return (a or b)[:limit]
    seen: set[Key] = set()
    out: list[Entry] = []
    for entry in heapq.merge(a, b, reverse=True):
        if entry.key not in seen:
            seen.add(entry.key)
            out.append(entry)
            if len(out) == limit:
                break
    return out


PageFn = Callable[[TimelineReader, int, Key | None, int], Page]


def home_top(store: TimelineReader, user: int, n: int, page_size: int = 200,
             page_fn: PageFn | None = None) -> list[HomeEntry]:
    """The first ``n`` entries, read page by page as a client would."""
    out: list[HomeEntry] = []
    below: Key | None = None
    while len(out) < n:
        page = (page_fn or home_page)(store, user, below, min(page_size, n - len(out)))
        out += page.entries
        if page.next_key is None:
            break
        below = page.next_key
    return out
