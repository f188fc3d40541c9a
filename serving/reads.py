"""Timeline reads: page requests answered from the page cache or rendered, and the fast path.

:class:`Pages` answers one parsed page request (:class:`Read`): from the page cache
(:mod:`serving.pagecache`) while the page's token stands still, else assembled
(:mod:`serving.timeline`), hydrated and serialized (:mod:`serving.render`), with an
ETag and a 304 for a matching ``If-None-Match``. The FastAPI routes of
:mod:`serving.app` call it, and so does :class:`FastReads`.

**The fast path.** FastAPI's per-request work (dependency solving, parameter
validation, response handling) costs several times what a cached page does, so
:class:`FastReads`, an ASGI middleware in front of the app, answers the common,
plainly valid reads itself: ``GET /v1/users/{id}/home|tweets`` with at most ``limit``
and ``cursor`` (or, on the home, ``since`` instead of ``cursor``), no body, and (auth on)
a valid bearer token of that user. Anything
else — an ``?after=`` read, a bad or doubtful parameter, a wrong token, an error while
reading — goes on to the FastAPI route unchanged, which answers it (or its error)
exactly as the OpenAPI schema says. The fast path only ever answers requests the
route would answer 200 (or 304) with the same body, so the contract has one owner.
:class:`FastPath` holds that recognition and answer once; :class:`FastReads` gives it
in the ASGI stack. It is not also given inside uvicorn's HTTP protocol, before any ASGI
request exists: that gives 1.38× the middleware's reads per API CPU-second, less than the
1.5× a further door must earn, and needs uvicorn's private classes
(``bench_http.py --doors``, ``benchmarks/RESULTS.md``).

A store whose reads are answered in process (in microseconds, as its
:attr:`~views.stores.contract.TimelineReader.reads_in_process` declares) is read on the
event loop (a worker thread would cost more than the read); a network store's reads
and every ``?after=`` wait run on worker threads.
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
from serving.callers import MONITOR_HEADER
from serving.celebrities import CelebrityCache
from serving.cursor import Since, decode_cursor, decode_since
from serving.errors import BadRequest
from serving.freshness import Freshness
from serving.ids import parse_id
from serving.pagecache import Cached, PageCache, etag_of, matches
from serving.pageversions import PageVersions
from serving.render import count_body, hydrated, page_body
from serving.shapes import NEW_COUNT_CAP
from serving.timeline import (
    Page,
    PageFn,
    author_page,
    home_page,
    home_since,
    read_time_page,
    read_time_since,
)
from views.delta import Key
from views.stores.contract import TimelineReader

log = logging.getLogger(__name__)

CACHE_CONTROL: Final = "private, no-cache"  # a client may keep a page, but must revalidate
_ROUTE = re.compile(r"/v1/users/([0-9]{1,19})/(home|tweets)")
_LIMIT = re.compile(r"[1-9][0-9]{0,5}")
_JSON: Final = (b"content-type", b"application/json")
_CACHE_CONTROL: Final = CACHE_CONTROL.encode()
_MONITOR_HEADER: Final = MONITOR_HEADER.encode()


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


def since_fn(fan_out: bool, cache: CelebrityCache | None, after: str | None, since: Since,
             count: bool = False) -> PageFn:
    """:func:`home_fn` for a read of what is new (``?since=``), as a page function.

    The page is :func:`~serving.timeline.home_since`'s for ``since`` (the page
    function's own ``below`` is None for such a read); ``count``: read newest first,
    whatever the span, since only how many are served matters.
    """
    down = False if count else None

    def page(store: TimelineReader, user: int, below: Key | None, limit: int) -> Page:
        if not fan_out:
            return read_time_since(store, user, since, limit, from_bottom=down)
        celebrities = cache if after is None else None
        return home_since(store, user, since, limit, celebrities, from_bottom=down)

    return page


class Read:
    """One page request: parse everything first, then wait (if asked), then read.

    ``since``: a read of what is new above a position (or inside a gap), which no
    ``cursor`` may come with; ``count``: its answer is how many entries are new
    (at most :data:`NEW_COUNT_CAP`), not the entries.
    """

    def __init__(self, store: TimelineReader, user: int, cursor: str | None, limit: int,
                 after: str | None, view: Any = None, since: str | None = None,
                 count: bool = False) -> None:
        self.store, self.user, self.limit, self.after = store, user, limit, after
        #: The view ``store`` is part of (:class:`serving.switch.Served`), when the
        #: caller resolved one: what the fast path answers from.
        self.view = view
        if since is not None and cursor is not None:
            msg = ("since and cursor cannot be combined: since asks for what is newer "
                   "than a position (or inside a gap_cursor's gap), cursor for what is older")
            raise BadRequest(msg, field="since")
        self.below: Key | None = decode_cursor(cursor) if cursor is not None else None
        self.since: Since | None = decode_since(since) if since is not None else None
        if count and self.since is None:
            msg = "since is required: the count is of the entries newer than it"
            raise BadRequest(msg, field="since")
        self.count = count
        if count:
            self.limit = NEW_COUNT_CAP
        #: A monitor's read (:data:`MONITOR_HEADER`): not the user's activity.
        self.monitor = False

    def body(self, page_fn: PageFn, freshness: Freshness | None) -> bytes:
        """The page as JSON (waiting for ``after`` first, if given)."""
        return self.rendered(page_fn, freshness)[0]

    def rendered(self, page_fn: PageFn, freshness: Freshness | None,
                 reader: TimelineReader | None = None) -> tuple[bytes, Page]:
        """The page as JSON, and the page with the rows it was decided on.

        The page carries those rows, so rendering reads nothing: an entry filtered
        out (a celebrity tweet deleted since the celebrity cache last looked, say) was
        replaced by the next candidate, and the page is not short. ``reader``: what to
        read instead of the store (a page cache's, :meth:`PageVersions.reader`).
        """
        consistent = None
        if self.after is not None and freshness is not None:
            consistent = freshness.wait(self.store, self.after)
        store = reader or self.store
        page = page_fn(store, self.user, self.below, self.limit)
        if self.count:  # how many, not which: nothing is rendered
            return count_body(self.user, len(page.entries), page.gap is not None,
                              consistent), page
        entries = hydrated(store, page.entries, page.tweets, page.users)
        return page_body(self.user, entries, page.next_key, consistent,
                         since=self.since is not None, gap=page.gap,
                         gap_above=page.gap_above), page


class Pages:
    """Answers page requests from the page cache or by rendering (see the module doc)."""

    def __init__(self, cache: PageCache, freshness: Freshness, fan_out: bool,
                 activity: ActivityLog | None = None) -> None:
        self.cache, self.freshness, self.fan_out = cache, freshness, fan_out
        self.activity = activity

    async def answer(self, state: Any, read: Read, kind: str,
                     if_none_match: str | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Status, headers and body of ``read`` (``kind``: home or tweets)."""
        if read.after is not None:  # read-your-writes: never from the cache, no ETag
            if kind == "home" and self.activity is not None and not read.monitor:
                self.activity.saw(read.user)
            page_fn = self._page_fn(state, read, kind)
            body = await run_in_threadpool(read.body, page_fn, self.freshness)
            return 200, [_JSON], body
        if in_process(read.store):
            return self.answer_now(state, read, kind, if_none_match)
        if (cached := self.answer_cached(state, read, kind, if_none_match)) is not None:
            return cached
        return await run_in_threadpool(self.answer_now, state, read, kind, if_none_match)

    def answer_now(self, state: Any, read: Read, kind: str,
                   if_none_match: str | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """:meth:`answer` for a read without ``after``, on this thread (it may block)."""
        self._saw(read, kind)
        celebrities = getattr(state, "celebrities", None) if kind == "home" else None
        page = self._page(read, self._page_fn(state, read, kind), kind, state.versions,
                          celebrities, getattr(state, "serial", 0))
        return _response(page, if_none_match)

    def answer_cached(self, state: Any, read: Read, kind: str, if_none_match: str | None
                      ) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        """:meth:`answer_now` for a page that is cached and known valid without waiting.

        None when that needs the store (the tokens' answer is older than their window,
        :meth:`PageVersions.check_now`) or the page is not cached: the caller answers on
        a worker thread then. A network store's cached pages are served on the event
        loop this way, as an in-process store's are.
        """
        checked = state.versions.check_now(kind, read.user)
        if checked is None:
            return None
        celebrities = getattr(state, "celebrities", None) if kind == "home" else None
        key, token = _key_token(read, kind, checked[1], celebrities, getattr(state, "serial", 0))
        page = self.cache.get(key, token, count_miss=False)  # the worker's look counts
        if page is None:
            return None
        self._saw(read, kind)
        return _response(page, if_none_match)

    def _saw(self, read: Read, kind: str) -> None:
        if kind == "home" and self.activity is not None and not read.monitor:
            self.activity.saw(read.user)  # a dict lookup; records go out on their own thread

    def _page_fn(self, state: Any, read: Read, kind: str) -> PageFn:
        if kind != "home":
            return author_page
        celebrities = getattr(state, "celebrities", None)
        if read.since is not None:
            return since_fn(self.fan_out, celebrities, read.after, read.since, read.count)
        return home_fn(self.fan_out, celebrities, read.after)

    def _page(self, read: Read, page_fn: PageFn, kind: str, versions: PageVersions,
              celebrities: CelebrityCache | None, view: int = 0) -> Cached:
        """The cached page, or a new one rendered now.

        ``view`` is the serial of the view read (:mod:`serving.switch`): part of the
        token, so a page of a view switched away from is never served.
        """
        generation = celebrities.generation if celebrities is not None else 0
        position, token = versions.check(kind, read.user)
        key, token = _key_token(read, kind, token, celebrities, view)
        page = self.cache.get(key, token)
        if page is None:
            body, rendered = read.rendered(page_fn, None, versions.reader(read.store))
            page = Cached(body, etag_of(body), token)
            # Kept only if nothing was committed while rendering: the page is the token's.
            unchanged = generation == (celebrities.generation if celebrities else 0)
            if unchanged and versions.keep(position, kind, read.user, rendered.asked):
                self.cache.put(key, page)
        return page


def _key_token(read: Read, kind: str, token: Hashable, celebrities: CelebrityCache | None,
               view: int) -> tuple[Hashable, Hashable]:
    """A page's cache key, and its token (:func:`page_token`)."""
    key = (kind, read.user, read.below, read.limit, read.since, read.count)
    return key, page_token(token, celebrities, view)


def page_token(token: Hashable, celebrities: CelebrityCache | None, view: int) -> Hashable:
    """A cached page's token: the versions', the celebrity cache's generation, the view's."""
    return token, celebrities.generation if celebrities is not None else 0, view


def _response(page: Cached, if_none_match: str | None
              ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    headers = [(b"etag", page.etag.encode()), (b"cache-control", _CACHE_CONTROL)]
    if matches(if_none_match, page.etag):
        return 304, headers, b""
    return 200, [_JSON, *headers], page.body


def in_process(store: TimelineReader) -> bool:
    """Whether ``store`` is read in this process (microseconds, no network: run inline)."""
    return store.reads_in_process


def sent_headers(status: int, headers: list[tuple[bytes, bytes]], body: bytes
                 ) -> list[tuple[bytes, bytes]]:
    """A page answer's headers as every door sends them: ``headers``, then the length.

    A 304 has none: it may only repeat the 200's, which it does not know here.
    """
    if status == 304:
        return headers
    return [*headers, (b"content-length", str(len(body)).encode())]


class Answer(NamedTuple):
    """A fast answer: status, headers (with Content-Length) and body, and its route."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    route: _Route


class FastPath:
    """Recognizes plainly valid page reads and answers them (see the module doc).

    What :class:`FastReads`, the ASGI middleware, answers with.
    """

    def __init__(self, pages: Pages, state: Any, max_page: int, default_page: int,
                 caller: Callable[[str | None], int | None]) -> None:
        self.pages, self.state = pages, state
        self.max_page, self.default_page, self.caller = max_page, default_page, caller

    async def answer(self, path: str, query: bytes,
                     headers: list[tuple[bytes, bytes]]) -> Answer | None:
        """The answer to a GET of ``path?query``, or None: the app answers it."""
        read = self.parse(path, query, headers)
        if read is None:
            return None
        try:
            return self._answer(read, await self.pages.answer(read[0].view, *read))
        except Exception:  # the route reads again and answers the error in its shape
            log.debug("fast read fell back to the route", exc_info=True)
            return None

    @staticmethod
    def _answer(read: tuple[Read, str, str | None],
                answered: tuple[int, list[tuple[bytes, bytes]], bytes]) -> Answer:
        status, headers, body = answered
        return Answer(status, sent_headers(status, headers, body), body, _ROUTES[read[1]])

    def parse(self, path: str, query: bytes,
              headers: list[tuple[bytes, bytes]]) -> tuple[Read, str, str | None] | None:
        """The read, its kind and its If-None-Match; None for anything not plainly valid."""
        route = _ROUTE.fullmatch(path)
        view = getattr(self.state, "served", None)  # resolved once (serving.switch)
        if route is None or view is None:
            return None
        named = dict(headers)
        if b"content-length" in named or b"transfer-encoding" in named:
            return None
        params = _query(query)
        if params is None:
            return None
        limit, cursor, since = params.get("limit"), params.get("cursor"), params.get("since")
        if limit is not None and not (_LIMIT.fullmatch(limit) and int(limit) <= self.max_page):
            return None
        if since is not None and route.group(2) != "home":
            return None
        try:
            user = parse_id(route.group(1), "user_id")
            if route.group(2) == "home":
                auth = named.get(b"authorization")
                caller = self.caller(auth.decode("latin-1") if auth is not None else None)
                if caller is not None and caller != user:
                    return None
            read = Read(view.store, user, cursor, int(limit) if limit else self.default_page,
                        None, view, since)
            read.monitor = _MONITOR_HEADER in named
        except Exception:  # noqa: BLE001 - any doubt: the route decides
            return None
        tag = named.get(b"if-none-match")
        return read, route.group(2), tag.decode("latin-1") if tag is not None else None


class FastReads:
    """ASGI middleware: plainly valid page reads answered without FastAPI (module doc).

    A fast answer names its route template in the scope (``scope["route"].path``,
    what :class:`serving.metrics.RequestMetrics` reads), so metrics stay by route.
    """

    def __init__(self, app: ASGIApp, fast: FastPath) -> None:
        self.app, self.fast = app, fast

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = None
        if scope["type"] == "http" and scope["method"] == "GET":
            answer = await self.fast.answer(scope["path"], scope["query_string"],
                                            scope["headers"])
        if answer is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = answer.route  # as the router's would be, for /metrics
        await send({"type": "http.response.start", "status": answer.status,
                    "headers": answer.headers})
        await send({"type": "http.response.body", "body": answer.body})


def _query(raw: bytes) -> dict[str, str] | None:
    """``limit``, ``cursor`` and ``since`` from a plain query string; None for anything else."""
    if not raw:
        return {}
    out: dict[str, str] = {}
    for pair in raw.split(b"&"):
        name, eq, value = pair.partition(b"=")
        if not eq or not value or name not in (b"limit", b"cursor", b"since") or b"%" in value \
                or b"+" in value:
            return None
        key = name.decode()
        if key in out:
            return None
        out[key] = value.decode("ascii", "replace")
    return out
