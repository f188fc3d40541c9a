r"""Reading the live home stream (``GET /v1/users/{id}/home/stream``) as a client does.

The stream is Server-Sent Events over HTTP/1.1 with a chunked body (DESIGN §7, *Live
stream*). :class:`Parser` is sans-I/O: fed the bytes that follow the response head, in
pieces of any size, it undoes the chunked encoding and returns whole events
(:class:`Event`: ``add``, ``remove``, ``reset``, ``end``, and ``comment`` for the
heartbeats, which are SSE comment lines). Lines end with ``\r\n`` or ``\n``
(sse-starlette sends ``\r\n``); a lone ``\r`` is not taken as a line end. Both
transports share it: :class:`StreamConnection` below, on the standard library's
sockets (gevent-patched under Locust, so a user blocked on its stream yields to the
others), and the asyncio client of ``benchmarks/bench_streams.py``.

:func:`request` is the request line a client sends, with ``Last-Event-ID`` when it
resumes; :func:`head` parses the answer's status line and headers.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from loadgen.errors import LoadgenError

_MAX_HEAD: Final = 65_536
#: The longest chunk-size line or SSE line taken before the stream is called corrupt.
_MAX_LINE: Final = 1 << 20


class StreamError(Exception):
    """The stream failed: refused, reset, timed out, or bytes that are not SSE."""


@dataclass(frozen=True)
class Event:
    """One SSE event: its ``event`` field (``message`` if none), ``data`` and ``id``."""

    kind: str
    data: str = ""
    id: str | None = None


def request(host: bytes, target: str, headers: dict[str, str] | None = None,
            last_id: str | None = None) -> bytes:
    """The bytes of a stream request (``target``: path and query)."""
    lines = [f"GET {target} HTTP/1.1".encode(), b"Host: " + host,
             b"Accept: text/event-stream", b"Cache-Control: no-cache"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}".encode("latin-1"))
    if last_id is not None:
        lines.append(b"Last-Event-ID: " + last_id.encode("ascii"))
    return b"\r\n".join(lines) + b"\r\n\r\n"


def head(buffer: bytes) -> tuple[int, dict[bytes, bytes], bytes] | None:
    """(status, headers lower-cased, the bytes after the head), or None if incomplete."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > _MAX_HEAD:
            msg = "response headers are over 64 KiB"
            raise StreamError(msg)
        return None
    lines = buffer[:end].split(b"\r\n")
    try:
        status = int(lines[0].split(b" ", 2)[1])
    except (IndexError, ValueError):
        msg = f"not an HTTP status line: {lines[0][:80]!r}"
        raise StreamError(msg) from None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, buffer[end + 4:]


class Parser:
    """Chunked body bytes in, SSE events out; see the module docstring.

    ``chunked`` False reads a body that is not chunk-encoded (an HTTP/1.0 answer, or a
    test's plain bytes). :attr:`done` is True once the last chunk (size 0) arrived.
    """

    def __init__(self, *, chunked: bool = True) -> None:
        self.chunked = chunked
        self.done = False
        self._raw = b""  # chunked bytes not yet decoded
        self._left = 0  # bytes of the current chunk still to come (then its CRLF)
        self._text = b""  # decoded bytes not yet split into lines
        self._kind = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, data: bytes) -> list[Event]:
        """The events completed by ``data``."""
        self._text += self._dechunk(data) if self.chunked else data
        events = []
        while (end := self._text.find(b"\n")) >= 0:
            line, self._text = self._text[:end].rstrip(b"\r"), self._text[end + 1:]
            event = self._line(line.decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        if len(self._text) > _MAX_LINE:
            msg = "an SSE line is over 1 MiB"
            raise StreamError(msg)
        return events

    def _dechunk(self, data: bytes) -> bytes:
        self._raw += data
        out = []
        while self._raw and not self.done:
            if self._left > 0:
                piece = self._raw[:self._left]
                out.append(piece)
                self._left -= len(piece)
                self._raw = self._raw[len(piece):]
                if self._left == 0:
                    self._left = -2  # the chunk's CRLF is next
                continue
            if self._left == -2:
                if len(self._raw) < 2:
                    break
                self._raw, self._left = self._raw[2:], 0
                continue
            end = self._raw.find(b"\r\n")
            if end < 0:
                if len(self._raw) > _MAX_LINE:
                    msg = "a chunk-size line is over 1 MiB"
                    raise StreamError(msg)
                break
            try:
                size = int(self._raw[:end].split(b";")[0], 16)
            except ValueError:
                msg = f"not a chunk size: {self._raw[:end][:40]!r}"
                raise StreamError(msg) from None
            self._raw = self._raw[end + 2:]
            self._left = size
            self.done = size == 0
        return b"".join(out)

    def _line(self, line: str) -> Event | None:
        if not line:  # a blank line dispatches the event gathered so far
            if not self._kind and not self._data and self._id is None:
                return None
            event = Event(self._kind or "message", "\n".join(self._data), self._id)
            self._kind, self._data, self._id = "", [], None
            return event
        if line.startswith(":"):
            return Event("comment", line[1:].strip())
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._kind = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None  # retry: and unknown fields are ignored, as EventSource does


class StreamConnection:
    """One stream on a blocking socket: :meth:`open`, then :meth:`read` until done."""

    def __init__(self, base: str, *, connect_timeout: float = 10.0,
                 idle_timeout: float = 45.0) -> None:
        url = urlsplit(base)
        if url.scheme != "http" or not url.hostname:
            msg = f"the stream target must be an http://host[:port] URL, got {base!r}"
            raise LoadgenError(msg)
        self.host, self.port = url.hostname, url.port or 80
        self.authority = url.netloc.rsplit("@", 1)[-1].encode("idna")
        self.prefix = url.path.rstrip("/")
        self.connect_timeout, self.idle_timeout = connect_timeout, idle_timeout
        self._sock: socket.socket | None = None
        self._parser = Parser()
        self._heard = 0.0

    def open(self, target: str, headers: dict[str, str] | None = None,
             last_id: str | None = None) -> tuple[int, bytes, list[Event]]:
        """Send the request; (status, the body of a non-200 answer, the first events)."""
        self.close()
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
            self._sock = sock
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(request(self.authority, self.prefix + target, headers, last_id))
            buffer = b""
            while (parsed := head(buffer)) is None:
                buffer += self._recv(sock)
        except OSError as exc:
            self.close()
            msg = f"{type(exc).__name__}: {exc}"
            raise StreamError(msg) from None
        status, fields, rest = parsed
        self._heard = time.monotonic()
        if status != 200:
            self.close()
            return status, rest, []
        self._parser = Parser(chunked=b"chunked" in fields.get(b"transfer-encoding", b""))
        return status, b"", self._parser.feed(rest)

    def read(self, wait: float) -> list[Event] | None:
        """The events that arrive within ``wait`` s ([] if none); None once the server ended.

        :class:`StreamError` when nothing, not even a heartbeat, arrived for
        ``idle_timeout`` s, or the connection failed.
        """
        if self._sock is None:
            return None
        self._sock.settimeout(max(wait, 0.001))
        try:
            data = self._sock.recv(65_536)
        except TimeoutError:
            if time.monotonic() - self._heard > self.idle_timeout:
                self.close()
                msg = f"nothing arrived for {self.idle_timeout:g} s"
                raise StreamError(msg) from None
            return []
        except OSError as exc:
            self.close()
            msg = f"{type(exc).__name__}: {exc}"
            raise StreamError(msg) from None
        if not data:
            self.close()
            return None
        self._heard = time.monotonic()
        events = self._parser.feed(data)
        if self._parser.done:
            self.close()
        return events

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def _recv(self, sock: socket.socket) -> bytes:
        chunk = sock.recv(65_536)
        if not chunk:
            msg = "the server closed the connection before answering"
            raise ConnectionResetError(msg)
        return chunk
