"""Home-timeline assembly: cached fan-out, celebrity merge and read-time fallback.

A page of ``user``'s home timeline, strictly older than the cursor position, is the
newest ``limit`` of three sources (DESIGN §4, §7):

1. the cached entries (fanned out on write), trusted only *above* the user's horizon;
2. the recent tweets of the celebrities the user follows, above the horizon too;
3. below the horizon — where the cache was trimmed to the cap, or a backfill
   brought only an author's newest tweets — the query itself, evaluated at read
   time from the follow graph and ``author_tweets``.

So the concatenated pages equal the SQL with no limit, and the first ``N`` entries
equal it exactly. ``fanout verify`` and the HTTP API both read through here.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from serving.celebrities import CelebrityCache
from views.delta import TOP, Key
from views.stores.base import Entry, Store


@dataclass(frozen=True)
class Page:
    """Entries of one page, newest first, and the position to continue from."""

    entries: list[Entry]
    next_key: Key | None


def home_page(store: Store, user: int, below: Key | None, limit: int,
              celebrities: CelebrityCache | None = None) -> Page:
    """One page of ``user``'s home timeline strictly older than ``below``.

    With ``celebrities``, followed celebrities' tweets come from that in-process
    cache (bounded staleness, see :mod:`serving.celebrities`) instead of the store.
    """
    below = below or TOP
    with store.snapshot():
        horizon = store.horizon(user)
        floor = horizon or (-1, -1)
        cached = [e for e in store.cached(user, below, limit) if e.key > floor]
        celebs = store.celebrities_followed(user)
        starred = _starred(store, celebs, below, limit, celebrities)
        entries = _newest(cached, [e for e in starred if e.key > floor], limit)
        if len(entries) < limit and horizon is not None:
            # Keys ≤ horizon: evaluate the query here (tweet ids are ≥ 1).
            deeper = min(below, (horizon[0], horizon[1] + 1))
            entries += store.author_tweets(store.followees(user), deeper, limit - len(entries))
    more = len(entries) == limit
    return Page(entries, entries[-1].key if more and entries else None)


def _starred(store: Store, celebs: list[int], below: Key, limit: int,
             cache: CelebrityCache | None) -> list[Entry]:
    if not celebs:
        return []
    from_cache = cache.page(celebs, below, limit) if cache is not None else None
    return from_cache if from_cache is not None else store.author_tweets(celebs, below, limit)


def read_time_page(store: Store, user: int, below: Key | None, limit: int) -> Page:
    """The same page evaluated at read time from the follow graph: fan-out on read.

    No cache and no celebrity path: the baseline that load tests put beside the
    materialized view (DESIGN §8). Equal to :func:`home_page` on the same data.
    """
    with store.snapshot():
        entries = store.author_tweets(store.followees(user), below or TOP, limit)
    more = len(entries) == limit
    return Page(entries, entries[-1].key if more and entries else None)


def _newest(a: list[Entry], b: list[Entry], limit: int) -> list[Entry]:
    seen: set[int] = set()
    out: list[Entry] = []
    for entry in heapq.merge(a, b, reverse=True):
        if entry.tweet_id not in seen:
            seen.add(entry.tweet_id)
            out.append(entry)
            if len(out) == limit:
                break
    return out


PageFn = Callable[[Store, int, Key | None, int], Page]


def home_top(store: Store, user: int, n: int, page_size: int = 200,
             page_fn: PageFn | None = None) -> list[Entry]:
    """The first ``n`` entries, read page by page as a client would."""
    out: list[Entry] = []
    below: Key | None = None
    while len(out) < n:
        page = (page_fn or home_page)(store, user, below, min(page_size, n - len(out)))
        out += page.entries
        if page.next_key is None:
            break
        below = page.next_key
    return out


def author_page(store: Store, author: int, below: Key | None, limit: int) -> Page:
    """One page of an author's own tweets, newest first."""
    with store.snapshot():
        entries = store.author_tweets([author], below or TOP, limit)
    more = len(entries) == limit
    return Page(entries, entries[-1].key if more and entries else None)
