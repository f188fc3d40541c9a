"""Inactive users (DESIGN §4b): no fan-out writes to them, and reads that stay exact.

A user whose newest home-timeline read (the ``activity`` log) is older than
``inactive_days`` when an entry for them arrives goes *dormant*: their cache is
dropped, fan-out skips them, and every read of their timeline is evaluated at read
time. Their next read's activity record regenerates the cache. None of that may
change a served page: the property test below checks every user's pages against the
reference (which knows nothing of activity) across random histories, reads and
micro-batch cuts, with a threshold of a few milliseconds so users go dormant and
come back often.

Every test runs on both backends (docs/style.md §7): SQLite in memory, and a real Cassandra
node (``cassandra_hosts`` in ``tests/plugins/cassandra.py``) in a keyspace of the test's own. The
property test's examples share that keyspace, each in an id space of its own
(:func:`_remap`); Cassandra runs fewer of them, each costing round trips.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.events import Activity, Delete, Event, Follow, Post, UserUpsert
from serving.timeline import home_top
from tests.support.cassandra import fresh_keyspace, writing_store
from tests.support.join import ALL_USERS, BIG, USERS, events
from views.delta import TOP
from views.join import JoinConfig
from views.local import LocalJoin
from views.reference import Reference
from views.stores.cassandra.store import CassandraStore
from views.stores.rows import DORMANT
from views.stores.sqlite import SQLiteStore

MS = 1 / 86_400_000  # one millisecond, in days
#: Ids per example of the property test: above every id a history uses but BIG's.
SPACE = 10_000
_SPACES = itertools.count(1)


@dataclasses.dataclass
class Backend:
    """Makes an open store from (cap, inactive_ms, upkeep), with no trim slack.

    ``examples`` sizes the property test. ``upkeep`` is Cassandra's
    (``statements.blind_users``): the exact dormancy tests keep every timeline up every
    batch (1), as SQLite does; the property test also draws blind batches.
    """

    name: str
    make: Callable[[int, int, int], SQLiteStore | CassandraStore]
    examples: int


@pytest.fixture(params=["sqlite", "cassandra"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "sqlite":
        yield Backend("sqlite", lambda cap, inactive_ms, upkeep: SQLiteStore(
            ":memory:", cap=cap, trim_slack=0, inactive_days=inactive_ms * MS).open(), 300)
        return
    with fresh_keyspace(request.getfixturevalue("cassandra_hosts"), "trim_slack=0") as url:
        store = writing_store(url).open()

        def make(cap: int, inactive_ms: int, upkeep: int) -> CassandraStore:
            # One open store for the test; its settings are plain attributes, set per use.
            store.cap, store.inactive_ms, store.upkeep = cap, inactive_ms, upkeep
            return store

        try:
            yield Backend("cassandra", make, 25)
        finally:
            store.close()


def _join(backend: Backend, config: JoinConfig, inactive_ms: int, upkeep: int = 1) -> LocalJoin:
    return LocalJoin(config, backend.make(config.cap, inactive_ms, upkeep))


def _remap(event: Event, ns: int) -> Event:
    """The same event in id space ``ns`` (the order of ids kept): examples share a store."""
    def user(x: int) -> int:
        return BIG - ns * SPACE if x == BIG else ns * SPACE + x

    def tweet(x: int) -> int:
        return BIG - 1 - ns * SPACE if x == BIG - 1 else ns * SPACE + x

    if isinstance(event, Post):
        return dataclasses.replace(event, tweet_id=tweet(event.tweet_id),
                                   author_id=user(event.author_id),
                                   in_reply_to_user_id=event.in_reply_to_user_id
                                   and user(event.in_reply_to_user_id))
    if isinstance(event, Delete):
        return dataclasses.replace(event, tweet_id=tweet(event.tweet_id),
                                   author_id=user(event.author_id))
    if isinstance(event, Follow):
        return dataclasses.replace(event, follower_id=user(event.follower_id),
                                   followee_id=user(event.followee_id))
    assert isinstance(event, UserUpsert | Activity), event
    return dataclasses.replace(event, user_id=user(event.user_id))


def _served(join: LocalJoin, user: int, n: int | None = None
            ) -> list[tuple[int, int, int, int, int]]:
    """The first ``n`` entries (default: the cap), paged by 2 as a client would."""
    return [(e.tweet_id, e.created_at, e.author_id, e.original_id, e.original_author)
            for e in home_top(join.store, user, n or join.config.cap, page_size=2)]


@st.composite
def lives(draw: st.DrawFn) -> list[Event]:
    """A graph early on, then posts, deletes and reads spread over time.

    Reads are sparse and posts keep coming, so users go dormant and return often
    (the generic histories of ``tests.support.join`` are mixed in for every other kind).
    """
    out: list[Event] = [Follow(f, a, draw(st.integers(0, 3))) for f in ALL_USERS
                        for a in ALL_USERS if f != a and draw(st.booleans())]
    out += [Post(1000 + i, draw(USERS), draw(st.integers(0, 40)), f"p{i}")
            for i in range(draw(st.integers(0, 25)))]
    out += [Activity(draw(USERS), draw(st.integers(0, 40)))
            for _ in range(draw(st.integers(0, 8)))]
    out += draw(st.lists(events(), max_size=20))
    return out


def test_pages_of_dormant_and_returning_users_equal_the_sql(backend: Backend) -> None:
    @settings(max_examples=backend.examples, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(history=lives(), seed=st.integers(0, 2**32), batches=st.integers(1, 8),
           cap=st.integers(1, 5), promote_at=st.integers(2, 6), inactive_ms=st.integers(1, 12),
           upkeep=st.sampled_from([1, 2, 8]))
    def run(history: list[Event], seed: int, batches: int, cap: int, promote_at: int,
            inactive_ms: int, upkeep: int) -> None:
        ns = next(_SPACES)
        history = [_remap(e, ns) for e in history]
        rng = random.Random(seed)
        arrivals = history + rng.sample(history, k=len(history) // 3)  # duplicates
        # Roughly in time order, as a live system sees it, with some out-of-order arrival.
        arrivals.sort(key=lambda e: e.created_at + rng.uniform(-4, 4))
        config = JoinConfig(cap, promote_at, max(1, promote_at - 1))
        join = _join(backend, config, inactive_ms, upkeep)
        size = max(1, -(-len(arrivals) // batches))
        for start in range(0, len(arrivals), size):
            join.run(arrivals[start:start + size])
        ref = Reference().add(history)
        for user in (_remap(Activity(u, 0), ns).user_id for u in ALL_USERS):
            # Past the cap too: the pages concatenate to the query with no limit (DESIGN §4).
            want = [tuple(r) for r in ref.home(user, 60)]
            assert _served(join, user, 60) == want, f"user {user}"

    run()


def test_a_user_who_stopped_reading_gets_no_writes_and_reads_exactly_then_comes_back(
        backend: Backend) -> None:
    config = JoinConfig(cap=3, promote_at=100, demote_below=80)
    join = _join(backend, config, inactive_ms=10)
    store = join.store
    join.run([Follow(1, 2, 0), Follow(3, 2, 0), Activity(1, 5), Activity(3, 5)])
    join.run([Post(100, 2, 6, "a"), Post(101, 2, 7, "b")])
    assert [e.tweet_id for e in store.cached(1, None, 10)] == [101, 100]
    written = store.rows_written
    join.run([Activity(3, 30), Post(102, 2, 40, "c")])  # 40 - 5 > 10: user 1 is dormant
    assert store.horizon(1) == DORMANT and store.cached(1, None, 10) == []
    assert store.horizon(3) is None
    assert store.rows_written == written + 1  # only user 3's row
    join.run([Post(103, 2, 41, "d"), Post(104, 2, 42, "e")])
    assert store.cached(1, None, 10) == []
    ref = Reference().add([Follow(1, 2, 0), *(Post(t, 2, at, "x") for t, at in
                                              ((100, 6), (101, 7), (102, 40), (103, 41),
                                               (104, 42)))])
    want = [tuple(r) for r in ref.home(1, 3)]
    assert _served(join, 1) == want  # read at read time, exact: no empty page, no gap
    join.run([Activity(1, 50)])  # the read's record: the cache is regenerated
    assert [e.tweet_id for e in store.cached(1, None, 10)] == [104, 103, 102]
    assert store.horizon(1) == (7, 101)  # the cap's next entry: below it, the query
    assert _served(join, 1) == want
    join.run([Post(105, 2, 51, "f")])  # fan-out reaches the returning user again
    assert store.cached(1, None, 1)[0].tweet_id == 105


def test_a_user_back_and_gone_again_in_one_batch_keeps_no_cache(backend: Backend) -> None:
    config = JoinConfig(cap=3, promote_at=100, demote_below=80)
    join = _join(backend, config, inactive_ms=10)
    history: list[Event] = [Follow(1, 2, 0), Activity(1, 5), Post(100, 2, 6, "a")]
    join.run(history)
    history.append(Post(101, 2, 30, "b"))  # 30 - 5 > 10: dormant
    join.run(history[-1:])
    assert join.store.horizon(1) == DORMANT
    # Back at 31 (the cache is regenerated), and an entry at 50 - 31 > 10: gone again.
    history += [Activity(1, 31), Post(102, 2, 50, "c")]
    join.run(history[-2:])
    assert join.store.horizon(1) == DORMANT and join.store.cached(1, None, 10) == []
    assert _served(join, 1) == [tuple(r) for r in Reference().add(history).home(1, 3)]


def test_users_who_never_read_are_never_dormant(backend: Backend) -> None:
    config = JoinConfig(cap=3, promote_at=100, demote_below=80)
    join = _join(backend, config, inactive_ms=1)
    join.run([Follow(1, 2, 0), Post(100, 2, 10**9, "late")])
    assert join.store.horizon(1) is None
    assert [e.tweet_id for e in join.store.cached(1, None, 10)] == [100]


def test_dormant_is_above_every_key():
    assert DORMANT == TOP
