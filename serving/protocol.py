"""The API's HTTP protocol: uvicorn's httptools protocol, with page reads answered in place.

A cached home page is a dict lookup and one ``PRAGMA data_version``; what a read
cost before this was mostly the machinery around it — uvicorn's per-request task and
``RequestResponseCycle``, the ASGI messages, and eight middleware layers (profiled:
~230 µs of a core per cached read, of which the page ~30 µs).
:class:`ReadsProtocol` asks :class:`serving.reads.FastPath` as soon as a request's
headers are parsed; when the store is read in process (SQLite) and the request is a
plainly valid page read, the answer is written to the socket right there, from the
parser's callback, with the same status line, headers (uvicorn's ``date`` and
``server`` first) and body the ASGI path would send. Everything else — writes, an
``?after=`` read, a doubtful parameter, an error, a network store, a request
pipelined behind one still being answered — goes to uvicorn's own handling
unchanged, so the routes and their OpenAPI contract stay the only owners of what is
answered, and :mod:`serving.reads`' fast middleware still takes what it can there.

What an answered request still gets, as through uvicorn: ``/metrics`` counts it
(under its route), the access log line (when on), keep-alive with uvicorn's idle
timeout, ``Connection: close`` honoured, HTTP/1.0 closed after the answer, and the
server's request count (``--limit-max-requests``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from uvicorn.server import ServerState

from serving.reads import FastPath


class ReadsProtocol(HttpToolsProtocol):
    """uvicorn's protocol, answering what ``app.state.fast_path`` can at once (module doc)."""

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        fast = getattr(getattr(config.app, "state", None), "fast_path", None)
        self._fast: FastPath | None = fast if isinstance(fast, FastPath) else None
        self._answered = False

    def on_message_begin(self) -> None:
        self._answered = False
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self._fast is not None and self._free() and self._answer(self._fast):
            self._answered = True
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._answered:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._answered:
            super().on_message_complete()

    def _free(self) -> bool:
        """Nothing of this connection is being answered or waits: in-order is kept."""
        cycle = self.cycle
        return (cycle is None or cycle.response_complete) and not self.pipeline \
            and not self.flow.write_paused and self.limit_concurrency is None \
            and not self.root_path

    def _answer(self, fast: FastPath) -> bool:
        parser = self.parser
        if parser.get_method() != b"GET" or parser.should_upgrade():
            return False
        url = httptools.parse_url(self.url)
        if b"%" in url.path:  # percent-escapes: the route's decoding decides
            return False
        start = time.perf_counter()
        path, query = url.path.decode("ascii"), url.query or b""
        answer = fast.answer_now(path, query, self.headers)
        if answer is None:
            return False
        version = parser.get_http_version()
        keep_alive = version != "1.0" and parser.should_keep_alive()
        out = [STATUS_LINE[answer.status]]
        for name, value in (*self.server_state.default_headers, *answer.headers):
            out += (name, b": ", value, b"\r\n")
        if not keep_alive:
            out.append(b"connection: close\r\n")
        out += (b"\r\n", answer.body)
        self.transport.write(b"".join(out))
        if self.access_log:
            scope = {"client": self.client, "path": path, "query_string": query}
            self.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope),  # type: ignore[arg-type]
                                    "GET", get_path_with_query_string(scope),  # type: ignore[arg-type]
                                    version, answer.status)
        fast.observe(answer.route, answer.status, time.perf_counter() - start)
        self.server_state.total_requests += 1
        self._unset_keepalive_if_required()
        if not keep_alive:
            self.transport.close()
        elif not self.transport.is_closing():
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler)
        return True
