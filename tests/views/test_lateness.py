"""The lateness bound: late records become dead letters, and the state it lets go is not missed.

A tweets- or follows-topic record more than ``L`` older than the newest ``created_at``
of an earlier record of its key and topic is late (``views.join``, DESIGN §4). Random
histories of every record kind with a small ``L`` are put into a log in a random,
mostly-by-time order (so some records are late), with duplicates, cut into random
micro-batches and joined with pruning; the served timelines must equal the reference
applying the same rule to the same log, the dead letters must be exactly the records
the reference calls late, and no kept tombstone, undo or dead edge may be older than
the bound. A year-long generated-style history shows what pruning saves.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import replace
from itertools import count

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.events import (
    AccountDelete,
    Delete,
    Event,
    Follow,
    Post,
    Relation,
    Repost,
    Unrepost,
    encode,
)
from ingest.generator import generate
from ingest.social import SOCIAL
from serving.timeline import home_top, read_time_page
from views.codec import encode_state
from views.join import (
    BOUNDED_RANKS,
    DAY_MS,
    DEFAULT_LATENESS_MS,
    AuthorState,
    Change,
    JoinConfig,
    apply_batch,
)
from views.local import LocalJoin
from views.reference import Reference
from views.stores.sqlite import SQLiteStore

BIG = 2**63 - 1
USERS = [1, 2, 3, 4, BIG]
LATENESS = 10
TWEET_IDS = [*range(10, 24), BIG - 1]
REPOST_IDS = list(range(40, 48))


@st.composite
def histories(draw: st.DrawFn) -> list[Event]:
    """Records of every kind over times 0..60, keeping the contract the pruning relies on.

    Duplicates are exact copies (each id has one post or repost record), and a delete
    or undo is not older than the post or repost it names (DESIGN §3).
    """
    posts = {t: Post(t, USERS[t % 5], draw(st.integers(0, 60)), f"t{t}",
                     draw(st.sampled_from([0, 0, 0, *USERS])))
             for t in draw(st.sets(st.sampled_from(TWEET_IDS), max_size=10))}
    posts = {t: p if p.in_reply_to_user_id != p.author_id else
             Post(t, p.author_id, p.created_at, p.text) for t, p in posts.items()}
    events: list[Event] = list(posts.values())
    for t in draw(st.sets(st.sampled_from(TWEET_IDS), max_size=4)):
        made = posts.get(t)
        at = made.created_at if made is not None else draw(st.integers(0, 60))
        events.append(Delete(t, USERS[t % 5], at + draw(st.integers(0, 25))))
    originals = sorted(posts) or TWEET_IDS[:1]
    for rid in draw(st.sets(st.sampled_from(REPOST_IDS), max_size=5)):
        original = draw(st.sampled_from(originals))
        reposter = draw(st.sampled_from(USERS))
        at = draw(st.integers(0, 60))
        events.append(Repost(rid, reposter, original, USERS[original % 5], at))
        undo = draw(st.sampled_from([None, None, Unrepost, Delete]))
        if undo is not None:
            events.append(undo(rid, reposter, at + draw(st.integers(0, 25))))
    for _ in range(draw(st.integers(0, 25))):
        follower, followee = draw(st.lists(st.sampled_from(USERS), min_size=2, max_size=2,
                                           unique=True))
        at, active = draw(st.integers(0, 60)), draw(st.booleans())
        kind = draw(st.sampled_from(["follow", "follow", "follow", "block", "mute"]))
        events.append(Follow(follower, followee, at, active=active) if kind == "follow" else
                      Relation(follower, followee, at, kind, active=active))
    if draw(st.booleans()):
        events.append(AccountDelete(draw(st.sampled_from(USERS)), draw(st.integers(0, 60))))
    return events


def _log(history: list[Event], rng: random.Random, spread: int) -> list[Event]:
    """A log of ``history`` with duplicates: by time, each record up to ``spread`` late."""
    records = history + rng.sample(history, k=len(history) // 3)
    return sorted(records, key=lambda e: e.created_at + rng.uniform(0, spread))


def _split(items: list[Event], cuts: list[int]) -> list[list[Event]]:
    points = sorted({c % (len(items) + 1) for c in cuts})
    bounds = [0, *points, len(items)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _entries(store: SQLiteStore, user: int, cap: int, **kw) -> list[tuple]:
    return [(e.tweet_id, e.created_at, e.author_id, e.original_id, e.original_author)
            for e in home_top(store, user, cap, page_size=3, **kw)]


def _assert_bounded(state: AuthorState, lateness: int) -> None:
    """No kept tombstone, undo or dead edge is older than its topic's mark minus the bound."""
    follows_floor, tweets_floor = (state.marks[r] - lateness for r in BOUNDED_RANKS)
    assert all(at >= tweets_floor for at in state.tombstones.values())
    assert all(at >= tweets_floor for at in state.undone.values())
    assert all(on or at >= follows_floor for at, on in state.followers.values())
    assert all(on or at >= follows_floor for at, on in state.relations.values())


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), seed=st.integers(0, 2**32),
       spread=st.sampled_from([0, 8, 30, 1000]),
       cuts=st.lists(st.integers(0, 200), max_size=8), cap=st.integers(1, 6),
       promote_at=st.integers(1, 4))
def test_pruned_join_serves_the_sql_of_the_on_time_records(history, seed, spread, cuts, cap,
                                                            promote_at):
    log = _log(history, random.Random(seed), spread)
    config = JoinConfig(cap, promote_at, max(1, promote_at - 1), LATENESS)
    join = LocalJoin(config, SQLiteStore(":memory:", cap=cap).open())
    for batch in _split(log, cuts):
        join.run(batch)
    ref = Reference(LATENESS).add(log)
    for user in USERS:
        want = [tuple(r) for r in ref.home(user, cap)]
        if ref.is_deleted(user):
            continue
        assert _entries(join.store, user, cap) == want, f"user {user}"
        assert _entries(join.store, user, cap, page_fn=read_time_page) == want, f"user {user}"
    letters = join.store.dead_letters(limit=10_000)
    assert all(d.reason.startswith("late: ") for d in letters)
    assert (Counter((d.topic, d.raw) for d in letters)
            == Counter((e.topic, encode(e)[1]) for e in ref.late))
    for state in join.states.values():
        _assert_bounded(state, LATENESS)


def _run_one_key(records: list[Event], config: JoinConfig) -> tuple[AuthorState, list]:
    state, deltas, offsets = None, [], count()
    for event in records:
        state, out = apply_batch(state, event.key, [Change.of(event, next(offsets))], config)
        deltas += out
    assert state is not None
    return state, deltas


def test_a_record_older_than_the_bound_is_a_dead_letter_and_changes_nothing():
    config = JoinConfig(lateness=DAY_MS)
    late = Post(10, 1, 5, "late")
    state, deltas = _run_one_key([Follow(2, 1, 4 * DAY_MS), Post(11, 1, 3 * DAY_MS, "a"),
                                  late, Post(12, 1, 2 * DAY_MS + 1, "on time")], config)
    (letter,) = [d for d in deltas if d.kind.name == "DEAD"]
    assert (letter.topic, letter.offset) == ("tweets", 2)
    assert letter.text.startswith("late: created_at 5 ")
    assert letter.raw == encode(late)[1]
    assert set(state.tweets) == {11, 12}
    # A follows record is judged against the key's follows records only.
    ref = Reference(DAY_MS).add([Follow(2, 1, 4 * DAY_MS), Post(11, 1, 3 * DAY_MS, "a"),
                                 late, Post(12, 1, 2 * DAY_MS + 1, "on time")])
    assert ref.late == [late]


def test_late_records_reach_the_stores_dead_letters_and_its_count():
    store = SQLiteStore(":memory:", cap=10).open()
    join = LocalJoin(JoinConfig(cap=10, lateness=DAY_MS), store)
    join.run([Follow(2, 1, 10 * DAY_MS)])
    join.run([Follow(3, 1, 5 * DAY_MS), Post(20, 1, 6 * DAY_MS, "p")])
    assert store.dead_letter_count() == 1
    (letter,) = store.dead_letters()
    assert (letter.topic, letter.offset, letter.reason.split(":")[0]) == ("follows", 1, "late")
    assert [e.tweet_id for e in home_top(store, 2, 10)] == [20]
    assert home_top(store, 3, 10) == []


def test_tombstones_undos_and_dead_edges_go_once_past_the_bound():
    config = JoinConfig(lateness=DAY_MS)
    state, _ = _run_one_key([Post(10, 1, 1, "a"), Delete(10, 1, 2), Repost(30, 1, 99, 5, 3),
                             Unrepost(30, 1, 4), Follow(2, 1, 1), Follow(2, 1, 2, active=False),
                             Relation(3, 1, 2, "block"), Relation(3, 1, 3, "block", active=False)],
                            config)
    assert (state.tombstones, state.undone) == ({10: 2}, {30: 4})
    assert 2 in state.followers and (3, "block") in state.relations
    state, _ = apply_batch(state, 1, [Change.of(Post(11, 1, DAY_MS + 5, "b"), 10),
                                      Change.of(Follow(4, 1, DAY_MS + 10), 11)], config)
    assert (state.tombstones, state.undone, state.reposts) == ({}, {}, {})
    assert state.followers == {4: (DAY_MS + 10, True)} and state.relations == {}
    # A copy of a record whose tombstone is gone is late, so it cannot come back.
    state, deltas = apply_batch(state, 1, [Change.of(Post(10, 1, 1, "a"), 12)], config)
    assert 10 not in state.tweets and [d.kind.name for d in deltas] == ["DEAD"]


def test_without_a_bound_nothing_is_late_and_nothing_is_dropped():
    config = JoinConfig(lateness=None)
    state, deltas = _run_one_key([Post(11, 1, 10 * DAY_MS, "b"), Delete(10, 1, 2),
                                  Post(10, 1, 1, "a")], config)
    assert state.tombstones == {10: 2} and not [d for d in deltas if d.kind.name == "DEAD"]
    assert Reference(None).add([Post(11, 1, 10 * DAY_MS, "b"), Post(10, 1, 1, "a")]).late == []


def test_the_default_bound_leaves_a_generated_history_in_time_order_alone():
    made = generate(300, 2_000, 1_500, seed=3, mix=SOCIAL)
    assert Reference(DEFAULT_LATENESS_MS).add(made.events()).late == []


def _year(seed: int, users: int = 60, days: int = 365) -> tuple[list[Event], list[Event]]:
    """A year of posts, deletes, reposts and undos, follows, unfollows, blocks, unblocks.

    Returns the log (records by time, each up to an hour late) and its live records:
    what is left when every undone record and its undo are taken out.
    """
    rng = random.Random(seed)
    log: list[Event] = []
    live: list[Event] = []
    ids = count(1000)
    posts: list[Post] = []
    for day in range(days):
        for _ in range(users):
            at = day * DAY_MS + rng.randrange(DAY_MS)
            author = rng.randrange(1, users + 1)
            roll = rng.random()
            if roll < 0.5:
                post = Post(next(ids), author, at, "x")
                posts.append(post)
                log.append(post)
                if rng.random() < 0.2:
                    log.append(Delete(post.tweet_id, author, at + rng.randrange(DAY_MS)))
                else:
                    live.append(post)
            elif roll < 0.7 and posts:
                original = rng.choice(posts[-200:])
                repost = Repost(next(ids), author, original.tweet_id, original.author_id, at)
                log.append(repost)
                if rng.random() < 0.3:
                    log.append(Unrepost(repost.tweet_id, author, at + rng.randrange(DAY_MS)))
                else:
                    live.append(repost)
            else:
                other = rng.choice([u for u in range(1, users + 1) if u != author])
                edge = (Follow(other, author, at) if roll < 0.95
                        else Relation(other, author, at, "block"))
                log.append(edge)
                if rng.random() < 0.3:
                    log.append(replace(edge, created_at=at + rng.randrange(DAY_MS),
                                       active=False))
                else:
                    live.append(edge)
    log.sort(key=lambda e: e.created_at + rng.randrange(3_600_000))
    live.sort(key=lambda e: e.created_at)
    return log, live


def _state_bytes(records: list[Event], config: JoinConfig) -> int:
    """Encoded state bytes after joining ``records`` in batches of 500 (no store)."""
    states: dict[int, AuthorState] = {}
    for first in range(0, len(records), 500):
        by_key: dict[int, list[Change]] = defaultdict(list)
        for offset, event in enumerate(records[first:first + 500], first):
            by_key[event.key].append(Change.of(event, offset))
        for key, changes in by_key.items():
            states[key], _ = apply_batch(states.get(key), key, changes, config)
    return sum(len(encode_state(s)) for s in states.values())


def test_a_years_state_shrinks_to_about_its_live_records():
    """The target: after a year, state bytes ≤ 1.2× those of the live records alone.

    Measured (seed 1, 60 users, 27k records): 197 kB pruned, 203 kB for the live
    records alone (deleted tweets leave room for older kept ones there), 312 kB when
    the state keeps every tombstone, undo and dead edge.
    """
    log, live = _year(seed=1)
    config = JoinConfig(cap=50, promote_at=1000, demote_below=800)
    pruned = _state_bytes(log, config)
    kept_for_good = _state_bytes(log, replace(config, lateness=None))
    live_only = _state_bytes(live, replace(config, lateness=None))
    assert pruned < 0.8 * kept_for_good, (pruned, kept_for_good)
    assert pruned <= 1.2 * live_only, (pruned, live_only)
