"""The store contract, written once and run against every backend (docs/style.md §7).

Backends: ``sqlite`` (a temporary file) and ``cassandra``: a real Cassandra node —
the one the test session starts from the Maven jar cache, or the cluster
``FANOUT_CASSANDRA_HOSTS`` names (see ``tests/plugins/cassandra.py``) — in a fresh
keyspace for this module, dropped at the end. Cassandra is skipped, with the reason, only when its
jars are not in the cache.

The Cassandra keyspace is shared by the tests of this module, so every test works in
its own id space (:class:`Space`) and checks global reads (celebrities, counts,
offsets) by membership or difference.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import random
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.events import (
    BLOCK,
    MUTE,
    AccountDelete,
    Delete,
    Event,
    Follow,
    Kind,
    Post,
    Relation,
    Repost,
    Unrepost,
    UserUpsert,
)
from serving.timeline import home_page, home_top, read_time_page
from tests.support.cassandra import fresh_keyspace, writing_store
from tests.support.histories import USERS as USERS_4B
from tests.support.histories import histories
from tests.support.join import ALL_USERS, BIG, Harness, events
from views.delta import Delta, Key, pack
from views.errors import StoreError
from views.join import AuthorState, Change, JoinConfig, apply_batch
from views.reference import Reference
from views.stores.cassandra.statements import BATCH_BUCKET
from views.stores.cassandra.store import CassandraStore
from views.stores.contract import Store
from views.stores.plan import ID_CONFLICTS
from views.stores.rows import Entry, Relations, TweetRow
from views.stores.sqlite import SQLiteStore
from views.stores.versions import ChangeFeed

_SPACES = itertools.count(1)


# -- backends ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Backend:
    """Makes open stores of one kind; ``examples`` sizes its property tests.

    ``upkeep`` is Cassandra's (``statements.blind_users``; SQLite keeps every timeline up
    every batch): the contract's exact counts, trims and horizons are those of
    timelines kept up every batch (1); the property tests also draw blind batches.
    """

    name: str
    make: Callable[[int, int | None, int], Store]
    examples: int

    def store(self, cap: int = 800, slack: int | None = None, upkeep: int = 1) -> Store:
        return self.make(cap, slack, upkeep)


@pytest.fixture(scope="module")
def cassandra_url(cassandra_hosts: str) -> Iterator[str]:
    """A fresh keyspace with the schema, on the session's Cassandra; dropped at the end."""
    with fresh_keyspace(cassandra_hosts) as url:
        yield url


def _shared(open_store: Callable[[], CassandraStore]
            ) -> Callable[[int, int | None, int], Store]:
    """One open store per module; cap, slack and upkeep are plain attributes, set per use."""
    holder: list[CassandraStore] = []

    def make(cap: int, slack: int | None, upkeep: int) -> Store:
        if not holder:
            holder.append(open_store())
        store = holder[0]
        store.cap = cap
        store.trim_slack = max(16, cap // 4) if slack is None else slack
        store.upkeep = upkeep
        return store

    make.close = lambda: [s.close() for s in holder]  # type: ignore[attr-defined]
    return make


@pytest.fixture(scope="module")
def cassandra_backend(cassandra_url: str) -> Iterator[Backend]:
    make = _shared(lambda: writing_store(cassandra_url).open())
    yield Backend("cassandra", make, 40)
    make.close()  # type: ignore[attr-defined]


@pytest.fixture(params=["sqlite", "cassandra"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "cassandra":
        yield request.getfixturevalue("cassandra_backend")
        return
    opened: list[SQLiteStore] = []

    def make(cap: int, slack: int | None, upkeep: int) -> Store:
        for old in opened:
            old.close()
        opened.append(SQLiteStore(tmp_path / f"s{len(opened)}.sqlite", cap=cap,
                                  trim_slack=slack).open())
        return opened[-1]

    yield Backend("sqlite", make, 150)
    for store in opened:
        store.close()


# -- ids and deltas ----------------------------------------------------------------------------

class Space:
    """Ids, topics and batch ids no other test of the run uses."""

    def __init__(self) -> None:
        self.n = next(_SPACES)
        self.base = (10**6 + self.n) * 1000

    def __call__(self, k: int) -> int:
        return self.base + k

    def big(self, k: int = 0) -> int:
        """An id near 2^63 - 1."""
        return BIG - self.n * 1000 - k

    def topic(self, name: str = "tweets") -> str:
        return f"{name}_{self.n}"

    def batch(self, k: int = 0) -> int:
        """Batch ids in a batch-log partition of their own."""
        return (10**5 + self.n) * BATCH_BUCKET + k


@pytest.fixture
def space() -> Space:
    return Space()


def post(tweet: int, author: int, at: int, text: str = "x", reply_to: int = 0) -> Delta:
    return Delta.tweet(tweet, author, at, text, reply_to)


def gone(tweet: int, author: int, at: int = 0) -> Delta:
    return Delta.tweet_deleted(tweet, author, at)


def add(user: int, tweet: int, author: int, at: int) -> Delta:
    return Delta.timeline_add(user, tweet, author, at)


def rm(user: int, tweet: int, author: int, at: int = 0) -> Delta:
    return Delta.timeline_remove(user, tweet, author, at)


def wipe(user: int, author: int) -> Delta:
    (delta,) = pack(author, {}, wipes=[user])
    return delta


def horizon(user: int, key: Key) -> Delta:
    (delta,) = pack(0, {}, horizons={user: key})
    return delta


def follow(follower: int, followee: int, at: int = 1, on: bool = True) -> Delta:
    (delta,) = pack(followee, {}, edges={follower: (on, at)})
    return delta


def edge(user: int, celeb: int, on: bool = True) -> Delta:
    (delta,) = pack(celeb, {}, starred={user: on})
    return delta


def celeb(author: int, on: bool = True) -> Delta:
    return Delta.celebrity(author, on)


def profile(user: int, handle: str, name: str, at: int) -> Delta:
    return Delta.profile(user, at, handle, name)


def repost(tweet: int, author: int, at: int, original: tuple[int, int],
           shown: bool = True) -> Delta:
    return Delta.repost(tweet, author, at, original, shown)


def relation(user: int, other: int, kind: str, on: bool = True, at: int = 1) -> Delta:
    return Delta.relation(user, other, kind, on, at)


def offset(topic: str, partition: int, off: int, at: int = 0) -> Delta:
    return Delta.source_offset(topic, partition, off, at)


def dead(topic: str, partition: int, off: int, reason: str, raw: bytes) -> Delta:
    return Delta.dead_letter(topic, partition, off, reason, raw)


def ids(entries: list[Entry]) -> list[int]:
    return [e.tweet_id for e in entries]


# -- the contract ------------------------------------------------------------------------------

def test_applying_a_batch_twice_is_applying_it_once(backend: Backend, space: Space) -> None:
    store = backend.store()
    u, v, a, c = space(1), space(2), space(3), space(4)
    t1, t2, t3 = space(11), space(12), space(13)
    deltas = [post(t1, a, 5, "one"), post(t2, a, 6, "two"), gone(t3, a), follow(u, a),
              follow(v, a), add(u, t1, a, 5), add(u, t2, a, 6), add(v, t1, a, 5), rm(v, t3, a),
              horizon(v, (1, t1)), profile(a, "ann", "Ann", 3), edge(u, c), celeb(c),
              offset(space.topic(), 0, 41, 6), dead(space.topic(), 0, 40, "bad", b"\x00x"),
              post(space(14), c, 7, "reply", u), repost(space(15), u, 8, (t1, a)),
              repost(space(16), v, 9, (t1, a), shown=False), relation(u, v, BLOCK),
              relation(v, c, MUTE), Delta.account_deleted(c, 9)]

    def seen() -> dict[str, object]:
        return {"cached": [store.cached(x, None, 10) for x in (u, v)],
                "horizons": [store.horizon(x) for x in (u, v)],
                "authors": store.author_tweets([a], None, 10), "tweets": store.tweets([t1, t2, t3]),
                "users": store.users([a, c]), "graph": [store.followees(u), store.followees(v),
                                                     store.celebrities_followed(u)],
                "celeb": c in store.celebrities(),
                "offsets": {k: o for k, o in store.applied_offsets().items()
                            if k[0] == space.topic()},
                "dead": [d for d in store.dead_letters(1000) if d.topic == space.topic()],
                "reposts": (store.reposts_of([t1, t2]), store.tweets([space(15), space(16)]),
                            store.author_tweets([u, v], None, 10)),
                "relations": [store.relations(x) for x in (u, v, c)]}

    store.apply(deltas, space.batch())
    once, counts = seen(), store.counts()
    store.apply(deltas, space.batch())
    assert seen() == once
    store.apply(deltas)  # the same deltas again, as an unlogged batch
    assert seen() == once
    assert store.counts() == counts
    assert ids(once["cached"][0]) == [t2, t1]  # type: ignore[index]
    assert once["reposts"][0] == {t1: [Entry(8, space(15), u)]}  # type: ignore[index]
    assert once["relations"][0] == Relations(frozenset({v}))  # type: ignore[index]


def test_wipes_apply_before_adds(backend: Backend, space: Space) -> None:
    """An unfollow and a re-follow in one batch: the wipe first, then the backfill."""
    store = backend.store()
    u, a, b = space(1), space(2), space(3)
    t1, t2, t3 = space(11), space(12), space(13)
    store.apply([post(t1, a, 1), post(t2, b, 2), add(u, t1, a, 1), add(u, t2, b, 2)])
    store.apply([post(t3, a, 3), wipe(u, a), add(u, t3, a, 3)])
    assert ids(store.cached(u, None, 10)) == [t3, t2]


def test_a_remove_of_unknown_time_finds_the_time(backend: Backend, space: Space) -> None:
    store = backend.store()
    u, a = space(1), space(2)
    t1, t2 = space(11), space(12)
    store.apply([post(t1, a, 7), post(t2, a, 8), add(u, t1, a, 7), add(u, t2, a, 8)])
    store.apply([rm(u, t1, a, 0), gone(t1, a, 0)])
    assert ids(store.cached(u, None, 10)) == [t2]
    assert ids(store.author_tweets([a], None, 10)) == [t2]
    row = store.tweets([t1])[t1]
    assert (row.deleted, row.created_at, row.author_id) == (True, 7, a)


def test_a_remove_of_a_tweet_never_stored_changes_nothing(backend: Backend,
                                                          space: Space) -> None:
    store = backend.store()
    u, a, t1, t9 = space(1), space(2), space(11), space(19)
    store.apply([post(t1, a, 7), add(u, t1, a, 7)])
    store.apply([rm(u, t9, a, 0), gone(t9, a, 0)])
    assert ids(store.cached(u, None, 10)) == [t1]
    assert store.tweets([t9])[t9].deleted


def test_trimming_to_the_cap_raises_the_horizon(backend: Backend, space: Space) -> None:
    store = backend.store(cap=3, slack=0)
    u, a = space(1), space(2)
    t = [space(10 + i) for i in range(8)]
    store.apply([post(t[i], a, i) for i in range(1, 6)] + [add(u, t[i], a, i) for i in range(1, 6)])
    assert ids(store.cached(u, None, 10)) == [t[5], t[4], t[3]]
    assert store.horizon(u) == (2, t[2])
    store.apply([post(t[0], a, 0), add(u, t[0], a, 0)])  # below the horizon: not cached
    assert ids(store.cached(u, None, 10)) == [t[5], t[4], t[3]]
    assert store.horizon(u) == (2, t[2])
    store.apply([post(t[6], a, 6), add(u, t[6], a, 6)])
    assert ids(store.cached(u, None, 10)) == [t[6], t[5], t[4]]
    assert store.horizon(u) == (3, t[3])


def test_slack_defers_trimming_without_changing_reads(backend: Backend, space: Space) -> None:
    store = backend.store(cap=2, slack=3)
    u, a = space(1), space(2)
    t = [space(10 + i) for i in range(6)]
    store.apply([post(t[i], a, i) for i in range(4)] + [add(u, t[i], a, i) for i in range(4)])
    assert store.horizon(u) is None  # 4 rows ≤ cap + slack: not trimmed yet
    store.apply([post(t[i], a, i) for i in (4, 5)] + [add(u, t[i], a, i) for i in (4, 5)])
    assert ids(store.cached(u, None, 10)) == [t[5], t[4]]
    assert store.horizon(u) == (3, t[3])


def test_a_horizon_only_rises(backend: Backend, space: Space) -> None:
    store = backend.store()
    u, v = space(1), space(2)
    assert store.horizon(u) is None
    store.apply([horizon(u, (5, space(15)))])
    store.apply([horizon(u, (3, space(13)))])
    assert store.horizon(u) == (5, space(15))
    store.apply([horizon(u, (5, space(16))), horizon(v, (0, space(10)))])
    assert (store.horizon(u), store.horizon(v)) == ((5, space(16)), (0, space(10)))


def test_cached_is_newest_first_strictly_below(backend: Backend, space: Space) -> None:
    store = backend.store()
    u, a = space(1), space(2)
    rows = [(4, space(11)), (4, space(13)), (4, space(12)), (9, space(10)), (1, space(19))]
    store.apply([post(t, a, c) for c, t in rows] + [add(u, t, a, c) for c, t in rows])
    newest = sorted(rows, reverse=True)
    assert [(e.created_at, e.tweet_id, e.author_id) for e in store.cached(u, None, 10)] == [
        (c, t, a) for c, t in newest]
    assert [e.key for e in store.cached(u, (4, space(13)), 10)] == newest[2:]
    assert [e.key for e in store.cached(u, (4, space(12)), 2)] == newest[3:5]
    assert store.cached(u, None, 0) == []
    assert store.cached(space(99), None, 10) == []


def test_author_tweets_merge_authors_newest_first(backend: Backend, space: Space) -> None:
    store = backend.store()
    a, b, c = space(1), space(2), space(3)
    store.apply([post(space(11), a, 1), post(space(12), b, 2), post(space(13), a, 3),
                 post(space(14), b, 3), post(space(15), c, 9), gone(space(16), a, 5)])
    got = store.author_tweets([a, b], None, 10)
    assert [(e.key, e.author_id) for e in got] == [
        ((3, space(14)), b), ((3, space(13)), a), ((2, space(12)), b), ((1, space(11)), a)]
    assert ids(store.author_tweets([a, b], (3, space(14)), 2)) == [space(13), space(12)]
    assert store.author_tweets([], None, 10) == []
    assert store.recent_by_author([a, c, space(9)], 1) == {
        a: [Entry(3, space(13), a)], c: [Entry(9, space(15), c)], space(9): []}


def test_hydration_with_ids_near_2_pow_63(backend: Backend, space: Space) -> None:
    store = backend.store()
    user, author, tweet = space.big(1), space.big(2), space.big(3)
    store.apply([post(tweet, author, 2**40, "big"), profile(author, "b", "Big", 1),
                 follow(user, author), add(user, tweet, author, 2**40)])
    assert store.cached(user, None, 5) == [Entry(2**40, tweet, author)]
    assert set(store.tweets([tweet, tweet, space(1)])) == {tweet}
    row = store.tweets([tweet])[tweet]
    assert (row.author_id, row.created_at, row.text, row.deleted) == (author, 2**40, "big", False)
    assert store.users([author, space(1)])[author][1:] == ("b", "Big", False)
    assert store.followees(user) == [author]


def test_the_newest_profile_wins(backend: Backend, space: Space) -> None:
    store = backend.store()
    u = space(1)
    store.apply([profile(u, "new", "New", 5)])
    store.apply([profile(u, "old", "Old", 3)])
    assert store.users([u])[u][1:3] == ("new", "New")
    store.apply([profile(u, "newer", "Newer", 5)])
    assert store.users([u])[u] == (u, "newer", "Newer", False)


def test_a_deleted_tweet_stays_deleted(backend: Backend, space: Space) -> None:
    store = backend.store()
    a, t = space(1), space(11)
    store.apply([gone(t, a, 0)])
    store.apply([post(t, a, 4, "late")])
    assert store.tweets([t])[t].deleted
    assert store.author_tweets([a], None, 10) == []


def test_a_delete_under_another_authors_id_hides_nothing(backend: Backend,
                                                         space: Space) -> None:
    store = backend.store()
    u, owner, forger, t = space(1), space(2), space(3), space(11)
    store.apply([gone(t, forger, 0), rm(u, t, forger, 0)])  # before the post
    store.apply([post(t, owner, 3, "mine"), add(u, t, owner, 3)])
    store.apply([gone(t, forger, 0), rm(u, t, forger, 0)])  # and after it
    row = store.tweets([t])[t]
    assert (row.deleted, row.author_id, row.text) == (False, owner, "mine")
    assert ids(store.cached(u, None, 10)) == [t]
    assert ids(store.author_tweets([owner], None, 10)) == [t]
    store.apply([gone(t, owner, 0), rm(u, t, owner, 0)])  # its author's delete
    assert store.tweets([t])[t].deleted and store.cached(u, None, 10) == []
    assert store.author_tweets([owner], None, 10) == []


@pytest.mark.parametrize("forged_first", [True, False])
def test_its_authors_delete_hides_a_tweet_beside_a_forged_one(backend: Backend, space: Space,
                                                              forged_first: bool) -> None:
    """Found by hypothesis (test_timeline_4b): the forged delete used to replace the real
    one in the batch's plan, and the tweet stayed live."""
    store = backend.store()
    owner, forger, t = space(2), space(3), space(11)
    store.apply([post(t, owner, 5, "mine")])
    deletes = [gone(t, forger, 0), gone(t, owner, 5)]
    store.apply(deletes if forged_first else deletes[::-1])
    row = store.tweets([t])[t]
    assert (row.deleted, row.author_id) == (True, owner)
    assert store.author_tweets([owner], None, 10) == []


# -- DESIGN §4b: replies, reposts, account deletes, blocks and mutes -----------------------------

def test_a_reply_names_the_user_it_answers(backend: Backend, space: Space) -> None:
    store = backend.store()
    a, b, t1, t2 = space(1), space(2), space(11), space(12)
    store.apply([post(t1, a, 3, "hi"), post(t2, b, 4, "hi yourself", reply_to=a)])
    rows = store.tweets([t1, t2])
    assert rows[t2] == (t2, b, 4, "hi yourself", False, a, 0, 0, 0, 0)
    assert (rows[t1].reply_to, rows[t1].is_repost, rows[t2].is_repost) == (0, False, False)


def test_a_post_keeps_its_kind_of_record_and_the_tweet_it_refers_to(backend: Backend,
                                                                    space: Space) -> None:
    """Whatever the kind (14: none of the contract's, as a quote would be), as it came."""
    store = backend.store()
    a, b, t1, t2, t3 = space(1), space(2), space(11), space(12), space(13)
    store.apply([Delta.tweet(t1, a, 3, "hi", record=Kind.POST),
                 Delta.tweet(t2, b, 4, "look", reply_to=a, record=14, ref_id=t1),
                 Delta.tweet(t3, b, 5, "gone", record=14, ref_id=t1)])
    store.apply([Delta.tweet_deleted(t3, b, 5)])
    rows = store.tweets([t1, t2, t3])
    assert rows[t2] == (t2, b, 4, "look", False, a, 0, 0, 14, t1)
    assert (rows[t1].record, rows[t1].ref_id) == (Kind.POST, 0)
    assert rows[t3].deleted and (rows[t3].record, rows[t3].ref_id) == (14, t1)


def test_a_repost_is_shown_hidden_and_shown_again(backend: Backend, space: Space) -> None:
    """Unlike a post's delete, a repost's hidden state is not final: the last write wins."""
    store = backend.store()
    a, r, o, rid = space(1), space(2), space(11), space(21)
    store.apply([post(o, a, 3, "original"), repost(rid, r, 5, (o, a))])

    def state() -> tuple[object, ...]:
        row = store.tweets([rid])[rid]
        return (row.deleted, store.reposts_of([o]), ids(store.author_tweets([r], None, 10)))

    shown = (False, {o: [Entry(5, rid, r)]}, [rid])
    hidden = (True, {}, [])
    assert state() == shown
    assert store.tweets([rid])[rid] == (rid, r, 5, "", False, 0, o, a, 0, 0)
    assert store.tweets([rid])[rid].is_repost
    store.apply([repost(rid, r, 5, (o, a), shown=False)])
    assert state() == hidden
    store.apply([repost(rid, r, 5, (o, a))])
    assert state() == shown
    store.apply([repost(rid, r, 5, (o, a), shown=False), repost(rid, r, 5, (o, a))])
    assert state() == shown  # in one batch, too: the last write wins
    store.apply([repost(rid, r, 5, (o, a)), repost(rid, r, 5, (o, a), shown=False)])
    assert state() == hidden
    assert ids(store.author_tweets([a], None, 10)) == [o]  # the original stays its author's


def test_a_repost_written_again_at_another_time_moves(backend: Backend, space: Space) -> None:
    """A duplicate with an earlier time can win (DESIGN §4b): no entry stays at the old key."""
    store = backend.store()
    a, r, o, rid = space(1), space(2), space(11), space(21)
    store.apply([post(o, a, 3), repost(rid, r, 7, (o, a))])
    store.apply([repost(rid, r, 5, (o, a))])
    assert store.author_tweets([r], None, 10) == [Entry(5, rid, r)]
    assert store.reposts_of([o]) == {o: [Entry(5, rid, r)]}
    assert store.tweets([rid])[rid].created_at == 5
    store.apply([repost(rid, r, 4, (o, a), shown=False)])
    assert store.author_tweets([r], None, 10) == [] and store.reposts_of([o]) == {}


def test_reposts_of_lists_shown_reposts_newest_first(backend: Backend, space: Space) -> None:
    store = backend.store()
    a, b, c, d = space(1), space(2), space(3), space(4)
    o1, o2, o3 = space(11), space(12), space(13)
    r = [space(20 + i) for i in range(6)]
    store.apply([post(o1, a, 1), post(o2, a, 2), post(o3, b, 3),
                 repost(r[0], b, 5, (o1, a)), repost(r[1], c, 7, (o1, a)),
                 repost(r[2], d, 7, (o1, a)), repost(r[3], c, 6, (o2, a), shown=False),
                 repost(r[4], d, 4, (o2, a)), repost(r[5], a, 9, (o3, b))])
    assert store.reposts_of([o1, o2, o3, space(19)]) == {
        o1: [Entry(7, r[2], d), Entry(7, r[1], c), Entry(5, r[0], b)],
        o2: [Entry(4, r[4], d)], o3: [Entry(9, r[5], a)]}
    assert store.reposts_of([o2, o2]) == {o2: [Entry(4, r[4], d)]}
    assert store.reposts_of([]) == {}
    # Above a key per original: only newer reposts (ties broken by id), none left: out.
    assert store.reposts_of([o1, o2, o3], {o1: (7, min(r[1], r[2])), o3: (9, r[5])}) == {
        o1: [Entry(7, max(r[1], r[2]), d if r[2] > r[1] else c)], o2: [Entry(4, r[4], d)]}
    assert store.reposts_of([o1], {o1: (4, 0)}) == store.reposts_of([o1])
    # A repost is an entry of its reposter, beside their posts.
    assert ids(store.author_tweets([a, d], None, 10)) == [r[5], r[2], r[4], o2, o1]
    assert store.recent_by_author([c], 5) == {c: [Entry(7, r[1], c)]}


def test_a_tweet_delete_by_the_reposter_hides_the_repost(backend: Backend, space: Space) -> None:
    """A tweets-topic delete naming a repost id undoes it, like an unrepost."""
    store = backend.store()
    a, r, o, rid = space(1), space(2), space(11), space(21)
    store.apply([post(o, a, 3), repost(rid, r, 5, (o, a))])
    store.apply([gone(rid, r, 5), repost(rid, r, 5, (o, a), shown=False)])
    assert store.tweets([rid])[rid].deleted
    assert store.reposts_of([o]) == {}
    assert store.author_tweets([r], None, 10) == []
    assert not store.tweets([o])[o].deleted


def test_a_deleted_original_keeps_its_reposts_rows(backend: Backend, space: Space) -> None:
    """Deleted originals are filtered when read (DESIGN §4b): the repost rows stay."""
    store = backend.store()
    a, r, o, rid = space(1), space(2), space(11), space(21)
    store.apply([post(o, a, 3), repost(rid, r, 5, (o, a))])
    store.apply([gone(o, a, 3)])
    assert store.tweets([o])[o].deleted and not store.tweets([rid])[rid].deleted
    assert store.reposts_of([o]) == {o: [Entry(5, rid, r)]}


def test_an_account_delete_is_final(backend: Backend, space: Space) -> None:
    store = backend.store()
    u, v, w = space(1), space(2), space(3)
    store.apply([profile(u, "ann", "Ann", 3), profile(w, "wes", "Wes", 3)])
    store.apply([Delta.account_deleted(u, 5), Delta.account_deleted(v, 5)])
    assert store.users([u])[u].deleted
    assert store.users([v])[v] == (v, "", "", True)  # no profile: a row all the same
    store.apply([profile(u, "back", "Back", 9), profile(v, "new", "New", 9)])
    store.apply([Delta.account_deleted(w, 2), profile(w, "later", "Later", 9)])  # one batch
    rows = store.users([u, v, w])
    assert [rows[x].deleted for x in (u, v, w)] == [True, True, True]
    assert "back" not in rows[u] and "new" not in rows[v] and "later" not in rows[w]
    store.apply([Delta.account_deleted(u, 1)])  # an older duplicate changes nothing
    assert store.users([u])[u].deleted


def test_a_profile_reads_not_deleted(backend: Backend, space: Space) -> None:
    store = backend.store()
    u = space(1)
    store.apply([profile(u, "ann", "Ann", 3)])
    assert store.users([u])[u] == (u, "ann", "Ann", False)


def test_relations_read_blocks_both_ways_and_mutes_one_way(backend: Backend,
                                                           space: Space) -> None:
    store = backend.store()
    u, x, y, z, w = space(1), space(2), space(3), space(4), space(5)
    store.apply([relation(u, x, BLOCK), relation(y, u, BLOCK), relation(u, z, MUTE),
                 relation(w, u, MUTE)])
    assert store.relations(u) == Relations(frozenset({x, y}), frozenset({z}))
    assert store.relations(x) == Relations(frozenset({u}), frozenset())
    assert store.relations(y) == Relations(frozenset({u}), frozenset())
    assert store.relations(z) == Relations()
    assert store.relations(w) == Relations(frozenset(), frozenset({u}))
    assert store.relations(space(9)) == Relations()
    store.apply([relation(u, x, BLOCK, on=False, at=2), relation(u, z, MUTE, on=False, at=2)])
    assert store.relations(u) == Relations(frozenset({y}))
    assert store.relations(x) == Relations()


def test_a_block_both_ways_stands_until_both_lift_it(backend: Backend, space: Space) -> None:
    store = backend.store()
    u, x = space(1), space(2)
    store.apply([relation(u, x, BLOCK), relation(x, u, BLOCK), relation(u, x, MUTE)])
    store.apply([relation(u, x, BLOCK, on=False, at=2)])
    assert store.relations(u) == Relations(frozenset({x}), frozenset({x}))
    assert store.relations(x) == Relations(frozenset({u}))
    store.apply([relation(x, u, BLOCK, on=False, at=3)])
    assert store.relations(u) == Relations(frozenset(), frozenset({x}))
    assert store.relations(x) == Relations()
    store.apply([relation(u, x, MUTE, on=False, at=2), relation(u, x, MUTE, at=4)])
    assert store.relations(u).muted == {x}  # in one batch the last write wins


def test_follow_and_celebrity_edges(backend: Backend, space: Space) -> None:
    store = backend.store()
    u, a, b, c = space(1), space(2), space(3), space(4)
    store.apply([follow(u, a), follow(u, b), edge(u, c), celeb(c), follow(u, c)])
    assert store.followees(u) == [a, b, c]
    assert store.celebrities_followed(u) == [c]
    assert c in store.celebrities()
    assert {u} <= set(store.home_users())
    store.apply([follow(u, a, 2, on=False), edge(u, c, on=False), celeb(c, on=False)])
    assert store.followees(u) == [b, c]
    assert store.celebrities_followed(u) == []
    assert c not in store.celebrities()


def test_applied_offsets_keep_the_maximum(backend: Backend, space: Space) -> None:
    store = backend.store()
    topic = space.topic()

    def mine() -> dict[tuple[str, int], int]:
        return {k: o for k, o in store.applied_offsets().items() if k[0] == topic}

    store.apply([offset(topic, 0, 5), offset(topic, 0, 2), offset(topic, 1, 7)])
    assert mine() == {(topic, 0): 5, (topic, 1): 7}
    store.apply([offset(topic, 0, 3)])
    assert mine() == {(topic, 0): 5, (topic, 1): 7}
    store.apply([offset(topic, 0, 9)])
    assert mine() == {(topic, 0): 9, (topic, 1): 7}


def test_dead_letters_are_kept_once_as_first_seen(backend: Backend, space: Space) -> None:
    store = backend.store()
    topic = space.topic()
    before = store.dead_letter_count()
    letters = [dead(topic, 0, 3, "not json", b"{"), dead(topic, 1, 4, "no op", b"{}")]
    store.apply(letters, space.batch())
    first = {(d.partition, d.offset): d for d in store.dead_letters(1000) if d.topic == topic}
    time.sleep(0.005)  # a later sighting, by the millisecond its time is kept in
    store.apply(letters, space.batch(1))
    again = {(d.partition, d.offset): d for d in store.dead_letters(1000) if d.topic == topic}
    assert again == first
    assert sorted((k, d.reason, d.raw) for k, d in first.items()) == [
        ((0, 3), "not json", b"{"), ((1, 4), "no op", b"{}")]
    assert store.dead_letter_count() == before + 2
    assert len(store.dead_letters(1)) == 1


def test_two_authors_claims_of_one_id_keep_the_earliest_and_a_dead_letter(
        backend: Backend, space: Space) -> None:
    store = backend.store()
    a, b, late, early = space(1), space(2), space(10), space(11)
    store.apply([post(late, a, 5, "first"), post(early, a, 9, "first")], space.batch())
    store.apply([post(late, b, 7, "late"), post(early, b, 3, "early")], space.batch(1))
    rows = store.tweets([late, early])
    assert (rows[late].author_id, rows[late].text) == (a, "first")
    assert (rows[early].author_id, rows[early].text) == (b, "early")
    letters = {d.offset: json.loads(d.raw) for d in store.dead_letters(1000)
               if d.topic == ID_CONFLICTS and d.offset in (late, early)}
    assert {t: (r["owner"]["author_id"], r["other"]["author_id"])
            for t, r in letters.items()} == {late: (a, b), early: (b, a)}


def test_a_wipe_leaves_a_row_another_authors_claim_owns(backend: Backend, space: Space) -> None:
    # Two claims of one id at one time share a reader's row; the owner is the earlier
    # (created_at, author_id). The row lists the other author (its fan-out reached the
    # reader first): unfollowing that author leaves the owner's entry.
    store = backend.store()
    u, owner, other, mine = space(1), space(2), space(3), space(4)
    t, t2 = space(10), space(11)
    store.apply([post(t, owner, 5, "owned"), post(t, other, 5, "claim"),
                 post(t2, other, 6, "its own")], space.batch())
    store.apply([add(u, t, other, 5), add(u, t2, other, 6)], space.batch(1))
    store.apply([wipe(u, other), wipe(u, mine)], space.batch(2))
    assert ids(store.cached(u, None, 10)) == [t]


def test_counts_and_home_users_see_new_rows(backend: Backend, space: Space) -> None:
    store = backend.store()
    u, a, t1, t2 = space(1), space(2), space(11), space(12)
    before = store.counts()
    store.apply([post(t1, a, 1), post(t2, a, 2), add(u, t1, a, 1), add(u, t2, a, 2)])
    after = store.counts()
    assert after["home_timeline"] - before["home_timeline"] == 2
    assert after["tweets"] - before["tweets"] == 2
    assert after["author_tweets"] - before["author_tweets"] == 2
    assert u in store.home_users()


def test_the_batch_log_is_newest_first(backend: Backend, space: Space) -> None:
    store = backend.store()
    topic = space.topic()
    for k in range(3):
        store.apply([post(space(10 + k), space(1), k), offset(topic, 0, k, at=100 + k)],
                    space.batch(k))
    newest = store.batches(2)
    assert [b.batch_id for b in newest] == [space.batch(2), space.batch(1)]
    assert [b.max_event_time for b in newest] == [102, 101]
    assert all(b.rows > 0 and b.finished_at > 0 for b in newest)


def test_reads_work_inside_a_snapshot(backend: Backend, space: Space) -> None:
    store = backend.store()
    u, a, t = space(1), space(2), space(11)
    store.apply([post(t, a, 1), add(u, t, a, 1)])
    with store.snapshot():
        assert ids(store.cached(u, None, 10)) == [t]
        assert store.horizon(u) is None


def test_a_late_replay_of_an_old_batch_cannot_resurrect(backend: Backend, space: Space) -> None:
    """Cassandra's batch timestamps: a replayed batch writes its original cells."""
    if backend.name == "sqlite":
        pytest.skip("SQLite applies batches in arrival order; Spark only ever replays the "
                    "latest batch, which is safe on every backend")
    store = backend.store()
    u, a, t = space(1), space(2), space(11)
    old = [post(t, a, 1), add(u, t, a, 1), offset(space.topic(), 0, 1)]
    store.apply(old, space.batch(0))
    store.apply([rm(u, t, a, 1), offset(space.topic(), 0, 2)], space.batch(1))
    store.apply(old, space.batch(0))
    assert store.cached(u, None, 10) == []


# -- the join through each backend, against the SQL --------------------------------------------

def _remap(event: Event, ns: int) -> Event:
    """The same event in an id space of its own (order of tweet ids preserved)."""
    def user(x: int) -> int:
        return BIG - ns * 100 if x == BIG else ns * 100 + x

    def tweet(x: int) -> int:
        return x - ns * 100 if x > BIG - 100 else ns * 100 + x

    if isinstance(event, Post):
        return dataclasses.replace(event, tweet_id=tweet(event.tweet_id),
                                   author_id=user(event.author_id),
                                   in_reply_to_user_id=event.in_reply_to_user_id
                                   and user(event.in_reply_to_user_id))
    if isinstance(event, Delete | Unrepost):
        return dataclasses.replace(event, tweet_id=tweet(event.tweet_id),
                                   author_id=user(event.author_id))
    if isinstance(event, Repost):
        return dataclasses.replace(event, tweet_id=tweet(event.tweet_id),
                                   author_id=user(event.author_id),
                                   original_tweet_id=tweet(event.original_tweet_id),
                                   original_author_id=user(event.original_author_id))
    if isinstance(event, Follow | Relation):
        return dataclasses.replace(event, follower_id=user(event.follower_id),
                                   followee_id=user(event.followee_id))
    assert isinstance(event, UserUpsert | AccountDelete)
    return dataclasses.replace(event, user_id=user(event.user_id))


def _check(store: Store, history: list[Event], users: list[int], cap: int) -> None:
    ref = Reference().add(history)
    for user in users:
        if ref.is_deleted(user):
            continue  # not served (DESIGN §4b)
        want = ref.home(user, cap)
        for name, page_fn in (("cache", home_page), ("fan-out on read", read_time_page)):
            got = [(e.tweet_id, e.created_at, e.author_id, e.original_id, e.original_author)
                   for e in home_top(store, user, cap, page_size=3, page_fn=page_fn)]
            assert got == want, f"user {user}, {name}"


def _split(items: list[Event], cuts: list[int]) -> list[list[Event]]:
    points = sorted({c % (len(items) + 1) for c in cuts})
    bounds = [0, *points, len(items)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def test_served_timelines_equal_the_sql(backend: Backend) -> None:
    @settings(max_examples=backend.examples, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(history=st.lists(events(), min_size=5, max_size=60), seed=st.integers(0, 2**32),
           cuts=st.lists(st.integers(0, 200), max_size=6), cap=st.integers(1, 6),
           promote_at=st.integers(1, 4), demote_gap=st.integers(0, 2), slack=st.integers(0, 3),
           upkeep=st.sampled_from([1, 2, 8]))
    def run(history: list[Event], seed: int, cuts: list[int], cap: int, promote_at: int,
            demote_gap: int, slack: int, upkeep: int) -> None:
        ns = next(_SPACES)
        history = [_remap(e, ns) for e in history]
        rng = random.Random(seed)
        arrivals = history + rng.sample(history, k=len(history) // 3)  # duplicates
        rng.shuffle(arrivals)  # out of order
        config = JoinConfig(cap, promote_at, max(1, promote_at - demote_gap))
        harness = Harness(config, store=backend.store(cap, slack, upkeep))  # type: ignore[arg-type]
        for batch in _split(arrivals, cuts):
            harness.run(batch)
        _check(harness.store, history, [_remap(Follow(u, u, 0), ns).follower_id
                                        for u in ALL_USERS], cap)

    run()


@pytest.mark.parametrize("promote_at", [2, 4], ids=["celebrities", "fan-out"])
@pytest.mark.parametrize("losing", [5, 7], ids=["at the owner's time", "later"])
@pytest.mark.parametrize("cuts", [[], [2], [1, 2]], ids=["one batch", "owner apart", "apart"])
def test_a_losing_claim_deleted_before_the_owners_arrives_leaves_the_owners_served(
        backend: Backend, losing: int, cuts: list[int], promote_at: int) -> None:
    # Author 4 posts and deletes id 20 first; author 3's post of it at time 5 owns it
    # (the earlier claim by (created_at, author_id)) and is served to 3's followers.
    ns = next(_SPACES)
    graph = [Follow(1, 3, 0), Follow(2, 3, 0), Follow(2, 4, 0)]
    claims = [Post(20, 4, losing, "loses"), Delete(20, 4, losing + 1), Post(20, 3, 5, "owns")]
    history = [_remap(e, ns) for e in [*graph, *claims]]
    harness = Harness(JoinConfig(3, promote_at, 1), store=backend.store(3, 0))  # type: ignore[arg-type]
    harness.run(history[:len(graph)])
    for batch in _split(history[len(graph):], cuts):
        harness.run(batch)
    _check(harness.store, history, [_remap(Follow(u, u, 0), ns).follower_id
                                    for u in (1, 2, 3, 4)], 3)


@pytest.mark.parametrize("reuse", [False, True], ids=["one author per id", "reused ids"])
def test_served_4b_timelines_equal_the_sql(backend: Backend, reuse: bool) -> None:
    """Every DESIGN §4b record (``tests.support.histories``' histories) through each backend.

    With ``reuse``, ids are also posted or reposted by a second author: the earliest
    claim owns each (``tests/views/test_id_reuse.py``).
    """
    @settings(max_examples=backend.examples, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(history=histories(max_size=50, reuse=reuse), seed=st.integers(0, 2**32),
           cuts=st.lists(st.integers(0, 200), max_size=6), cap=st.integers(1, 6),
           promote_at=st.integers(1, 4), slack=st.integers(0, 3), upkeep=st.sampled_from([1, 2, 8]))
    def run(history: list[Event], seed: int, cuts: list[int], cap: int, promote_at: int,
            slack: int, upkeep: int) -> None:
        ns = next(_SPACES)
        history = [_remap(e, ns) for e in history]
        rng = random.Random(seed)
        arrivals = history + rng.sample(history, k=len(history) // 3)  # duplicates
        rng.shuffle(arrivals)  # out of order
        config = JoinConfig(cap, promote_at, max(1, promote_at - 1))
        harness = Harness(config, store=backend.store(cap, slack, upkeep))  # type: ignore[arg-type]
        for batch in _split(arrivals, cuts):
            harness.run(batch)
        _check(harness.store, history, [_remap(Follow(u, u, 0), ns).follower_id
                                        for u in USERS_4B], cap)

    run()


def test_replaying_every_batch_changes_nothing(backend: Backend) -> None:
    """Each micro-batch applied twice under its id (a crash between sink and checkpoint)."""
    @settings(max_examples=max(10, backend.examples // 3), deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(history=st.lists(events(), max_size=40), seed=st.integers(0, 2**32),
           cuts=st.lists(st.integers(0, 100), max_size=4))
    def run(history: list[Event], seed: int, cuts: list[int]) -> None:
        ns = next(_SPACES)
        history = [_remap(e, ns) for e in history]
        config = JoinConfig(3, 3, 2)
        store = backend.store(3, 0, upkeep=2)  # blind batches, each run twice
        states: dict[int, AuthorState] = {}
        arrivals = random.Random(seed).sample(history, k=len(history))
        for number, batch in enumerate(_split(arrivals, cuts)):
            by_key: dict[int, list[Change]] = defaultdict(list)
            for i, event in enumerate(batch):
                by_key[event.key].append(Change.of(event, i))
            deltas = [offset(f"replay_{ns}", 0, number)]
            for key, changes in by_key.items():
                states[key], out = apply_batch(states.get(key), key, changes, config)
                deltas += out
            store.apply(deltas, number)
            store.apply(deltas, number)
        _check(store, history, [_remap(Follow(u, u, 0), ns).follower_id for u in ALL_USERS], 3)

    run()


def test_a_sqlite_file_from_before_4b_is_refused_with_the_way_out(tmp_path: Path) -> None:
    """Its tables lack the §4b columns: opening it names ``fanout rebuild`` (no migration)."""
    path = tmp_path / "old.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE tweets (tweet_id INTEGER PRIMARY KEY, author_id INTEGER NOT NULL,"
                   " created_at INTEGER NOT NULL, text TEXT NOT NULL, deleted INTEGER NOT NULL)")
    store = SQLiteStore(path)
    with pytest.raises(StoreError, match=r"no reply_to, original_id, original_author.*fanout "
                                         r"rebuild"):
        store.open()
    store.close()
    SQLiteStore(tmp_path / "new.sqlite").open().close()  # a fresh file is created as usual


def test_a_sqlite_file_from_before_tweet_references_gains_them(tmp_path: Path) -> None:
    """Its tweets read as plain posts (record and ref_id 0), and new ones keep theirs."""
    path = tmp_path / "old.sqlite"
    SQLiteStore(path).open().close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("ALTER TABLE tweets DROP COLUMN ref_id")
        db.execute("ALTER TABLE tweets DROP COLUMN record")
        db.execute("INSERT INTO tweets VALUES (1, 2, 3, 'old', 0, 0, 0, 0)")
        db.commit()
    store = SQLiteStore(path).open()
    try:
        store.apply([Delta.tweet(4, 2, 5, "new", record=14, ref_id=1)])
        assert store.tweets([1, 4]) == {1: TweetRow(1, 2, 3, "old", False),
                                        4: TweetRow(4, 2, 5, "new", False, 0, 0, 0, 14, 1)}
    finally:
        store.close()


def test_the_change_feed_names_what_a_batch_touched(backend: Backend, space: Space) -> None:
    """Both backends keep a change feed (DESIGN §7): a page-visible batch moves its
    position and names the home, the author and the tweet; offsets alone name nothing."""
    store = backend.store()
    feed = store.version()
    assert isinstance(feed, ChangeFeed)
    try:
        u, a, t = space(1), space(2), space(3)
        store.apply([offset(space.topic(), 0, 1)])
        before = feed.position()
        store.apply([post(t, a, 10), add(u, t, a, 10)])
        after = feed.position()
        assert after > before
        changes = feed.since(before, after)
        assert changes is not None and changes
        assert u in set().union(*(c.homes for _, c in changes))
        assert a in set().union(*(c.authors for _, c in changes))
        assert t in set().union(*(c.tweets for _, c in changes))
        store.apply([offset(space.topic(), 0, 2)])  # may move the position (Cassandra)
        later = feed.position()
        assert later >= after and feed.since(after, later) == []
        assert feed.since(None, after) is None  # a first look covers nothing
    finally:
        feed.close()


def test_a_sqlite_file_from_before_the_change_feed_gains_it(tmp_path: Path) -> None:
    """An older file (a ``page_version`` counter, no ``page_changes``) is upgraded on
    open; a hand-made bump of ``page_version`` still drops every cached page."""
    path = tmp_path / "old.sqlite"
    SQLiteStore(path).open().close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("DROP TRIGGER page_version_drops_every_page")
        db.execute("DROP TABLE page_changes")
        db.commit()
    store = SQLiteStore(path).open()
    feed = store.version()
    try:
        assert isinstance(feed, ChangeFeed) and feed.position() == 0
        store._conn().execute("UPDATE page_version SET version = version + 1")
        changes = feed.since(0, feed.position())
        assert changes is not None and [c.everything for _, c in changes] == [True]
    finally:
        feed.close()
        store.close()
