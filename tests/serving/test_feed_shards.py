"""An API process given some feed shards (``FANOUT_FEED_SHARDS``, DESIGN §7 *Scaling out*).

It keeps tokens, and streams, only for the users of its shards: their streams are
exact as any process's, and so are the home pages of every user, in its shards or
not (those are rendered each time). A stream of another shard's user is a 421 in the
JSON error shape naming the user's shard, for a balancer to route by. Over real HTTP
on SQLite (two apps, one of shard 14 only, one of all), and the hub over SQLite and a
real Cassandra node, whose feed then reads only that shard's rows.
"""

from __future__ import annotations

import asyncio
import random
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from infra import webclient
from ingest.events import Follow, Post
from serving.app import create_app
from serving.errors import ServingError
from serving.freshness import Freshness
from serving.metrics import StreamMetrics
from serving.pagecache import PageCache
from serving.pageversions import FeedVersions
from serving.reads import Pages, Read
from serving.settings import ServingSettings, parse_shards
from serving.stream import SHARD_HEADER, StreamHub, WrongShard
from serving.switch import served
from tests.serving.test_stream import Client, _settled, _sql, _wait
from tests.support.api import assert_error, bearer, running
from tests.support.streams import T0, World, Writes, stream_settings
from views.join import JoinConfig
from views.reference import Reference
from views.stores.versions import FEED_SHARDS, shard

#: Reader 2's shard; readers 3 and 4 are in 13 and 10.
SHARD = 14


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path / "shards.sqlite")
    yield w
    w.harness.store.close()


def test_shards_are_spelled_as_documented() -> None:
    assert parse_shards("all") is None and parse_shards("") is None
    assert parse_shards("3/8") == {3, 11} and parse_shards("1,2/8") == {1, 2, 10}
    assert parse_shards("0/1") is None  # every shard
    for bad in ("16", "8/8", "-1", "1/32", "x", "1/"):
        with pytest.raises(ValueError, match="FANOUT_FEED_SHARDS"):
            parse_shards(bad)
    assert ServingSettings(feed_shards="3/8").shards() == {3, 11}
    with pytest.raises(ValueError, match="FANOUT_FEED_SHARDS"):
        ServingSettings(feed_shards="3/17")


def test_a_process_of_one_shard_streams_its_users_and_serves_every_page(world: World) -> None:
    assert (shard(2), shard(3), shard(4)) == (SHARD, 13, 10)
    one = create_app(stream_settings(world.path, feed_shards=str(SHARD)))
    every = create_app(stream_settings(world.path))
    rng = random.Random(54)
    writes = Writes(rng)
    mine = [Client(2, 3), Client(2, 5)]
    others = [Client(3, 5), Client(4, 4)]
    with running(one) as a, running(every) as b, webclient.client(base_url=a, timeout=5) as http_a, \
            webclient.client(base_url=b, timeout=5) as http_b:
        for c in mine:
            c.connect(http_a)
        for c in others:
            c.connect(http_b)
        try:
            for user in (3, 4):  # refused on the process of shard 14 only, naming the shard
                response = http_a.get(f"/v1/users/{user}/home/stream", headers=bearer(user))
                body = assert_error(response, 421)
                assert body["error"] == "wrong_shard" and body["field"] == "user_id"
                assert f"feed shard {shard(user)}" in body["message"]
                assert f"14 of {FEED_SHARDS}" in body["message"]
                assert response.headers[SHARD_HEADER] == str(shard(user))
            for _ in range(12):
                world.run(*writes.batch())
                reference = Reference().add(world.history)
                for c in mine + others:
                    if rng.random() < 0.3:  # resume, on the process of its shard
                        c.read(rng.randint(0, 2))
                        c.close()
                        c.connect(c.http)  # type: ignore[arg-type]
                    assert c.http is not None
                    c.read_until(_settled(c.http, c.user, c.limit, _sql(reference, c)))
                for user, limit in ((3, 5), (4, 4), (2, 5)):  # /home of every user, on both
                    want = [tuple(r) for r in reference.home(user, limit)]
                    _settled(http_a, user, limit, want)
                    _settled(http_b, user, limit, want)
        finally:
            for c in mine + others:
                c.close()
    assert all((c.duplicated, c.phantom, c.ended) == (0, 0, None) for c in mine + others)
    assert sum(c.events for c in mine) > 10


def test_a_hub_of_one_shard_streams_its_user_and_refuses_another(any_store: Any) -> None:
    """User 1 (shard 1) is streamed exactly, on the feed of shard 1 only (Cassandra: it
    read no row of user 2's shard); user 2 (shard 14) is refused before any read, and
    its page is rendered anew on every read, never kept."""
    from views.local import LocalJoin

    join = LocalJoin(JoinConfig(cap=20, promote_at=1000, demote_below=999), any_store)
    join.run([Follow(1, 10, T0), Follow(2, 20, T0), Post(100, 10, T0 + 1, "a"),
              Post(200, 20, T0 + 2, "b")])
    view = served(any_store, "test", lambda s, v: None, shards=frozenset({shard(1)}))
    versions = view.versions
    assert isinstance(versions, FeedVersions) and versions.holds(1) and not versions.holds(2)
    pages = Pages(PageCache(1 << 22), Freshness(1.0, 4), fan_out=True)
    hub = StreamHub(ServingSettings(stream_poll_s=0.02, auth=False), pages,
                    types.SimpleNamespace(served=view), StreamMetrics(CollectorRegistry()))

    async def scenario() -> list[bytes]:
        with pytest.raises(WrongShard) as refused:
            await hub.open(view, 2, 5, None)
        assert isinstance(refused.value, ServingError) and refused.value.status == 421
        assert refused.value.headers == {SHARD_HEADER: str(shard(2))}
        assert hub.groups == {}
        response = await hub.open(view, 1, 5, None)
        got: list[bytes] = []

        async def reading() -> None:
            async for chunk in response.body_iterator:
                got.append(chunk)

        reader = asyncio.create_task(reading())
        await _wait(lambda: len(got) == 1, "the first page")
        join.run([Post(101, 10, T0 + 3, "user 1's"), Post(201, 20, T0 + 4, "user 2's")])
        await _wait(lambda: len(got) == 2, "user 1's new entry")
        reader.cancel()
        await hub.close()
        return got

    try:
        got = asyncio.run(scenario())
        assert b'"tweet_id":"101"' in got[1] and b"201" not in b"".join(got)
        for user in (1, 2):  # user 1's second read is a hit at least; user 2's never
            read = Read(any_store, user, None, 5, None)
            anew = read.body(pages._page_fn(view, read, "home"), None)
            hits = pages.cache.hits
            for _ in range(2):
                assert pages.answer_now(view, read, "home", None)[2] == anew
            assert (pages.cache.hits > hits) == (user == 1)
        assert {shard(u) for _, u in versions._touched} == {shard(1)}  # 10's own page too
        if not any_store.reads_in_process:  # Cassandra: the feed read its shard's rows only
            assert versions.feed.shards == {shard(1)} and versions.feed.rows_read > 0
    finally:
        view.close(own_store=False)
