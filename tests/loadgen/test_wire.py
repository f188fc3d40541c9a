"""The load generator's HTTP client (loadgen.wire) against real sockets on loopback.

A small server thread answers scripted bytes, so each framing the client must read
is exercised exactly: Content-Length, chunked, ``Connection: close``, a keep-alive
connection the server closed while idle (sent once more), and a connection closed
mid-answer (a failure, never a retry).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from loadgen.errors import LoadgenError
from loadgen.wire import Connection, WireError

Script = Callable[[socket.socket, int], bool]  # (client socket, request number) -> keep it


@pytest.fixture
def server() -> Iterator[Callable[[Script], tuple[str, list[bytes]]]]:
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(script: Script) -> tuple[str, list[bytes]]:
        seen: list[bytes] = []

        def serve() -> None:
            listener.settimeout(0.2)
            count = 0
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                with conn:
                    while True:
                        data = b""
                        while b"\r\n\r\n" not in data:
                            chunk = conn.recv(65536)
                            if not chunk:
                                break
                            data += chunk
                        if not data:
                            break
                        seen.append(data)
                        count += 1
                        if not script(conn, count):
                            break

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
        return f"http://127.0.0.1:{listener.getsockname()[1]}", seen

    yield start
    stop.set()
    for thread in threads:
        thread.join(5)
    listener.close()


def _ok(body: bytes, *extra: bytes) -> bytes:
    return b"\r\n".join([b"HTTP/1.1 200 OK", b"content-length: %d" % len(body), *extra,
                         b"", b""]) + body


def test_keep_alive_carries_several_requests(server):
    base, seen = server(lambda conn, n: conn.sendall(_ok(b'{"n": %d}' % n)) or True)
    connection = Connection(base)
    assert connection.request("GET", "/a") == (200, b'{"n": 1}')
    assert connection.request("POST", "/b", {"X-User-Id": "7"}, b"{}") == (200, b'{"n": 2}')
    assert seen[0].startswith(b"GET /a HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"X-User-Id: 7\r\n" in seen[1] and b"Content-Length: 2\r\n" in seen[1]


def test_chunked_and_connection_close_answers(server):
    def script(conn: socket.socket, n: int) -> bool:
        if n % 2:
            conn.sendall(b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n")
            return True
        conn.sendall(_ok(b"bye", b"connection: close"))
        return False

    base, seen = server(script)
    connection = Connection(base)
    assert connection.request("GET", "/x") == (404, b"abcde")
    assert connection.request("GET", "/y") == (200, b"bye")
    assert connection.request("GET", "/z") == (404, b"abcde")  # a new connection
    assert len(seen) == 3


def test_an_idle_close_is_sent_again_but_a_cut_answer_fails(server):
    def script(conn: socket.socket, n: int) -> bool:
        if n == 1:
            conn.sendall(_ok(b"first"))
            return False  # closed while the client thinks it is kept alive
        if n == 2:
            conn.sendall(_ok(b"second"))
            return True
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort")
        return False

    base, seen = server(script)
    connection = Connection(base)
    assert connection.request("GET", "/1") == (200, b"first")
    assert connection.request("GET", "/2") == (200, b"second")
    with pytest.raises(WireError, match="inside the response body"):
        connection.request("GET", "/3")
    assert [s.split(b" ")[1] for s in seen] == [b"/1", b"/2", b"/3"]


def test_refused_and_bad_targets_say_so():
    with pytest.raises(LoadgenError, match="http"):
        Connection("ftp://127.0.0.1:1")
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(WireError, match="ConnectionRefused"):
        Connection(f"http://127.0.0.1:{port}").request("GET", "/")
