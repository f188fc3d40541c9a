"""Celebrities' recent tweets, cached in the serving process for the read-time merge.

A user who follows many celebrities must still read fast (DESIGN §4): the home path
asks the store once for the user's celebrity list and takes each celebrity's
tweets from here, so store round trips per request do not grow with the number of
celebrities followed.

**Staleness.** A background refresh reloads every celebrity's newest ``depth``
tweets in one query every ``refresh_s`` seconds; a read sees a celebrity's tweets as
of at most ``refresh_s`` + one refresh ago. A celebrity the cache does not know yet
(just promoted) is loaded on first use, synchronously. Reads that must see a given
write use ``?after=`` (the API then bypasses this cache).

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from views.delta import Key
from views.stores.base import Entry, Store

log = logging.getLogger(__name__)


#: Following more celebrities than this, a page walks the merged list.
WALK_FROM = 32


@dataclass(frozen=True)
class _Recent:
    """One celebrity's newest tweets, oldest first (for bisect), and completeness."""

    entries: list[Entry]
    keys: list[Key]
    complete: bool


class CelebrityCache:
    """See the module docstring. Thread-safe; start() runs the refresher."""

    def __init__(self, store: Store, depth: int = 800, refresh_s: float = 0.5,
                 walk_from: int = WALK_FROM) -> None:
        self.store = store
        self.walk_from = walk_from
        self.depth = depth
        self.refresh_s = refresh_s
        self._lists: dict[int, _Recent] = {}
        self._merged: _Merged = _Merged.of({})
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshed_at = 0.0
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

    def refresh(self) -> None:
        """Reload every current celebrity's newest tweets (one store query)."""
        lists = self._load(self.store.celebrities())
        merged = _Merged.of(lists)
        with self._lock:
            self._lists, self._merged = lists, merged
            self.generation += 1
        self.refreshed_at = time.monotonic()

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
            runs = [reversed(r.entries[:bisect.bisect_left(r.keys, below)]) for r in lists]
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
    """Every held celebrity tweet, oldest first, for the walk."""

    entries: list[Entry]
    keys: list[Key]
    authors: frozenset[int]
    floors: dict[int, Key]

    @classmethod
    def of(cls, lists: dict[int, _Recent]) -> _Merged:
        entries = sorted(e for r in lists.values() for e in r.entries)
        floors = {a: r.keys[0] for a, r in lists.items() if not r.complete and r.keys}
        return cls(entries, [e.key for e in entries], frozenset(lists), floors)

    def walk(self, wanted: set[int], below: Key, limit: int) -> list[Entry]:
        out: list[Entry] = []
        for i in range(bisect.bisect_left(self.keys, below) - 1, -1, -1):
            entry = self.entries[i]
            if entry.author_id in wanted:
                out.append(entry)
                if len(out) == limit:
                    break
        return out


def _take(entries: Iterable[Entry], limit: int) -> Iterable[Entry]:
    for i, entry in enumerate(entries):
        if i >= limit:
            return
        yield entry
