"""Celebrities' recent entries (posts and reposts), cached in the serving process.

A user who follows many celebrities must still read fast (DESIGN §4): the home path
asks the store once for the user's celebrity list and takes each celebrity's
tweets from here, so store round trips per request do not grow with the number of
celebrities followed.

**Staleness.** A background refresh runs every ``refresh_s`` seconds; a read sees a
celebrity's tweets as of at most ``refresh_s`` + one refresh ago. A celebrity the
cache does not know yet (just promoted) is loaded on first use, synchronously. Reads
that must see a given write use ``?after=`` (the API then bypasses this cache). The
cache only proposes candidates; what is served is decided on the store's rows
(:mod:`serving.visibility`), so a block, mute or account delete applies at once. One
staleness shows there: a celebrity's repost newer than the last refresh already
hides the older appearance of its original (the store says so) before the cache
offers the repost itself — for at most one refresh.

**Incremental refresh.** Reloading every celebrity's ``depth`` tweets twice a second
costs about a core on a large graph, so a refresh does only what changed. When the
store's ``version`` (the position of the page tokens, :mod:`serving.pageversions`)
has not moved, it does nothing. Otherwise it reads the celebrity list, loads new celebrities whole, drops
demoted ones, and reads each held celebrity's newest ``window`` tweets: those above
the newest held one are added, held ones inside the window that are gone (deleted)
are dropped, and a celebrity with ``window`` new tweets or more is reloaded whole.
A delete of an older held tweet (or a tweet arriving late, older than the window) is
caught by the full reload every ``full_every_s``. Until then a deleted tweet (or an
undone repost) is never shown — its row says so — and the page takes the next
candidate instead (:mod:`serving.timeline`), so it is not one entry short. A late
entry older than the window stays missing until the full reload: a tweet arriving
late, or a repost that takes over when the user's earlier repost of the same tweet
is undone.

**Generation.** ``generation`` counts the changes of what a page may take from here;
the page cache (:mod:`serving.pagecache`) keeps a home page only while it stands. A
refresh that finds every list as it was (a write that touched no celebrity, the
periodic full reload of unchanged lists) leaves it, so cached pages stay valid.

**Depth.** Only the newest ``depth`` tweets of a celebrity are held. Each list knows
whether it is the celebrity's complete history; a page that would reach below the
oldest held tweet of an incomplete list reads that page from the store instead.

**Two ways to merge.** A user following few celebrities merges their lists (cost
grows with the number followed). For many, each refresh also builds one list of all
celebrities' held tweets, newest first, and a page walks it keeping the followed
authors' entries: about ``limit × celebrities / followed`` steps, so following more
celebrities makes the walk shorter, not longer.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from views.delta import Key
from views.stores.contract import TimelineReader
from views.stores.rows import Entry

log = logging.getLogger(__name__)


#: Following more celebrities than this, a page walks the merged list.
WALK_FROM = 32
#: How often a refresh reloads every celebrity whole (seconds): the longest a late
#: entry can stay missing (the module docstring; ``infra.checks.verifier`` waits it out).
FULL_RELOAD_S = 60.0


@dataclass(frozen=True)
class _Recent:
    """One celebrity's newest tweets, oldest first (for bisect), and completeness."""

    entries: list[Entry]
    keys: list[Key]
    complete: bool


class CelebrityCache:
    """See the module docstring. Thread-safe; start() runs the refresher."""

    def __init__(self, store: TimelineReader, depth: int = 800, refresh_s: float = 0.5,
                 walk_from: int = WALK_FROM, *, version: Callable[[], Hashable] | None = None,
                 window: int = 16, full_every_s: float = FULL_RELOAD_S) -> None:
        self.store = store
        self.walk_from = walk_from
        self.depth = depth
        self.refresh_s = refresh_s
        self.version, self.window, self.full_every_s = version, window, full_every_s
        self._seen: Hashable = None
        self._full_at: float | None = None  # never: the first refresh loads whole
        self.stats = {"full": 0, "incremental": 0, "skipped": 0}
        self._lists: dict[int, _Recent] = {}
        self._merged: _Merged = _Merged.of({})
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshed_at: float | None = None
        #: Bumped whenever what a page may take from here changes (serving.pagecache).
        self.generation = 0

    def start(self) -> CelebrityCache:
        try:
            self.refresh()
        except Exception:  # a degraded store must not keep the API from starting
            log.exception("first celebrity cache refresh failed; retrying in the background")
        self._thread = threading.Thread(target=self._run, name="celebrity-cache", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.refresh()
            except Exception:  # keep serving the last lists; the next refresh retries
                log.exception("celebrity cache refresh failed")

    def refresh(self, *, full: bool = False) -> None:
        """Bring the lists up to date: incrementally, or whole when due or asked."""
        now = time.monotonic()
        version = self.version() if self.version is not None else None
        full = (full or self.version is None or self._full_at is None
                or now - self._full_at >= self.full_every_s)
        if not full and version == self._seen:
            self.stats["skipped"] += 1
            self.refreshed_at = now
            return
        if full:
            lists = self._load(self.store.celebrities())
            self._full_at = now
        else:
            lists = self._catch_up(self.store.celebrities())
        self.stats["full" if full else "incremental"] += 1
        if lists != self._lists:  # else pages built on the old lists stay valid
            merged = self._merged.updated(lists)
            with self._lock:
                self._lists, self._merged = lists, merged
                self.generation += 1
        self._seen = version
        self.refreshed_at = now

    def _catch_up(self, authors: list[int]) -> dict[int, _Recent]:
        held = self._lists
        reload = [a for a in authors if a not in held]
        out: dict[int, _Recent] = {}
        for author in authors:
            if author not in held:
                continue
            top = self.store.author_tweets([author], None, self.window)
            caught = _caught_up(held[author], top, self.window, self.depth)
            if caught is None:
                reload.append(author)
            else:
                out[author] = caught
        out.update(self._load(reload) if reload else {})
        return out

    def _load(self, authors: Sequence[int]) -> dict[int, _Recent]:
        rows = self.store.recent_by_author(authors, self.depth + 1) if authors else {}
        out = {}
        for author in authors:
            newest = rows.get(author, [])
            held = list(reversed(newest[:self.depth]))
            out[author] = _Recent(held, [e.key for e in held], len(newest) <= self.depth)
        return out

    def page(self, celebrities: Iterable[int], below: Key, limit: int) -> list[Entry] | None:
        """The newest ``limit`` entries below ``below``; None if the cache cannot tell."""
        wanted = list(celebrities)
        merged = self._merged
        if len(wanted) > self.walk_from and all(c in merged.authors for c in wanted):
            floor = max((merged.floors[c] for c in wanted if c in merged.floors), default=None)
            out = merged.walk(set(wanted), below, limit)
        else:
            lists = self._lists_for(wanted)
            floor = max((r.keys[0] for r in lists if not r.complete and r.keys), default=None)
            runs = [_downward(r.entries, bisect.bisect_left(r.keys, below)) for r in lists]
            out = list(_take(heapq.merge(*runs, reverse=True), limit))
        if floor is not None and (len(out) < limit or out[-1].key <= floor):
            return None
        return out

    def _lists_for(self, celebrities: list[int]) -> list[_Recent]:
        with self._lock:
            known = self._lists
        missing = [c for c in celebrities if c not in known]
        if missing:
            loaded = self._load(missing)
            with self._lock:
                self._lists = known = {**self._lists, **loaded}
                self.generation += 1
        return [known[c] for c in celebrities]


@dataclass(frozen=True)
class _Merged:
    """Every held celebrity tweet, oldest first, for the walk.

    Entries sort by their key (``created_at``, ``tweet_id``: unique), and an entry
    compares above the bare key it starts with, so ``bisect_left(entries, key)`` is
    the first entry at or above ``key``: no list of keys is kept beside them.
    """

    entries: list[Entry]
    authors: frozenset[int]
    floors: dict[int, Key]
    lists: dict[int, _Recent]  # what it merges

    @classmethod
    def of(cls, lists: dict[int, _Recent]) -> _Merged:
        return cls(sorted(e for r in lists.values() for e in r.entries), frozenset(lists),
                   _floors(lists), lists)

    def updated(self, new: dict[int, _Recent]) -> _Merged:
        """The merged list of ``new``, from this one.

        A refresh usually changes a few lists at their newest end, so only the
        entries that came or went move: each found by bisection in a copy of the
        list. Many changes (a full reload after a busy minute) sort again instead.
        Either way the result equals :meth:`of` on ``new``. Re-sorting every held
        entry on each refresh cost ~13 ms on 48 celebrities and 32k entries, held
        the GIL against the reads and fed the collector.
        """
        old, gone, came = self.lists, list[Entry](), list[Entry]()
        for author in old.keys() | new.keys():
            before, after = old.get(author), new.get(author)
            if before is after or before == after:
                continue
            was = set(before.entries) if before is not None else set()
            now = set(after.entries) if after is not None else set()
            gone += was - now
            came += now - was
        if len(gone) + len(came) > _MOVES:
            return _Merged.of(new)
        entries = list(self.entries)
        for entry in gone:
            del entries[bisect.bisect_left(entries, entry)]
        for entry in came:
            bisect.insort(entries, entry)
        return _Merged(entries, frozenset(new), _floors(new), new)

    def walk(self, wanted: set[int], below: Key, limit: int) -> list[Entry]:
        out: list[Entry] = []
        for i in range(bisect.bisect_left(self.entries, below) - 1, -1, -1):
            entry = self.entries[i]
            if entry.author_id in wanted:
                out.append(entry)
                if len(out) == limit:
                    break
        return out


#: Entries moved one by one when a refresh updates the merged list; more: sort again.
_MOVES = 256


def _floors(lists: dict[int, _Recent]) -> dict[int, Key]:
    """Each incomplete list's oldest held key: below it the store must be read."""
    return {a: r.keys[0] for a, r in lists.items() if not r.complete and r.keys}


def _caught_up(old: _Recent, newest: list[Entry], window: int, depth: int) -> _Recent | None:
    """``old`` with ``newest`` (the author's newest ``window`` live tweets, newest first).

    Inside the window the store's answer replaces what was held (new tweets added,
    deleted ones gone); below it the held entries stay. None when the window may not
    reach down to what was held (``window`` tweets, all newer): reload whole. ``old``
    itself when nothing changed, so an unchanged refresh costs no new lists and
    compares by identity.
    """
    fresh = newest[::-1]
    if len(newest) < window:  # the window holds every live tweet of the author
        cut, complete = 0, True
    else:
        oldest_seen = newest[-1].key
        if not old.keys or oldest_seen > old.keys[-1]:
            return None
        cut, complete = bisect.bisect_left(old.keys, oldest_seen), old.complete
    if complete == old.complete and len(old.entries) - cut == len(fresh) \
            and old.entries[cut:] == fresh and len(old.entries) <= depth:
        return old
    entries = old.entries[:cut] + fresh
    keys = old.keys[:cut] + [(e[0], e[1]) for e in fresh]
    if len(entries) > depth:
        entries, keys, complete = entries[-depth:], keys[-depth:], False
    return _Recent(entries, keys, complete)


def _downward(entries: list[Entry], end: int) -> Iterator[Entry]:
    """``entries[end - 1]``, ``entries[end - 2]``, ... read as the merge asks for them.

    A page takes ``limit`` of them; copying each list up to ``end`` first made a home
    render ~30 % slower.
    """
    return map(entries.__getitem__, range(end - 1, -1, -1))


def _take(entries: Iterable[Entry], limit: int) -> Iterable[Entry]:
    for i, entry in enumerate(entries):
        if i >= limit:
            return
        yield entry
