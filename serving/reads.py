"""Timeline reads: page requests answered from the page cache or rendered, and the fast path.

:class:`Pages` answers one parsed page request (:class:`Read`): from the page cache
(:mod:`serving.pagecache`) while the store's version stands still, else assembled
(:mod:`serving.timeline`), hydrated and serialized (:mod:`serving.render`), with an
ETag and a 304 for a matching ``If-None-Match``. The FastAPI routes of
:mod:`serving.app` call it, and so does :class:`FastReads`.

**The fast path.** FastAPI's per-request work (dependency solving, parameter
validation, response handling) costs several times what a cached page does, so
:class:`FastReads`, an ASGI middleware in front of the app, answers the common,
plainly valid reads itself: ``GET /v1/users/{id}/home|tweets`` with at most ``limit``
and ``cursor``, no body, and (auth on) a valid bearer token of that user. Anything
else — an ``?after=`` read, a bad or doubtful parameter, a wrong token, an error while
reading — goes on to the FastAPI route unchanged, which answers it (or its error)
exactly as the OpenAPI schema says. The fast path only ever answers requests the
route would answer 200 (or 304) with the same body, so the contract has one owner.

SQLite reads take microseconds in this process, so they run on the event loop (a
worker thread would cost more than the read); a network store's reads and every
``?after=`` wait run on worker threads.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Hashable
from typing import Any, Final, NamedTuple

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from serving.activity import ActivityLog
from serving.celebrities import CelebrityCache
from serving.cursor import decode_cursor
from serving.freshness import Freshness
from serving.ids import parse_id
from serving.pagecache import Cached, PageCache, StoreVersion, etag_of, matches
from serving.render import hydrated, page_body
from serving.timeline import PageFn, author_page, home_page, read_time_page
from views.delta import Key
from views.stores.base import Store
from views.stores.sqlite import SQLiteStore

log = logging.getLogger(__name__)

CACHE_CONTROL: Final = "private, no-cache"  # a client may keep a page, but must revalidate
_ROUTE = re.compile(r"/v1/users/([0-9]{1,19})/(home|tweets)")
_LIMIT = re.compile(r"[1-9][0-9]{0,5}")
_JSON: Final = (b"content-type", b"application/json")


class _Route(NamedTuple):
    path: str
    tags: tuple[str, ...]


_ROUTES: Final = {kind: _Route(f"/v1/users/{{user_id}}/{kind}", ("timelines",))
                  for kind in ("home", "tweets")}


def home_fn(fan_out: bool, cache: CelebrityCache | None, after: str | None) -> PageFn:
    """How a home page is assembled: the fan-out cache merged with celebrities, or not."""
    if not fan_out:
        return read_time_page
    if cache is not None and after is None:
        # Read-your-writes (?after=) reads celebrities from the store, not the cache.
        return functools.partial(home_page, celebrities=cache)
    return home_page


class Read:
    """One page request: parse everything first, then wait (if asked), then read."""

    def __init__(self, store: Store, user: int, cursor: str | None, limit: int,
                 after: str | None) -> None:
        self.store, self.user, self.limit, self.after = store, user, limit, after
        self.below: Key | None = decode_cursor(cursor) if cursor is not None else None

    def body(self, page_fn: PageFn, freshness: Freshness | None) -> bytes:
        """The page as JSON (waiting for ``after`` first, if given).

        The page carries the rows it was decided on, so rendering reads nothing: an
        entry filtered out (a celebrity tweet deleted since the celebrity cache last
        looked, say) was replaced by the next candidate, and the page is not short.
        """
        consistent = None
        if self.after is not None and freshness is not None:
            consistent = freshness.wait(self.store, self.after)
        page = page_fn(self.store, self.user, self.below, self.limit)
        entries = hydrated(self.store, page.entries, page.tweets, page.users)
        return page_body(self.user, entries, page.next_key, consistent)


class Pages:
    """Answers page requests from the page cache or by rendering (see the module doc)."""

    def __init__(self, cache: PageCache, freshness: Freshness, fan_out: bool,
                 activity: ActivityLog | None = None) -> None:
        self.cache, self.freshness, self.fan_out = cache, freshness, fan_out
        self.activity = activity

    async def answer(self, state: Any, read: Read, kind: str,
                     if_none_match: str | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Status, headers and body of ``read`` (``kind``: home or tweets)."""
        if kind == "home" and self.activity is not None:
            self.activity.saw(read.user)  # a dict lookup; records go out on their own thread
        celebrities = getattr(state, "celebrities", None) if kind == "home" else None
        page_fn = home_fn(self.fan_out, celebrities, read.after) if kind == "home" \
            else author_page
        if read.after is not None:  # read-your-writes: never from the cache, no ETag
            body = await run_in_threadpool(read.body, page_fn, self.freshness)
            return 200, [_JSON], body
        args = (read, page_fn, (kind, read.user, read.below, read.limit),
                state.version, celebrities)
        if isinstance(read.store, SQLiteStore):
            page = self._page(*args)
        else:
            page = await run_in_threadpool(self._page, *args)
        headers = [(b"etag", page.etag.encode()), (b"cache-control", CACHE_CONTROL.encode())]
        if matches(if_none_match, page.etag):
            return 304, headers, b""
        return 200, [_JSON, *headers], page.body

    def _page(self, read: Read, page_fn: PageFn, key: Hashable,
              version: StoreVersion, celebrities: CelebrityCache | None) -> Cached:
        def now() -> Hashable:
            return version(), celebrities.generation if celebrities is not None else 0

        before = now()
        page = self.cache.get(key, before)
        if page is None:
            body = read.body(page_fn, None)
            page = Cached(body, etag_of(body), before)
            if now() == before:  # nothing committed while rendering: the page is `before`'s
                self.cache.put(key, page)
        return page


class FastReads:
    """ASGI middleware: plainly valid page reads answered without FastAPI (module doc).

    A fast answer names its route template in the scope (``scope["route"].path``,
    what :class:`serving.metrics.RequestMetrics` reads), so metrics stay by route.
    """

    def __init__(self, app: ASGIApp, pages: Pages, state: Any, max_page: int,
                 default_page: int, caller: Callable[[str | None], int | None]) -> None:
        self.app, self.pages, self.state = app, pages, state
        self.max_page, self.default_page, self.caller = max_page, default_page, caller

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        read = self._parse(scope) if scope["type"] == "http" and scope["method"] == "GET" \
            else None
        if read is None:
            await self.app(scope, receive, send)
            return
        try:
            status, headers, body = await self.pages.answer(
                self.state, read[0], read[1], read[2])
        except Exception:  # the route reads again and answers the error in its shape
            log.debug("fast read fell back to the route", exc_info=True)
            await self.app(scope, receive, send)
            return
        scope["route"] = _ROUTES[read[1]]  # as the router's would be, for /metrics
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _parse(self, scope: Scope) -> tuple[Read, str, str | None] | None:
        route = _ROUTE.fullmatch(scope["path"])
        store = getattr(self.state, "store", None)
        if route is None or store is None:
            return None
        headers = dict(scope["headers"])
        if b"content-length" in headers or b"transfer-encoding" in headers:
            return None
        params = _query(scope["query_string"])
        if params is None:
            return None
        limit, cursor = params.get("limit"), params.get("cursor")
        if limit is not None and not (_LIMIT.fullmatch(limit) and int(limit) <= self.max_page):
            return None
        try:
            user = parse_id(route.group(1), "user_id")
            if route.group(2) == "home":
                auth = headers.get(b"authorization")
                caller = self.caller(auth.decode("latin-1") if auth is not None else None)
                if caller is not None and caller != user:
                    return None
            read = Read(store, user, cursor, int(limit) if limit else self.default_page, None)
        except Exception:  # noqa: BLE001 - any doubt: the route decides
            return None
        tag = headers.get(b"if-none-match")
        return read, route.group(2), tag.decode("latin-1") if tag is not None else None


def _query(raw: bytes) -> dict[str, str] | None:
    """``limit`` and ``cursor`` from a plain query string; None for anything else."""
    if not raw:
        return {}
    out: dict[str, str] = {}
    for pair in raw.split(b"&"):
        name, eq, value = pair.partition(b"=")
        if not eq or not value or name not in (b"limit", b"cursor") or b"%" in value \
                or b"+" in value:
            return None
        key = name.decode()
        if key in out:
            return None
        out[key] = value.decode("ascii", "replace")
    return out
