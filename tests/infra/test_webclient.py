"""``infra.webclient``: the one way the project makes HTTP clients, on a real server."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra import webclient
from tests.support.paths import ROOT

#: A client made by httpx itself builds and loads a TLS context of its own (55-100 ms of
#: CPU); one with a transport given (``httpx.MockTransport``) makes none.
_OWN_CONTEXT = re.compile(r"\bhttpx\.(get|post|put|patch|delete|request|stream|Client)\("
                          r"(?!transport=)")


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer(self.path.encode())

    def do_POST(self) -> None:  # noqa: N802
        self._answer(self.rfile.read(int(self.headers["Content-Length"])))

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        thread.join(10)


def test_get_and_post_answer_over_real_http_with_one_context(server: str) -> None:
    assert webclient.get(f"{server}/a?b=1", timeout=5).text == "/a?b=1"
    assert webclient.post(f"{server}/x", content=b"body").text == "body"
    with webclient.client(base_url=server) as one, webclient.client(base_url=server) as two:
        assert one.get("/c").text == "/c" and two.get("/d").text == "/d"
    assert webclient.tls() is webclient.tls()


def test_threads_that_start_together_share_one_context(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A stream client per connection, started at once: each made a context of its own
    # while the first was still loading its CA bundle.
    monkeypatch.setattr(webclient, "_tls", None)
    start = threading.Barrier(8)
    made: list[object] = []

    def one() -> None:
        start.wait()
        made.append(webclient.tls())

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(made) == 8 and len({id(context) for context in made}) == 1


def test_nothing_makes_an_httpx_client_of_its_own() -> None:
    found = [f"{path.relative_to(ROOT)}:{n}"
             for folder in ("infra", "ingest", "views", "serving", "loadgen", "tests",
                            "benchmarks")
             for path in sorted((ROOT / folder).rglob("*.py"))
             if path.name != "webclient.py" and path != ROOT / "tests/infra/test_webclient.py"
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if _OWN_CONTEXT.search(line)]
    assert not found, f"use infra.webclient instead: {found}"
