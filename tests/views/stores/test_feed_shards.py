"""The change feed sharded by user (``views.stores.versions.shard``, Cassandra's
``page_changes_by_shard``, schema step 7).

A user's shard is the same in every process; a writer's changes are stored as one row
per shard of the homes it touched and one rows-shard row with the rest; a feed reading
some shards reads only those rows and the rows shard — fewer rows and ids than a feed
of all shards — and still names every change of its users and every row change.
Cassandra is a real node (``tests/plugins/cassandra.py``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ingest.events import Delete, Follow, Post, UserUpsert
from tests.support.cassandra import fresh_keyspace, writer_from_url
from views.join import JoinConfig
from views.local import LocalJoin
from views.stores.cassandra import changes as stored_changes
from views.stores.cassandra.changes import BUCKET_US, CassandraFeed
from views.stores.cassandra.config import parse_url
from views.stores.cassandra.schema import apply_schema, connect, load_steps
from views.stores.versions import FEED_SHARDS, ROWS_SHARD, Changes, shard, shard_array

T0 = 1_700_000_000_000
#: A quarter of the shards: what the benchmark's one-in-four process reads.
QUARTER = frozenset(s for s in range(FEED_SHARDS) if s % 4 == 1)


def test_a_users_shard_is_fixed_and_well_mixed() -> None:
    # Pinned: a change of the hash or of FEED_SHARDS moves users between processes.
    assert [shard(u) for u in (0, 1, 2, 3, 2**63 - 1)] == [15, 1, 14, 13, 7]
    rng = random.Random(54)
    ids = [*range(20_000), *(rng.getrandbits(63) for _ in range(2_000)),
           *((1_700_000_000_000 << 22) + (w << 12) for w in range(1024))]  # snowflakes
    assert shard_array(np.array(ids, dtype=np.int64)).tolist() == [shard(u) for u in ids]
    counts = np.bincount(shard_array(np.arange(16_000, dtype=np.int64)), minlength=FEED_SHARDS)
    assert counts.min() > 900 and counts.max() < 1100  # 1,000 each, give or take


def test_a_writers_changes_are_a_row_per_shard_of_its_homes_and_a_rows_row() -> None:
    changes = Changes(frozenset(range(100)), frozenset({7}), frozenset({70}), frozenset({8}),
                      originals=frozenset({69}))
    rows = changes.sharded()
    assert rows[ROWS_SHARD] == Changes(authors=frozenset({7}), tweets=frozenset({70}),
                                       users=frozenset({8}), originals=frozenset({69}))
    for s, row in rows.items():
        if s != ROWS_SHARD:
            assert row.homes and {shard(u) for u in row.homes} == {s} and row.size() == len(
                row.homes)
    assert set().union(*(r.homes for r in rows.values())) == set(range(100))
    assert Changes(frozenset({1}), everything=True).sharded() == {
        ROWS_SHARD: Changes(everything=True)}
    assert Changes(homes=frozenset({1})).sharded() == {shard(1): Changes(homes=frozenset({1}))}
    assert Changes().sharded() == {}


@pytest.fixture
def store(cassandra_hosts: str) -> Iterator[Any]:
    with fresh_keyspace(cassandra_hosts, "page_fresh_ms=0") as url:
        opened = writer_from_url(url, cap=50).open()
        try:
            yield opened
        finally:
            opened.close()


def _stored(store: Any, seen: int, committed: int) -> dict[int, list[Changes]]:
    """Every feed row in (seen, committed], by shard, read partition by partition."""
    out: dict[int, list[Changes]] = {}
    session = store._require()
    for bucket in range(seen // BUCKET_US, committed // BUCKET_US + 1):
        for s in (ROWS_SHARD, *range(FEED_SHARDS)):
            rows = session.execute(
                "SELECT homes, authors, tweets, users, everything, originals FROM "
                "page_changes_by_shard WHERE bucket = %s AND shard = %s AND ts > %s "
                "AND ts <= %s", (bucket, s, seen, committed))
            out.setdefault(s, []).extend(stored_changes.Changes.decode(tuple(r)) for r in rows)
    return out


def test_a_feed_of_some_shards_reads_only_their_rows_and_every_change_of_their_users(
        store: Any) -> None:
    """200 readers follow author 1000 (their homes fall in every shard); posts, a
    profile and a delete later, the quarter's feed decoded only the rows of its shards
    and the rows shard, and names exactly its readers' homes and every row change."""
    join = LocalJoin(JoinConfig(cap=50, promote_at=10_000, demote_below=9_999), store)
    join.run([*(Follow(u, 1000, T0) for u in range(1, 201)), Post(1, 1000, T0 + 1, "a")])
    every = store.version()
    assert isinstance(every, CassandraFeed) and every.shards is None
    quarter = every.for_shards(QUARTER)
    seen = every.position()
    join.run([Post(2, 1000, T0 + 2, "b"), Post(3, 2000, T0 + 3, "nobody follows 2000")])
    join.run([UserUpsert(1000, "a", "A", T0 + 4), Delete(1, 1000, T0 + 5)])
    committed = every.position()
    all_batches, some_batches = every.since(seen, committed), quarter.since(seen, committed)
    assert all_batches is not None and some_batches is not None
    assert [ts for ts, _ in some_batches] == [ts for ts, _ in all_batches]  # one per batch
    assert len(all_batches) == 2

    stored = _stored(store, seen, committed)
    mine = [row for s in (ROWS_SHARD, *QUARTER) for row in stored[s]]
    assert quarter.rows_read == len(mine) < every.rows_read == sum(map(len, stored.values()))
    assert quarter.ids_read == sum(r.size() for r in mine) < every.ids_read / 2
    for s, rows in stored.items():  # a shard's rows hold only its users' homes
        assert all(not r.homes if s == ROWS_SHARD else r.size() == len(r.homes) > 0
                   and not r.everything and {shard(u) for u in r.homes} == {s} for r in rows)

    for (_, whole), (_, part) in zip(all_batches, some_batches, strict=True):
        assert part.homes == {u for u in whole.homes if shard(u) in QUARTER}
        assert (part.authors, part.tweets, part.users, part.originals, part.everything) == (
            whole.authors, whole.tweets, whole.users, whole.originals, whole.everything)
    first = all_batches[0][1]
    assert first.homes >= set(range(1, 201))
    assert first.authors >= {1000, 2000} and first.tweets >= {2, 3}
    assert all_batches[1][1].users == {1000} and 1 in all_batches[1][1].tweets


def test_step_7_upgrades_a_keyspace_whose_feed_then_reads_by_shard(cassandra_hosts: str
                                                                   ) -> None:
    """A keyspace of steps 1-6 gets ``page_changes_by_shard`` from ``schema apply`` (and
    again changes nothing); the store's writers and feed use it at once."""
    with fresh_keyspace(cassandra_hosts, "page_fresh_ms=0", schema=False) as url:
        config = parse_url(url)
        cluster, session = connect(config, wait=60)
        try:
            replication = config.replication.cql_map()
            apply_schema(session, config.keyspace, replication, load_steps()[:6])
            assert [s.label for s in apply_schema(session, config.keyspace, replication)] == [
                "007_page_changes_by_shard", "008_home_chunks",
                "009_tweet_refs"]
            assert apply_schema(session, config.keyspace, replication) == []
        finally:
            cluster.shutdown()
        opened = writer_from_url(url, cap=50).open()
        try:
            join = LocalJoin(JoinConfig(cap=50, promote_at=1000, demote_below=999), opened)
            join.run([Follow(1, 10, T0)])
            feed = opened.version().for_shards(frozenset({shard(1)}))
            seen = feed.position()
            join.run([Post(5, 10, T0 + 1, "x")])
            got = feed.since(seen, feed.position())
            assert got is not None and [(c.homes, c.authors) for _, c in got] == [({1}, {10})]
        finally:
            opened.close()
