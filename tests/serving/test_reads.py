"""Cached pages, ETags and the fast path over real HTTP (serving.reads, serving.pagecache).

A page served from the page cache must be the page the store holds now: a delete
or a new tweet committed by another connection (as the sink's are) shows on the
very next read. ``If-None-Match`` with the current ETag answers 304 with no body,
and a stale one the new page. The fast path's body is the route's (the OpenAPI
model validates it), and what it declines — ``?after=``, bad parameters, another
user's token — the route answers in its own shape. Several workers share one port
and stop together.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from infra import webclient
from infra.services.broker import free_port
from ingest.events import MUTE, AccountDelete, Delete, Follow, Post, Relation, Repost, UserUpsert
from serving.app import create_app
from serving.callers import mint
from serving.pageversions import page_versions
from serving.settings import ServingSettings
from serving.shapes import parse_page
from tests.support.api import running
from tests.support.join import Harness
from tests.support.paths import ROOT
from views.join import JoinConfig
from views.stores.sqlite import SQLiteStore

T0 = 1_700_000_000_000
SECRET = "s" * 32
READER, AUTHOR = 2, 3


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Harness, httpx.Client, httpx.Client]]:
    path = tmp_path / "v.sqlite"
    harness = Harness(JoinConfig(cap=50), SQLiteStore(path, cap=50).open())
    harness.run([UserUpsert(AUTHOR, "author", "An Author", T0), Follow(READER, AUTHOR, T0)]
                + [Post(100 + i, AUTHOR, T0 + i, f"tweet {i}") for i in range(5)])
    settings = ServingSettings(store_url=f"sqlite:///{path}", timeline_cap=50, auth=True,
                               auth_secret=SECRET)
    with running(create_app(settings)) as base, \
            webclient.client(base_url=base, timeout=10) as anon, \
            webclient.client(base_url=base, timeout=10, headers={
                "Authorization": f"Bearer {mint(READER, SECRET.encode(), 600)}"}) as reader:
        yield harness, reader, anon
    harness.store.close()


def _ids(response: httpx.Response) -> list[int]:
    return [int(e["tweet_id"]) for e in response.json()["entries"]]


def test_etag_gives_304_until_the_store_changes(world):
    harness, reader, _ = world
    first = reader.get(f"/v1/users/{READER}/home")
    assert first.status_code == 200 and _ids(first) == [104, 103, 102, 101, 100]
    parse_page(first.content)
    etag = first.headers["etag"]
    again = reader.get(f"/v1/users/{READER}/home", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    harness.run([Delete(104, AUTHOR, T0 + 99), Post(105, AUTHOR, T0 + 50, "new")])
    fresh = reader.get(f"/v1/users/{READER}/home", headers={"If-None-Match": etag})
    assert fresh.status_code == 200 and _ids(fresh) == [105, 103, 102, 101, 100]
    assert fresh.headers["etag"] != etag


def test_profile_change_shows_at_once(world):
    harness, reader, _ = world
    assert reader.get(f"/v1/users/{AUTHOR}/tweets").json()["entries"][0]["actor"]["handle"] \
        == "author"
    harness.run([UserUpsert(AUTHOR, "renamed", "An Author", T0 + 1)])
    entry = reader.get(f"/v1/users/{AUTHOR}/tweets").json()["entries"][0]
    assert entry["actor"]["handle"] == entry["tweet"]["author"]["handle"] == "renamed"


@pytest.mark.parametrize("change", ["block", "blocked by", "mute", "account delete",
                                    "repost", "reply to a stranger"])
def test_filters_applied_at_read_time_invalidate_cached_pages(world, change: str):
    """Blocks, mutes, deletes and reposts rewrite no timeline row; the page cache's
    store version must still move, so the next read (and its ETag) is the new page."""
    harness, reader, _ = world
    first = reader.get(f"/v1/users/{READER}/home")
    assert _ids(first) == [104, 103, 102, 101, 100]
    etag = first.headers["etag"]
    assert reader.get(f"/v1/users/{READER}/home", headers={"If-None-Match": etag}) \
        .status_code == 304
    event, want = {
        "block": (Relation(READER, AUTHOR, T0 + 9), []),
        "blocked by": (Relation(AUTHOR, READER, T0 + 9), []),
        "mute": (Relation(READER, AUTHOR, T0 + 9, MUTE), []),
        "account delete": (AccountDelete(AUTHOR, T0 + 9), []),
        "repost": (Repost(900, AUTHOR, 101, AUTHOR, T0 + 9), [900, 104, 103, 102, 100]),
        "reply to a stranger": (Post(105, AUTHOR, T0 + 9, "@x hi", 77), None),
    }[change]
    harness.run([event])
    fresh = reader.get(f"/v1/users/{READER}/home", headers={"If-None-Match": etag})
    if want is None:  # a reply to someone the reader does not follow: the same page,
        assert fresh.status_code == 304  # rendered again: the same bytes, the same tag
        assert reader.get(f"/v1/users/{READER}/home").content == first.content
        return
    assert fresh.status_code == 200 and fresh.headers["etag"] != etag
    assert _ids(fresh) == want


def test_cursor_pages_are_cached_and_exact(world):
    _, reader, _ = world
    for _ in range(2):  # the second round comes from the page cache
        page = reader.get(f"/v1/users/{READER}/home?limit=2")
        rest = reader.get(f"/v1/users/{READER}/home",
                          params={"limit": 3, "cursor": page.json()["next_cursor"]})
        assert _ids(page) + _ids(rest) == [104, 103, 102, 101, 100]


def test_the_route_answers_what_the_fast_path_declines(world):
    _, reader, anon = world
    assert anon.get(f"/v1/users/{READER}/home").status_code == 401
    other = {"Authorization": f"Bearer {mint(AUTHOR, SECRET.encode(), 600)}"}
    assert anon.get(f"/v1/users/{READER}/home", headers=other).status_code == 403
    assert reader.get(f"/v1/users/{READER}/home?limit=0").json()["field"] == "limit"
    assert reader.get(f"/v1/users/{READER}/home?limit=2&limit=3").status_code in (200, 400)
    assert reader.get(f"/v1/users/{READER}/home?cursor=nope").json()["field"] == "cursor"
    after = reader.get(f"/v1/users/{READER}/home?after=bad")
    assert after.status_code == 400 and after.json()["field"] == "after"


def test_route_and_fast_path_bodies_are_the_same(world):
    _, reader, _ = world
    fast = reader.get(f"/v1/users/{READER}/home?limit=3")
    # %33 is "3": the fast path declines percent-escapes, so the route answers this one.
    routed = reader.get(f"/v1/users/{READER}/home?limit=%33")
    assert routed.content == fast.content and routed.headers["etag"] == fast.headers["etag"]


def test_workers_share_the_port_and_stop_on_sigterm(tmp_path: Path):
    """``--workers 2``: both answer on one port; SIGTERM to the parent stops all, status 0."""
    path = tmp_path / "v.sqlite"
    SQLiteStore(path).open().close()
    port = free_port("127.0.0.1")
    env = {**os.environ, "FANOUT_STORE": f"sqlite:///{path}", "FANOUT_AUTH": "off",
           "FANOUT_API_PORT": str(port), "FANOUT_API_WORKERS": "2",
           "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-m", "serving"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        workers: set[int] = set()
        while len(workers) < 2:
            assert time.monotonic() < deadline, "two workers did not come up within 60 s"
            workers = {c.pid for c in psutil.Process(parent.pid).children()}
            time.sleep(0.2)
        answered = 0
        while answered < 5:
            assert time.monotonic() < deadline, "the workers did not answer within 60 s"
            try:
                answered += webclient.get(f"http://127.0.0.1:{port}/v1/users/1/home",
                                      timeout=5).status_code == 200
            except httpx.TransportError:
                time.sleep(0.2)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(30) == 0
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                       for p in workers)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)


def test_a_celebrity_tweet_deleted_below_the_refresh_window_leaves_no_short_page(
        tmp_path: Path) -> None:
    """The cache learns of a delete of an older held tweet only at its full reload; the
    page that hydration finds short is read again without the cache, so it is exact."""
    path = tmp_path / "v.sqlite"
    harness = Harness(JoinConfig(cap=50, promote_at=1, demote_below=1),
                      SQLiteStore(path, cap=50).open())
    harness.run([UserUpsert(AUTHOR, "author", "An Author", T0), Follow(READER, AUTHOR, T0)]
                + [Post(100 + i, AUTHOR, T0 + i, f"tweet {i}") for i in range(40)])
    assert list(harness.store.celebrities()) == [AUTHOR]
    settings = ServingSettings(store_url=f"sqlite:///{path}", timeline_cap=50,
                               celebrity_refresh_s=0.05, auth=False)
    try:
        with running(create_app(settings)) as base, \
                webclient.client(base_url=base, timeout=10) as client:
            assert _ids(client.get(f"/v1/users/{READER}/home?limit=30")) == \
                list(range(139, 109, -1))  # the cache now holds the celebrity
            harness.run([Delete(115, AUTHOR, T0 + 99)])  # older than the newest 16
            time.sleep(0.5)  # several incremental refreshes, no full reload
            page = client.get(f"/v1/users/{READER}/home?limit=30")
            assert _ids(page) == [t for t in range(139, 108, -1) if t != 115]
    finally:
        harness.store.close()


def test_the_celebrity_cache_proposes_but_the_store_decides(tmp_path: Path) -> None:
    """A block, a mute or an account delete applies to the next read although the
    celebrity cache (refreshed once a minute here) still holds the celebrity's entries."""
    path = tmp_path / "v.sqlite"
    stranger = 9
    harness = Harness(JoinConfig(cap=50, promote_at=1, demote_below=1),
                      SQLiteStore(path, cap=50).open())
    harness.run([Follow(READER, AUTHOR, T0), Post(50, stranger, T0, "theirs"),
                 Repost(60, AUTHOR, 50, stranger, T0 + 5)]
                + [Post(100 + i, AUTHOR, T0 + i, f"tweet {i}") for i in range(3)])
    assert list(harness.store.celebrities()) == [AUTHOR]
    settings = ServingSettings(store_url=f"sqlite:///{path}", timeline_cap=50,
                               celebrity_refresh_s=60, auth=False)
    try:
        with running(create_app(settings)) as base, \
                webclient.client(base_url=base, timeout=10) as client:
            def home() -> list[int]:
                return _ids(client.get(f"/v1/users/{READER}/home"))

            assert home() == [60, 102, 101, 100]
            harness.run([Relation(stranger, READER, T0 + 9)])  # the original's author
            assert home() == [102, 101, 100]
            harness.run([Relation(stranger, READER, T0 + 10, active=False),
                         Relation(READER, AUTHOR, T0 + 10, MUTE)])
            assert home() == []
            harness.run([Relation(READER, AUTHOR, T0 + 11, MUTE, active=False)])
            assert home() == [60, 102, 101, 100]
            harness.run([AccountDelete(AUTHOR, T0 + 12)])
            assert home() == []
    finally:
        harness.store.close()


def test_only_what_a_page_shows_moves_the_page_version(tmp_path: Path):
    """Offsets, dead letters and the activity log's read times (what reads themselves
    cause) keep cached pages valid; a tweet, as anything a page shows, moves it."""
    from views.delta import Delta

    path = tmp_path / "v.sqlite"
    harness = Harness(JoinConfig(cap=50), SQLiteStore(path, cap=50).open())
    reader = SQLiteStore(path, cap=50).open()
    versions = page_versions(reader)
    version = versions.position
    try:
        harness.run([Follow(READER, AUTHOR, T0)])
        before = version()
        harness.store.apply([Delta.source_offset("tweets", 0, 7, T0),
                             Delta.activity(READER, T0 + 5)], batch_id=1000)
        harness.store.apply([Delta.dead_letter("tweets", 0, 8, "bad", b"{")], batch_id=1001)
        assert version() == before
        harness.run([Post(900, AUTHOR, T0 + 9, "shown")])
        assert version() != before
    finally:
        versions.close()
        reader.close()
        harness.store.close()


_FREEZE_PROBE = """
import gc, sys
from fastapi.testclient import TestClient
from serving.app import create_app
from serving.settings import ServingSettings
settings = ServingSettings(store_url=sys.argv[1], auth=False)
before = gc.get_freeze_count()
with TestClient(create_app(settings, freeze_heap=sys.argv[2] == "1")) as client:
    status = client.get("/v1/users/1/home").status_code
    print(before, gc.get_freeze_count(), status)
"""


@pytest.mark.parametrize("freeze", [True, False])
def test_a_served_api_freezes_its_heap_once_started(tmp_path: Path, freeze: bool):
    """serve()'s processes move the started app into gc's permanent generation, so a
    full collection while serving walks only what came after; other callers do not."""
    root = ROOT
    out = subprocess.run([sys.executable, "-c", _FREEZE_PROBE,
                          f"sqlite:///{tmp_path / 'v.sqlite'}", "1" if freeze else "0"],
                         capture_output=True, text=True, cwd=root, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    before, after, status = map(int, out.stdout.split())
    assert before == 0 and status == 200
    assert (after > 10_000) if freeze else (after == 0)
