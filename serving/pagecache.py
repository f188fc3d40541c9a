"""Rendered timeline pages, kept per API process and validated on every read.

A page is a pure function of the store's committed state (and, for home pages, of
this process's celebrity cache). So a rendered page is kept with the *token* it was
rendered at and served again, bytes and ETag, while the token is unchanged: every
read still asks the store whether anything was committed since — one cheap question
instead of the page's queries, hydration and serialization — so a delete, a new
tweet or a profile change is seen by the very next read, exactly as without the cache.

**Tokens** come from :mod:`serving.pageversions`, built on what the store gives
(:meth:`~views.stores.contract.TimelineReader.version`): one for the whole store, or
one per page (moved by the batches that touch the page's user or the rows it was
decided on), as far as the backend can tell what a batch touched. A page is kept only
if nothing was committed while it was rendered, so a page never carries a token older
than its contents.

**ETags** are a hash of the body, so every API process gives the same page the
same tag and a client revalidating against another process still gets its 304.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import NamedTuple


class Cached(NamedTuple):
    """A rendered page: its body, its ETag and the token it was rendered at."""

    body: bytes
    etag: str
    version: Hashable


def etag_of(body: bytes) -> str:
    """A strong ETag: the body's hash (the same in every process)."""
    return '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


def matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an If-None-Match header names ``etag`` (weak or strong, or ``*``)."""
    if not if_none_match:
        return False
    for tag in if_none_match.split(","):
        tag = tag.strip()
        if tag == "*" or tag.removeprefix("W/") == etag:
            return True
    return False


class PageCache:
    """An LRU of rendered pages bounded in bytes; thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = self.misses = 0
        self._pages: OrderedDict[Hashable, Cached] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, version: Hashable, count_miss: bool = True) -> Cached | None:
        """The page under ``key`` if it was rendered at token ``version``.

        ``count_miss=False``: a look that another will follow if it misses (the event
        loop's, before a worker thread's), so only that one counts.
        """
        with self._lock:
            page = self._pages.get(key)
            if page is None or page.version != version:
                self.misses += count_miss
                return None
            self._pages.move_to_end(key)
            self.hits += 1
            return page

    def put(self, key: Hashable, page: Cached) -> None:
        cost = len(page.body) + 200  # the key, the tuple and the dict slot, roughly
        if cost > self.max_bytes:
            return
        with self._lock:
            old = self._pages.pop(key, None)
            if old is not None:
                self.size -= len(old.body) + 200
            self._pages[key] = page
            self.size += cost
            while self.size > self.max_bytes:
                _, evicted = self._pages.popitem(last=False)
                self.size -= len(evicted.body) + 200
