"""Rendered timeline pages, kept per API process and validated on every read.

A page is a pure function of the store's committed state (and, for home pages, of
this process's celebrity cache). So a rendered page is kept with the *version* it
was rendered at and served again, bytes and ETag, while the version is unchanged:
every read still asks the store whether anything was committed since — one cheap
question instead of five queries, hydration and serialization — so a delete, a new
tweet or a profile change is seen by the very next read, exactly as without the cache.

**Versions.** SQLite: the store's page version (``page_version``), which the sink
bumps in a batch's own transaction when anything a page shows changed — not for a
batch of only offsets and the activity log's read times, which the reads themselves
cause — read only when ``PRAGMA data_version`` (on a connection of our own, cheap)
says another connection committed. Other stores: the applied changelog offsets,
which every micro-batch advances. A page is stored only if the
version read before rendering equals the one read after, so a page never carries a
version older than its contents.

**ETags** are a hash of the body, so every API process gives the same page the
same tag and a client revalidating against another process still gets its 304.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import NamedTuple

from views.stores.base import Store
from views.stores.sqlite import PAGE_VERSION_SQL, SQLiteStore


class Cached(NamedTuple):
    """A rendered page: its body, its ETag and the version it was rendered at."""

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


class StoreVersion:
    """A token that changes whenever a write to the store commits (see module doc)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._db: sqlite3.Connection | None = None
        # Another connection to :memory: is another database: those use the offsets.
        if isinstance(store, SQLiteStore) and not str(store.path).startswith(
                (":memory:", "file::memory:")):
            self._db = sqlite3.connect(store.path, check_same_thread=False,
                                       isolation_level=None)
        self._lock = threading.Lock()
        self._seen: int | None = None
        self._version: Hashable = None

    def __call__(self) -> Hashable:
        if self._db is None:
            return tuple(sorted(self.store.applied_offsets().items()))
        with self._lock:
            seen = self._db.execute("PRAGMA data_version").fetchone()[0]
            if seen != self._seen:
                # A commit since the last look (or a first look): read the page version.
                # One landing between the two reads is seen again by the next call.
                self._seen = seen
                self._version = self._db.execute(PAGE_VERSION_SQL).fetchone()[0]
            return self._version

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


class PageCache:
    """An LRU of rendered pages bounded in bytes; thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = self.misses = 0
        self._pages: OrderedDict[Hashable, Cached] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, version: Hashable) -> Cached | None:
        """The page under ``key`` if it was rendered at ``version``."""
        with self._lock:
            page = self._pages.get(key)
            if page is None or page.version != version:
                self.misses += 1
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
