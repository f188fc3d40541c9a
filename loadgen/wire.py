"""A lean HTTP/1.1 keep-alive client for the Locust users: one connection per user.

Locust's ``FastHttpUser`` (geventhttpclient) spends ~0.6 ms of a core per request on
this box, so two Locust processes could not drive more than ~2,500 reads/s at an API
that answers ~9,000 (profiled: the user agent, its response objects and
``json`` decoding of an 11 KB page). A load generator that is slower than what it
measures measures itself, so :class:`Connection` does only what the API's requests
need: it writes one request, reads the status line and headers, and reads the body
by ``Content-Length`` (or chunked). Sockets are the standard library's, which Locust
has gevent-patched, so a user waiting for its answer yields to the others.

A request on a reused connection that the server closed while it was idle (a
keep-alive timeout) fails before any answer byte arrives (end of stream, a reset or
a broken pipe); it is sent once more on a new connection, as HTTP clients do. Any other failure is the request's:
:class:`WireError` says what happened, and the connection is dropped.
"""

from __future__ import annotations

import socket
import ssl
from typing import Final
from urllib.parse import urlsplit

from loadgen.errors import LoadgenError

_MAX_HEAD: Final = 65_536


class WireError(Exception):
    """A request failed on the wire: refused, reset, timed out or a malformed answer."""


class Connection:
    """One keep-alive connection to ``base`` (``http://host:port`` or ``https://...``)."""

    def __init__(self, base: str, *, connect_timeout: float = 10.0,
                 timeout: float = 30.0) -> None:
        url = urlsplit(base)
        if url.scheme not in ("http", "https") or not url.hostname:
            msg = f"the load target must be an http(s)://host[:port] URL, got {base!r}"
            raise LoadgenError(msg)
        self.host, self.tls = url.hostname, url.scheme == "https"
        self.port = url.port or (443 if self.tls else 80)
        self.authority = url.netloc.rsplit("@", 1)[-1].encode("idna")
        self.prefix = url.path.rstrip("/")
        self.connect_timeout, self.timeout = connect_timeout, timeout
        self._sock: socket.socket | None = None
        self._buffer = b""

    def request(self, method: str, target: str, headers: dict[str, str] | None = None,
                body: bytes | None = None) -> tuple[int, bytes]:
        """Send one request (``target``: path and query); its status and body."""
        head = [f"{method} {self.prefix}{target} HTTP/1.1".encode(), b"Host: " + self.authority]
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}".encode("latin-1"))
        if body is not None:
            head += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
        data = b"\r\n".join(head) + b"\r\n\r\n" + (body or b"")
        reused = self._sock is not None
        try:
            return self._exchange(data)
        except _IdleClosed:
            if not reused:
                msg = "the server closed the connection without answering"
                raise WireError(msg) from None
            return self._exchange(data)  # a keep-alive timeout: once more, on a new one

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buffer = None, b""

    def _exchange(self, data: bytes) -> tuple[int, bytes]:
        try:
            sock = self._sock or self._connect()
            try:
                sock.sendall(data)
                status, length, chunked, close = self._head(sock)
            except (BrokenPipeError, ConnectionResetError):
                if self._buffer:  # some of the answer came: it was not an idle close
                    raise
                raise _IdleClosed from None
            body = self._chunked(sock) if chunked else self._exactly(sock, length)
        except _IdleClosed:
            self.close()
            raise
        except (OSError, ValueError) as exc:
            self.close()
            msg = f"{type(exc).__name__}: {exc}"
            raise WireError(msg) from None
        if close:
            self.close()
        return status, body

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        sock.settimeout(self.timeout)
        self._sock, self._buffer = sock, b""
        return sock

    def _head(self, sock: socket.socket) -> tuple[int, int, bool, bool]:
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            if len(self._buffer) > _MAX_HEAD:
                msg = "response headers are over 64 KiB"
                raise ValueError(msg)
            chunk = sock.recv(65_536)
            if not chunk:
                if not self._buffer:
                    raise _IdleClosed
                msg = "the connection closed inside the response headers"
                raise ValueError(msg)
            self._buffer += chunk
        lines = self._buffer[:end].split(b"\r\n")
        self._buffer = self._buffer[end + 4:]
        status = int(lines[0].split(b" ", 2)[1])
        length, chunked, close = 0, False, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = b"close" in value.lower()
        return status, length, chunked, close

    def _exactly(self, sock: socket.socket, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = sock.recv(max(65_536, n - len(self._buffer)))
            if not chunk:
                msg = "the connection closed inside the response body"
                raise ValueError(msg)
            self._buffer += chunk
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def _line(self, sock: socket.socket) -> bytes:
        while (end := self._buffer.find(b"\r\n")) < 0:
            chunk = sock.recv(65_536)
            if not chunk:
                msg = "the connection closed inside a chunked body"
                raise ValueError(msg)
            self._buffer += chunk
        line, self._buffer = self._buffer[:end], self._buffer[end + 2:]
        return line

    def _chunked(self, sock: socket.socket) -> bytes:
        parts = []
        while size := int(self._line(sock).split(b";")[0], 16):
            parts.append(self._exactly(sock, size))
            self._line(sock)
        while self._line(sock):  # trailers, up to the empty line
            pass
        return b"".join(parts)


class _IdleClosed(Exception):
    """The server closed the connection before any byte of the answer."""
