"""The pure join, checked against the DESIGN's SQL with no Spark in the loop.

Random histories (posts, deletes, follows, unfollows, profiles over a small id space,
so collisions are frequent) are duplicated, shuffled and cut into random micro-batches;
each batch goes through ``views.join.apply_batch`` per key, exactly as the Spark
processor calls it, into a real SQLite store; the served timelines (cache + celebrity
merge + read-time fallback) must equal ``views.reference`` — the literal SQL.
"""

from __future__ import annotations

import functools
import random
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.events import Delete, Event, Follow, Post
from serving.celebrities import CelebrityCache
from serving.timeline import home_page, home_top, read_time_page
from tests.support.join import ALL_USERS, BIG, Harness, events
from views.delta import DeltaKind
from views.join import Change, JoinConfig, apply_batch
from views.reference import Reference


def _split(items: list[Event], cuts: list[int]) -> list[list[Event]]:
    points = sorted({c % (len(items) + 1) for c in cuts})
    bounds = [0, *points, len(items)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _check(harness: Harness, history: list[Event]) -> None:
    ref = Reference().add(history)
    for user in ALL_USERS:
        want = [(r.entry_id, r.actor_id, r.created_at) for r in ref.home(user, harness.config.cap)]
        got = [(e.tweet_id, e.author_id, e.created_at)
               for e in home_top(harness.store, user, harness.config.cap, page_size=3)]
        assert got == want, f"user {user}"
        on_read = [(e.tweet_id, e.author_id, e.created_at) for e in home_top(
            harness.store, user, harness.config.cap, page_size=3, page_fn=read_time_page)]
        assert on_read == want, f"user {user}, fan-out on read"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=st.lists(events(), min_size=5, max_size=80), seed=st.integers(0, 2**32),
       cuts=st.lists(st.integers(0, 200), max_size=6), cap=st.integers(1, 6),
       promote_at=st.integers(1, 4), demote_gap=st.integers(0, 2), slack=st.integers(0, 3))
def test_served_timelines_equal_the_sql(history, seed, cuts, cap, promote_at, demote_gap,
                                        slack):
    rng = random.Random(seed)
    arrivals = history + rng.sample(history, k=len(history) // 3)  # duplicates
    rng.shuffle(arrivals)  # out-of-order arrival
    config = JoinConfig(cap, promote_at, max(1, promote_at - demote_gap))
    harness = Harness(config, trim_slack=slack)
    for batch in _split(arrivals, cuts):
        harness.run(batch)
    _check(harness, history)


@settings(max_examples=100, deadline=None)
@given(history=st.lists(events(), max_size=40), seed=st.integers(0, 2**32))
def test_replaying_batches_changes_nothing(history, seed):
    """A micro-batch applied twice (a crash between sink and checkpoint) is invisible."""
    rng = random.Random(seed)
    config = JoinConfig(3, 3, 2)
    harness = Harness(config)
    states_before = dict(harness.states)
    by_key: dict[int, list[Change]] = defaultdict(list)
    for i, event in enumerate(rng.sample(history, k=len(history))):
        by_key[event.key].append(Change.of(event, i))
    deltas = []
    for key, changes in by_key.items():
        _, out = apply_batch(states_before.get(key), key, changes, config)
        deltas += out
    harness.store.apply(deltas, 0)
    harness.store.apply(deltas, 0)
    _check(harness, history)


def test_follow_backfills_and_unfollow_removes():
    config = JoinConfig(cap=800, promote_at=100, demote_below=80)
    h = Harness(config)
    h.run([Post(10, 1, 1, "a"), Post(11, 1, 2, "b")])
    h.run([Follow(2, 1, 3)])
    assert [e.tweet_id for e in home_top(h.store, 2, 10)] == [11, 10]
    h.run([Follow(2, 1, 4, active=False)])
    assert home_top(h.store, 2, 10) == []


def test_unfollow_seen_before_its_follow_wins():
    h = Harness(JoinConfig())
    h.run([Post(10, 1, 1, "a"), Follow(2, 1, 9, active=False)])
    h.run([Follow(2, 1, 5)])
    assert home_top(h.store, 2, 10) == []


def test_delete_seen_before_post_keeps_it_gone():
    h = Harness(JoinConfig())
    h.run([Follow(2, 1, 1), Delete(10, 1, 9)])
    h.run([Post(10, 1, 5, "late")])
    assert home_top(h.store, 2, 10) == []
    assert h.store.tweets([10])[10].deleted


def test_celebrity_posts_are_not_fanned_out_but_are_served():
    h = Harness(JoinConfig(cap=800, promote_at=2, demote_below=1))
    h.run([Follow(2, 1, 1), Follow(3, 1, 1)])
    _, deltas = apply_batch(h.states[1], 1, [Change.of(Post(10, 1, 5, "x"))], h.config)
    assert not [d for d in deltas
                if d.kind in (DeltaKind.TL_ADD, DeltaKind.FANOUT, DeltaKind.BACKFILL)]
    h.store.apply(deltas)
    assert h.store.cached(2, None, 10) == []
    assert [e.tweet_id for e in home_top(h.store, 2, 10)] == [10]
    assert h.store.celebrities() == [1]


def test_ids_near_2_pow_63_survive():
    h = Harness(JoinConfig())
    h.run([Follow(BIG, BIG - 5, 1), Post(BIG - 1, BIG - 5, 2, "big")])
    (entry,) = home_top(h.store, BIG, 10)
    assert (entry.tweet_id, entry.author_id) == (BIG - 1, BIG - 5)


def test_pages_concatenate_to_the_query_when_trimmed():
    h = Harness(JoinConfig(cap=3, promote_at=100, demote_below=80))
    h.run([Follow(2, 1, 0)] + [Post(100 + i, 1, i, "p") for i in range(10)])
    h.run([Delete(109, 1, 20), Delete(108, 1, 20)])
    seen, below = [], None
    while True:
        page = home_page(h.store, 2, below, 2)
        seen += [e.tweet_id for e in page.entries]
        if page.next_key is None:
            break
        below = page.next_key
    assert seen == [107, 106, 105, 104, 103, 102, 101, 100]


@st.composite
def crowd_events(draw: st.DrawFn) -> Event:
    """Two authors, six would-be followers: follower counts walk around the threshold."""
    kind = draw(st.sampled_from(["post", "post", "delete", "follow", "follow", "follow",
                                 "unfollow", "unfollow"]))
    when = draw(st.integers(0, 6))
    if kind in ("post", "delete"):
        tweet = draw(st.integers(10, 24))
        author = 1 + tweet % 2
        if kind == "post":
            return Post(tweet, author, tweet % 7, f"t{tweet}")
        return Delete(tweet, author, when)
    follower, author = draw(st.integers(3, 8)), draw(st.sampled_from([1, 2]))
    return Follow(follower, author, when, active=kind == "follow")


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=st.lists(crowd_events(), min_size=10, max_size=120), seed=st.integers(0, 2**32),
       cuts=st.lists(st.integers(0, 200), min_size=2, max_size=12), cap=st.integers(1, 5),
       promote_at=st.integers(2, 5), demote_gap=st.integers(0, 2), depth=st.integers(1, 4))
def test_threshold_crossings_keep_timelines_equal_to_the_sql(
        history, seed, cuts, cap, promote_at, demote_gap, depth):
    rng = random.Random(seed)
    arrivals = history + rng.sample(history, k=len(history) // 4)
    rng.shuffle(arrivals)
    harness = Harness(JoinConfig(cap, promote_at, max(1, promote_at - demote_gap)))
    for batch in _split(arrivals, cuts):
        harness.run(batch)
    ref = Reference().add(history)
    # Half the time, walk the merged list even for one celebrity (tiny lists here).
    cache = CelebrityCache(harness.store, depth=depth, walk_from=seed % 2 * 99)
    cache.refresh()
    with_cache = functools.partial(home_page, celebrities=cache)
    for user in range(3, 9):
        want = [(r.entry_id, r.actor_id, r.created_at) for r in ref.home(user, cap)]
        got = [(e.tweet_id, e.author_id, e.created_at)
               for e in home_top(harness.store, user, cap, page_size=2)]
        assert got == want, f"user {user}"
        cached = [(e.tweet_id, e.author_id, e.created_at)
                  for e in home_top(harness.store, user, cap, page_size=2, page_fn=with_cache)]
        assert cached == want, f"user {user}, celebrity cache of depth {depth}"


def test_follow_and_unfollow_at_the_same_time_unfollow_wins_in_any_order():
    for order in ([Follow(2, 1, 5), Follow(2, 1, 5, active=False)],
                  [Follow(2, 1, 5, active=False), Follow(2, 1, 5)]):
        h = Harness(JoinConfig())
        h.run([Post(10, 1, 1, "a")])
        for event in order:
            h.run([event])
        assert home_top(h.store, 2, 10) == []


def test_demotion_backfills_remaining_followers():
    h = Harness(JoinConfig(cap=800, promote_at=3, demote_below=2))
    h.run([Post(12, 1, 1, "x"), Follow(2, 1, 1), Follow(3, 1, 1), Follow(4, 1, 1)])
    assert h.states[1].celebrity and h.store.cached(2, None, 10) == []
    h.run([Follow(3, 1, 2, active=False), Follow(4, 1, 2, active=False)])
    assert not h.states[1].celebrity
    assert [e.tweet_id for e in h.store.cached(2, None, 10)] == [12]
    assert h.store.celebrities() == []


def test_a_delete_under_another_authors_id_does_not_hide_the_tweet():
    h = Harness(JoinConfig())
    h.run([Follow(2, 1, 1), Follow(2, 3, 1), Follow(4, 3, 1), Delete(10, 3, 2)])
    # forged: tweet 10 is author 1's, and user 2 follows both
    h.run([Post(10, 1, 3, "mine")])
    assert [e.tweet_id for e in home_top(h.store, 2, 10)] == [10]
    assert not h.store.tweets([10])[10].deleted
    h.run([Delete(10, 3, 4)])
    assert not h.store.tweets([10])[10].deleted
    assert Reference().add([Follow(2, 1, 1), Delete(10, 3, 2), Post(10, 1, 3, "mine"),
                            Delete(10, 3, 4)]).home(2, 10)[0][0] == 10


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=st.lists(crowd_events(), min_size=5, max_size=60),
       during=st.lists(st.lists(crowd_events(), max_size=15), min_size=1, max_size=6),
       cap=st.integers(1, 4), promote_at=st.integers(2, 4), limit=st.integers(1, 3),
       user=st.integers(3, 8))
def test_each_page_is_the_query_below_its_cursor_under_concurrent_writes(
        before, during, cap, promote_at, limit, user):
    """Stable cursors: between pages, writes land (posts, deletes, follows, crossings)."""
    harness = Harness(JoinConfig(cap, promote_at, max(1, promote_at - 1)), trim_slack=0)
    history = list(before)
    harness.run(before)
    below, seen, writes = None, [], iter(during)
    while True:
        page = home_page(harness.store, user, below, limit)
        everything = [(r.created_at, r.entry_id)
                      for r in Reference().add(history).home(user, 10**6)]
        want = [key for key in everything if below is None or key < below][:limit]
        assert [e.key for e in page.entries] == want
        seen += [e.key for e in page.entries]
        if page.next_key is None:
            break
        below = page.next_key
        batch = next(writes, [])
        history += batch
        harness.run(batch)
    assert seen == sorted(set(seen), reverse=True), "pages repeat or go out of order"
