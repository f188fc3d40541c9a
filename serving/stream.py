"""The live home stream: ``GET /v1/users/{id}/home/stream`` as Server-Sent Events (DESIGN §7).

A stream follows the user's first home page at ``limit`` N (its *window*), read through
the same :class:`serving.reads.Pages` and page cache a ``GET /home`` is answered by, so
no event is ever ahead of what ``/home`` serves. When the page may have changed it is
read again and diffed against the window the stream's clients hold
(:mod:`serving.streamids`: ``remove`` events, then ``add`` events carrying the rendered
entry, each with the window after it as its SSE id). The write routes publish nothing:
the changes are the view's, as ``/home`` shows them.

**One watcher per process.** :class:`StreamHub` runs one task, only while streams are
open. Every ``FANOUT_STREAM_POLL_S`` it asks the page tokens
(:mod:`serving.pageversions`) for the store's committed position, with the celebrity
cache's generation and the view's serial — the same three things a cached page's
token is made of (:mod:`serving.reads`); while they stand, nothing is read. When they
move, each streamed page whose token moved is read again: the store's change feed
(SQLite and Cassandra) names the pages a batch touched (a celebrity's post reaches the
pages that read that celebrity's list), so only those. Streams of the same user and ``limit``
form a *group* and share one read and one encoding of each event. A read during which
the position moved is not trusted to have registered what it read (the page cache
keeps only pages rendered at one position), so its group is read again on the next
tick.

**Resuming.** An id holds its window, so ``Last-Event-ID`` is diffed against the page
now, in whatever process the reconnect lands. An id of another view (the pointer's
number: a rebuild switched to) or older than ``FANOUT_STREAM_RETENTION_S`` gets a
``reset`` event instead: the client drops what it holds, and the page follows as adds.
A key diff cannot see an entry whose rendering changed while its key stayed (a
profile's new handle); the reset bounds how old such a rendering gets. A first
connect is a resume from the empty window: the page arrives as adds.

**Shards.** A process reading some feed shards only (``FANOUT_FEED_SHARDS``) keeps no
token for the pages of other users, so it cannot tell when their page changed short
of reading it every tick; their streams are refused instead, with a ``421`` that
names the user's shard (:class:`WrongShard`), for a balancer to route them by it
(docs/design.md §7, *Scaling out*). Their ``GET /home`` is served, uncached.

**Slow clients.** Each stream has a queue of at most ``FANOUT_STREAM_QUEUE`` events;
a change that does not fit ends the stream with an ``end`` event (``too_slow``) and
the connection is closed, and each send waits at most ``FANOUT_STREAM_SEND_TIMEOUT_S``,
so a client that stops reading holds nothing but its queue and never delays another
stream or a read. Heartbeats are SSE comments every ``FANOUT_STREAM_HEARTBEAT_S``
(sse-starlette's ping).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import orjson
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from serving.cursor import encode_cursor
from serving.errors import ServingError
from serving.metrics import StreamMetrics
from serving.pageversions import HOME
from serving.reads import Pages, Read, in_process, page_token
from serving.settings import ServingSettings
from serving.streamids import Window, decode, encode, steps
from serving.switch import Served
from serving.timeline import AccountGone
from views.delta import Key

log = logging.getLogger(__name__)

#: How long a stream has, once the server is stopping, to send its ``end`` event.
_SHUTDOWN_GRACE_S: Final = 1.0
#: The response header of a :class:`WrongShard` naming the user's feed shard.
SHARD_HEADER: Final = "X-Fanout-Feed-Shard"


class WrongShard(ServingError):
    """A stream of a user outside this process's feed shards (421 Misdirected Request)."""

    status = 421
    code = "wrong_shard"


@dataclass(eq=False)
class _Stream:
    """One client's connection: its queue of encoded events, and why it ended."""

    queue: deque[tuple[str, bytes]] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    ended: tuple[str, str] | None = None

    def push(self, events: list[tuple[str, bytes]], cap: int) -> bool:
        """Queue ``events`` whole; False (nothing queued) if they do not fit."""
        if len(self.queue) + len(events) > cap:
            return False
        self.queue.extend(events)
        self.wake.set()
        return True

    def end(self, code: str, message: str) -> None:
        if self.ended is None:
            self.ended = (code, message)
            self.wake.set()


@dataclass
class _Group:
    """The streams of one user's window at one ``limit``: one read, one encoding."""

    user: int
    limit: int
    keys: list[Key] | None = None
    view: int = 0
    token: Hashable | None = None
    etag: str | None = None
    reads: int = 0
    streams: set[_Stream] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class StreamHub:
    """The streams of one API process and the one task that watches their pages."""

    def __init__(self, settings: ServingSettings, pages: Pages, state: Any,
                 metrics: StreamMetrics | None = None, clock: Callable[[], float] = time.time
                 ) -> None:
        self.pages, self.state, self.metrics, self.clock = pages, state, metrics, clock
        self.poll_s, self.cap = settings.stream_poll_s, settings.stream_queue
        self.retention_s = settings.stream_retention_s
        self.heartbeat_s, self.send_timeout_s = (settings.stream_heartbeat_s,
                                                 settings.stream_send_timeout_s)
        self.groups: dict[tuple[int, int], _Group] = {}
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        #: Pages read for streams (a group's read serves all its streams; each group
        #: counts its own too).
        self.reads = 0

    # -- a client connects ------------------------------------------------------------------
    async def open(self, view: Served, user: int, limit: int, last_id: str | None,
                   until: float | None = None) -> EventSourceResponse:
        """The stream's response; 400 for a bad ``last_id``, 404 for a deleted account.

        ``until``: when the caller's token expires (epoch seconds); the stream ends then
        with ``token_expired``.

        421 (:class:`WrongShard`) for a user whose pages this process does not keep.
        """
        if not view.versions.holds(user):
            shard, ours = view.versions.shard_of(user)
            msg = (f"user {user}'s pages are in feed shard {shard}; this API process reads "
                   f"shards {ours} (FANOUT_FEED_SHARDS): open the stream on a process that "
                   f"reads shard {shard}")
            raise WrongShard(msg, field="user_id", headers={SHARD_HEADER: str(shard)})
        resume = decode(last_id, user) if last_id is not None else None
        # Registered before any wait, so streams opening together share one group.
        group = self.groups.setdefault((user, limit), _Group(user, limit))
        stream = _Stream()
        async with group.lock:
            try:
                # The group's other streams are sent the change first; AccountGone: a 404.
                entries = await self._changed(group, view)
            except BaseException:
                self._drop_if_empty(group)
                raise
            assert entries is not None
            first = self._first(group, resume, entries)
            stream.push(first, self.cap + len(first))
            group.streams.add(stream)
            self.groups[(user, limit)] = group  # again, if its last stream left meanwhile
        if self.metrics is not None:
            self.metrics.open.inc()
        self._watch()
        shutdown = anyio.Event()

        async def on_shutdown() -> None:  # the server stops: say so before the cancel
            await shutdown.wait()
            stream.end("shutdown", "the server is stopping: reconnect with Last-Event-ID")

        return _Response(self._events(stream, until), ping=self.heartbeat_s,
                         send_timeout=self.send_timeout_s, on_timeout=self._timed_out,
                         on_close=lambda: self._leave(group, stream),
                         shutdown_event=shutdown, shutdown_grace_period=_SHUTDOWN_GRACE_S,
                         data_sender_callable=on_shutdown)

    def _first(self, group: _Group, resume: Window | None,
               entries: dict[Key, dict[str, Any]]) -> list[tuple[str, bytes]]:
        """A joining stream's events: from its ``Last-Event-ID`` (or nothing) to the page."""
        assert group.keys is not None
        now = int(self.clock())
        reset = None
        if resume is not None and resume.view != group.view:
            reset = ("view", "the view was rebuilt or switched since this id: drop what you "
                             "hold, the page follows")
        elif resume is not None and abs(now - resume.at) > self.retention_s:
            reset = ("retention", f"the id is older than the retention of "
                                  f"{self.retention_s} s: drop what you hold, the page follows")
        held = list(resume.keys) if resume is not None and reset is None else []
        return self._encoded(group, held, group.keys, entries, reset)

    async def _events(self, stream: _Stream, until: float | None) -> AsyncIterator[bytes]:
        while True:
            if until is not None and time.time() >= until:
                stream.end("token_expired", "the bearer token expired: reconnect with a new "
                                            "one and Last-Event-ID")
            if stream.ended is not None:
                stream.queue.clear()
                code, message = stream.ended
                yield self._sent("end", _sse("end", {"reason": code, "message": message}))
                return
            if stream.queue:
                yield self._sent(*stream.queue.popleft())
                continue
            stream.wake.clear()
            if until is None:
                await stream.wake.wait()
            else:
                with anyio.move_on_after(max(0.0, until - time.time())):
                    await stream.wake.wait()

    def _leave(self, group: _Group, stream: _Stream) -> None:
        """The response ended (the client left, was cut off, or the server stops)."""
        group.streams.discard(stream)
        self._drop_if_empty(group)
        if self.metrics is not None:
            self.metrics.open.dec()

    def _drop_if_empty(self, group: _Group) -> None:
        if not group.streams and self.groups.get((group.user, group.limit)) is group:
            del self.groups[(group.user, group.limit)]

    def _sent(self, kind: str, data: bytes) -> bytes:
        if self.metrics is not None:
            self.metrics.events.labels(kind).inc()
            if kind == "reset":
                self.metrics.resets.inc()
        return data

    def _timed_out(self) -> None:
        if self.metrics is not None:
            self.metrics.cut_off.labels("send_timeout").inc()

    # -- the watcher ------------------------------------------------------------------------
    def _watch(self) -> None:
        """Start the process's one watcher task, if it is not running."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watching())

    async def _watching(self) -> None:
        gate: Hashable = None
        while self.groups:
            await asyncio.sleep(self.poll_s)
            view = getattr(self.state, "served", None)
            if view is None:
                continue
            try:
                moved, gate = await _call(view, self._moved, view, gate)
                groups = list(self.groups.values())  # taken on the loop, asked on a thread
                for group in await _call(view, self._stale, view, groups, moved):
                    async with group.lock:
                        if group.streams:
                            with contextlib.suppress(AccountGone):  # its streams ended
                                await self._changed(group, view, changed_only=True)
                    await asyncio.sleep(0)  # reads and other streams go between two pages
                self._failing = False
            except Exception:  # the store is away: keep the streams, try again next tick
                if not self._failing:
                    log.warning("live streams: the pages cannot be read; retrying",
                                exc_info=True)
                self._failing = True

    def _moved(self, view: Served, gate: Hashable) -> tuple[bool, Hashable]:
        now = page_token(view.versions.position(), view.celebrities, view.serial)
        return now != gate, now

    @staticmethod
    def _stale(view: Served, groups: list[_Group], moved: bool) -> list[_Group]:
        """The groups whose page may have changed: a token that moved, or an untrusted read."""
        return [g for g in groups
                if g.token is None or (moved and _token(view, g.user) != g.token)]

    async def _changed(self, group: _Group, view: Served, *, changed_only: bool = False
                       ) -> dict[Key, dict[str, Any]] | None:
        """Read ``group``'s page again and send its streams the change (the lock held).

        The page's entries by key (None if ``changed_only`` and the page's bytes stood
        still); :class:`AccountGone` (its streams ended) for a deleted account.
        """
        old, old_view, fresh = group.keys or [], group.view, group.keys is None
        try:
            entries = await self._refresh(group, view, changed_only=changed_only)
        except AccountGone:
            for stream in group.streams:
                stream.end("account_deleted", "the account is deleted")
            raise
        if entries is None or fresh or not group.streams:
            return entries
        assert group.keys is not None
        reset = None
        if group.view != old_view:
            reset = ("view", "the server switched to a rebuilt view: drop what you hold, the "
                             "page follows")
            old = []
        events = self._encoded(group, old, group.keys, entries, reset)
        for stream in group.streams if events else ():
            if stream.ended is None and not stream.push(events, self.cap):
                stream.end("too_slow", f"more than {self.cap} events were waiting to be "
                                       "sent: reconnect with Last-Event-ID")
                if self.metrics is not None:
                    self.metrics.cut_off.labels("queue_full").inc()
        return entries

    async def _refresh(self, group: _Group, view: Served, *, changed_only: bool = False
                       ) -> dict[Key, dict[str, Any]] | None:
        """Read the group's page as ``GET /home`` would; its entries by key.

        ``changed_only``: None if the page's bytes are the ones read last (its ETag
        matches: nothing parsed). Sets the group's window, view and token — the token
        only if the store's position stood still over the read, else None (read again
        next tick).
        """
        self.reads += 1
        group.reads += 1
        number = view.record.number if view.record is not None else 0
        before = await _call(view, _stamp, view, group.user)
        read = Read(view.store, group.user, None, group.limit, None, view)
        status, headers, body = await self.pages.answer(
            view, read, "home", group.etag if changed_only and number == group.view else None)
        after = await _call(view, _stamp, view, group.user)
        group.token = before[1] if before == after else None
        if status == 304:
            return None
        group.etag = dict(headers)[b"etag"].decode()
        entries = {(e["created_at"], int(e["tweet_id"])): e
                   for e in orjson.loads(body)["entries"]}
        group.keys, group.view = list(entries), number
        return entries

    def _encoded(self, group: _Group, old: list[Key], new: list[Key],
                 entries: dict[Key, dict[str, Any]], reset: tuple[str, str] | None
                 ) -> list[tuple[str, bytes]]:
        """The SSE events that take ``old`` to ``new``, each with the window after it."""
        now = int(self.clock())
        out = []
        if reset is not None:
            empty = encode(Window((), group.view, now), group.user)
            out.append(("reset", _sse("reset", {"reason": reset[0], "message": reset[1]},
                                      empty)))
        for event, window in steps(old, new, group.limit):
            ident = encode(Window(tuple(window), group.view, now), group.user)
            key = event.key
            data: dict[str, Any] = {"cursor": encode_cursor(key)}
            if event.kind == "add":
                data |= {"index": window.index(key), "entry": entries[key]}
            else:
                data["tweet_id"] = str(key[1])
            out.append((event.kind, _sse(event.kind, data, ident)))
        return out

    # -- shutting down ----------------------------------------------------------------------
    async def close(self) -> None:
        """End every stream (``shutdown``) and stop the watcher."""
        for group in list(self.groups.values()):
            for stream in group.streams:
                stream.end("shutdown", "the server is shutting down: reconnect with "
                                       "Last-Event-ID")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _sse(kind: str, data: dict[str, Any], ident: str | None = None) -> bytes:
    return ServerSentEvent(orjson.dumps(data).decode(), event=kind, id=ident).encode()


def _token(view: Served, user: int) -> Hashable:
    """A home page's token as the page cache keys it (:func:`serving.reads.page_token`)."""
    return page_token(view.versions.check(HOME, user)[1], view.celebrities, view.serial)


def _stamp(view: Served, user: int) -> tuple[Hashable, Hashable]:
    """The committed position (with what else moves a page) and the page's token."""
    position, token = view.versions.check(HOME, user)
    return (page_token(position, view.celebrities, view.serial),
            page_token(token, view.celebrities, view.serial))


async def _call(view: Served, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` inline for a store read in process, else on a worker thread."""
    if in_process(view.store):
        return fn(*args)
    return await run_in_threadpool(fn, *args)


class _Response(EventSourceResponse):
    """sse-starlette's response, telling the hub when it ends; a send timeout ends it quietly."""

    def __init__(self, content: AsyncIterator[bytes], *, on_timeout: Callable[[], None],
                 on_close: Callable[[], None], **options: Any) -> None:
        super().__init__(content, **options)
        self.on_timeout, self.on_close = on_timeout, on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:  # the client stopped reading: uvicorn closes the socket
            self.on_timeout()
        finally:
            self.on_close()
