"""Page reads answered inside the HTTP protocol (serving.protocol) over real sockets.

The protocol must answer exactly what uvicorn's own protocol answers through the
ASGI app — the same status line, headers and body, byte for byte but the ``date`` —
and keep HTTP's rules: answers in request order when requests are pipelined behind
one the app is still answering, ``Connection: close`` and HTTP/1.0 closed after the
answer, keep-alive otherwise. What it answers is counted in ``/metrics`` like the
rest; what it declines reaches the app unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ingest.events import Follow, Post, UserUpsert
from serving.app import create_app
from serving.settings import ServingSettings
from tests.support.api import (
    CountingFastPath,
    counting_fast_path,
    exchange,
    raw_get,
    running,
    without_date,
)
from tests.support.join import Harness
from views.join import JoinConfig
from views.stores.sqlite import SQLiteStore

T0 = 1_700_000_000_000
READER, AUTHOR = 2, 3
HOME = f"/v1/users/{READER}/home"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Harness, Path]]:
    path = tmp_path / "v.sqlite"
    harness = Harness(JoinConfig(cap=50), SQLiteStore(path, cap=50).open())
    harness.run([UserUpsert(AUTHOR, "author", "An Author", T0), Follow(READER, AUTHOR, T0)]
                + [Post(100 + i, AUTHOR, T0 + i, f"tweet {i}") for i in range(5)])
    yield harness, path
    harness.store.close()


def _app(path: Path):  # noqa: ANN202 - a FastAPI app
    return create_app(ServingSettings(store_url=f"sqlite:///{path}", timeline_cap=50,
                                      auth=False))




def _counting(app) -> CountingFastPath:  # noqa: ANN001
    return counting_fast_path(app)


@pytest.fixture
def served(store) -> Iterator[tuple[Harness, CountingFastPath, httpx.Client]]:
    """The API on the store, counting who answers, and a client of it."""
    harness, path = store
    app = _app(path)
    fast = _counting(app)
    with running(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        yield harness, fast, client


def test_plain_reads_are_answered_in_the_protocol_and_the_rest_by_the_app(served):
    _, fast, client = served
    page = client.get(HOME)
    assert page.status_code == 200 and len(page.json()["entries"]) == 5
    again = client.get(HOME, headers={"If-None-Match": page.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    assert (fast.in_protocol, fast.in_stack) == (2, 0)
    # a percent-escape: the protocol declines, the middleware answers in the stack
    assert client.get(f"/v1/users/%3{READER}/home").content == page.content
    assert (fast.in_protocol, fast.in_stack) == (2, 1)
    assert client.get(f"{HOME}?after=bad").status_code == 400  # the route's error
    assert client.post(HOME).status_code == 405
    assert (fast.in_protocol, fast.in_stack) == (2, 1)


@pytest.mark.parametrize("request_lines", [
    pytest.param((), id="keep-alive"),
    pytest.param(("Connection: close",), id="connection-close"),
    pytest.param(("If-None-Match: *",), id="not-modified"),
    pytest.param(("Accept: application/json", "X-Anything: 1"), id="other-headers"),
])
@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_answers_are_uvicorns_byte_for_byte(store, request_lines, version):
    _, path = store
    ours, theirs = _app(path), _app(path)
    fast = _counting(ours)
    raw = raw_get(f"{HOME}?limit=3", *request_lines, version=version)
    with running(ours) as mine, running(theirs, http="httptools") as uvicorns:
        (got,), closed = exchange(mine, raw, 1)
        (want,), closed_too = exchange(uvicorns, raw, 1)
    assert fast.in_protocol == 1
    assert without_date(got) == without_date(want)
    assert closed == closed_too == ("close" in str(request_lines) or version == "1.0")


def test_pipelined_answers_keep_request_order(store):
    """A plain read pipelined behind one the app answers waits its turn."""
    _, path = store
    app = _app(path)
    fast = _counting(app)
    raw = raw_get(HOME) + raw_get("/healthz") + raw_get(f"{HOME}?limit=2") + raw_get(f"{HOME}?limit=1")
    with running(app) as base:
        answers, closed = exchange(base, raw, 4)
    bodies = [a.split(b"\r\n\r\n", 1)[1] for a in answers]
    assert all(a.startswith(b"HTTP/1.1 200 OK\r\n") for a in answers) and not closed
    assert bodies[0].count(b'"tweet_id"') == 5 and b'"status"' in bodies[1]
    assert bodies[2].count(b'"tweet_id"') == 2 and bodies[3].count(b'"tweet_id"') == 1
    assert fast.in_protocol >= 1  # the first, at least; the ones behind /healthz may wait


def test_a_commit_shows_on_the_next_read_in_the_protocol(served):
    harness, fast, client = served
    first = client.get(HOME)
    harness.run([Post(200, AUTHOR, T0 + 100, "new")])
    second = client.get(HOME, headers={"If-None-Match": first.headers["etag"]})
    assert second.status_code == 200 and second.json()["entries"][0]["tweet_id"] == "200"
    assert fast.in_protocol == 2
