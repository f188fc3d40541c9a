"""The two doors of a page read answer byte for byte alike (``FANOUT_API_FAST_READS``).

A page read is answered by the fast path, an ASGI middleware (``middleware``,
serving.reads.FastReads), or by the FastAPI route alone (``off``). Two servers on one
store, one per door, are sent the same raw requests — every status a page read
answers (200, 304, 400, 401, 403, 404), both timelines, cursors, a since read,
HTTP/1.0 and ``Connection: close`` — and must send the same status line, headers and
body, all but the ``date``; the fast path must really have answered what it can.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest

from infra import webclient
from ingest.events import AccountDelete, Follow, Post, Repost, UserUpsert
from serving.app import create_app
from serving.callers import mint
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
SECRET = "d" * 32
READER, AUTHOR, OTHER, GONE = 2, 3, 4, 5
DOORS = ("middleware", "off")


def _token(user: int) -> str:
    return f"Authorization: Bearer {mint(user, SECRET.encode(), 600)}"


Doors = dict[str, tuple[str, CountingFastPath | None]]


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    """A server per door on one store: its base URL and its counting fast path."""
    path = tmp_path_factory.mktemp("doors") / "v.sqlite"
    harness = Harness(JoinConfig(cap=50), SQLiteStore(path, cap=50).open())
    harness.run([UserUpsert(AUTHOR, "author", "An Author", T0),
                 UserUpsert(GONE, "gone", "Gone Soon", T0),
                 Follow(READER, AUTHOR, T0), Follow(GONE, AUTHOR, T0)]
                + [Post(100 + i, AUTHOR, T0 + i, f"tweet {i} ✓") for i in range(8)]
                + [Repost(200, AUTHOR, 101, AUTHOR, T0 + 20), AccountDelete(GONE, T0 + 30)])
    servers: Doors = {}
    with contextlib.ExitStack() as stack:
        stack.callback(harness.store.close)
        for door in DOORS:
            settings = ServingSettings(store_url=f"sqlite:///{path}", timeline_cap=50,
                                       auth=True, auth_secret=SECRET, fast_reads=door)
            app = create_app(settings)
            fast = counting_fast_path(app) if door != "off" else None
            assert (fast is None) == (getattr(app.state, "fast_path", None) is None)
            base = stack.enter_context(running(app))
            servers[door] = (base, fast)
        yield servers


def _answers(doors: Doors, raw: bytes) -> dict[str, tuple[bytes, bool]]:
    """Each door's answer (but its date) and whether it closed the connection after."""
    closing = b"HTTP/1.0" in raw or b"Connection: close" in raw
    out = {}
    for door, (base, _) in doors.items():
        # A close follows the answer at once: waiting for one that should not come is
        # kept short, and one that should may take a loaded box's while.
        (answer,), closed = exchange(base, raw, 1, settle=10.0 if closing else 0.3)
        out[door] = (without_date(answer), closed)
    return out


def _page(doors: Doors, path: str, user: int | None = READER) -> httpx.Response:
    name, _, value = _token(user).partition(": ") if user else ("", "", "")
    return webclient.get(doors["off"][0] + path, headers={name: value} if user else {}, timeout=10)


HOME, TWEETS = f"/v1/users/{READER}/home", f"/v1/users/{AUTHOR}/tweets"


def _requests(doors: Doors) -> list[tuple[str, bytes]]:
    first = _page(doors, f"{HOME}?limit=3").json()
    etag = _page(doors, HOME).headers["etag"]
    tweets_etag = _page(doors, TWEETS, None).headers["etag"]
    reader = _token(READER)
    return [
        ("home", raw_get(HOME, reader)),
        ("home limit", raw_get(f"{HOME}?limit=3", reader)),
        ("home cursor", raw_get(f"{HOME}?limit=3&cursor={first['next_cursor']}", reader)),
        ("home since", raw_get(f"{HOME}?limit=2&since={first['top_cursor']}", reader)),
        ("home 304", raw_get(HOME, reader, f"If-None-Match: {etag}")),
        ("home stale etag", raw_get(HOME, reader, 'If-None-Match: "nope"')),
        ("home HTTP/1.0", raw_get(f"{HOME}?limit=2", reader, version="1.0")),
        ("home close", raw_get(f"{HOME}?limit=2", reader, "Connection: close")),
        ("tweets", raw_get(TWEETS)),
        ("tweets cursor", raw_get(f"{TWEETS}?limit=2&cursor={first['next_cursor']}")),
        ("tweets 304", raw_get(TWEETS, f"If-None-Match: {tweets_etag}")),
        ("401 no token", raw_get(HOME)),
        ("401 bad token", raw_get(HOME, "Authorization: Bearer f1.x.y")),
        ("403 another's", raw_get(HOME, _token(OTHER))),
        ("400 limit 0", raw_get(f"{HOME}?limit=0", reader)),
        ("400 limit past max", raw_get(f"{HOME}?limit=100000", reader)),
        ("400 cursor", raw_get(f"{HOME}?cursor=nope", reader)),
        ("400 unknown parameter", raw_get(f"{HOME}?limitt=2", reader)),
        ("400 user id", raw_get("/v1/users/abc/tweets")),
        ("404 deleted account", raw_get(f"/v1/users/{GONE}/home", _token(GONE))),
        ("404 deleted author", raw_get(f"/v1/users/{GONE}/tweets")),
    ]


def test_every_door_answers_every_page_read_byte_for_byte_alike(doors):
    requests = _requests(doors)
    statuses = set()
    for name, raw in requests:
        got = _answers(doors, raw)
        assert got["middleware"] == got["off"], f"{name}: the middleware's answer differs"
        statuses.add(got["off"][0].split(b" ", 2)[1])
    assert statuses == {b"200", b"304", b"400", b"401", b"403", b"404"}


def test_the_fast_door_answered_what_it_can(doors):
    for name, raw in _requests(doors):
        if name in ("home", "tweets 304"):
            _answers(doors, raw)
    middleware = doors["middleware"][1]
    assert middleware is not None and middleware.in_stack >= 2
    assert doors["off"][1] is None
