"""One fold from deltas to a write plan, for every backend, whatever the arrival order.

The driver's path (:meth:`Store.plan`, SQLite and Cassandra's ``apply``) folds a
batch's deltas in the order the join emitted them; the Cassandra executor sink folds
the tweet side in stage one and the rest, one user a row, in stage two, in whatever
order Spark's shuffle delivers them. Both go through :func:`fold`, so a batch of every
delta kind folds to the same plan on either path, and for any permutation of a batch
the rows that carry precedence (follow edges, blocks and mutes, profiles and account
deletions, reads, horizons, offsets) fold to the same plan on either path.
"""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from views.delta import Delta, DeltaKind, unpack_longs
from views.sink import deltas_from_arrow, deltas_table
from views.stores.cassandra import statements as cql
from views.stores.cassandra.sink import (
    _TWEET_SIDE,
    TALLY,
    _user_plan,
    removed_deltas,
    routed,
)
from views.stores.contract import Store
from views.stores.plan import WritePlan

USERS = st.integers(1, 4)
TIMES = st.integers(1, 6)
TWEETS = st.integers(1, 9)

DELTAS = st.one_of(
    st.builds(lambda f, a, t, on: Delta.follows(a, on, [f, t]), USERS, USERS, TIMES,
              st.booleans()),
    st.builds(Delta.relation, USERS, USERS, st.sampled_from(["block", "mute"]),
              st.booleans(), TIMES),
    # One user's profiles at one time are one record (the reference keeps the last to
    # arrive of a tie, which a shuffle cannot tell).
    st.builds(lambda u, t: Delta.profile(u, t, f"h{t}", f"N{t}"), USERS, TIMES),
    st.builds(Delta.account_deleted, USERS, TIMES),
    st.builds(Delta.activity, USERS, TIMES),
    st.builds(lambda at, tweet, users: Delta.horizon((at, tweet), users), TIMES,
              st.integers(1, 9), st.lists(USERS, min_size=1, max_size=3)),
    st.builds(Delta.source_offset, st.sampled_from(["tweets", "follows"]), st.integers(0, 1),
              st.integers(0, 50), TIMES),
)


#: Every other kind, for the test that both paths fold a batch to one plan.
OTHER_KINDS = st.one_of(
    st.builds(lambda a, on, pairs: Delta.follows(a, on, [x for p in pairs for x in p]), USERS,
              st.booleans(), st.lists(st.tuples(USERS, TIMES), min_size=1, max_size=4)),
    st.builds(Delta.timeline_add, USERS, TWEETS, USERS, TIMES),
    st.builds(lambda t, a, at, users: Delta.fanout(t, a, at, users), TWEETS, USERS, TIMES,
              st.lists(USERS, min_size=1, max_size=3)),
    st.builds(lambda u, a, pairs: Delta.backfill(u, a, [x for p in pairs for x in p]), USERS,
              USERS, st.lists(st.tuples(TIMES, TWEETS), min_size=1, max_size=3)),
    st.builds(Delta.timeline_remove, USERS, TWEETS, USERS, TIMES),
    st.builds(lambda t, a, at, users: Delta.unfanout(t, a, at, users), TWEETS, USERS, TIMES,
              st.lists(USERS, min_size=1, max_size=3)),
    st.builds(lambda a, users: Delta.timeline_wipe(a, users), USERS,
              st.lists(USERS, min_size=1, max_size=3)),
    st.builds(lambda c, on, users: Delta.celebrity_edges(c, on, users), USERS, st.booleans(),
              st.lists(USERS, min_size=1, max_size=3)),
    st.builds(Delta.celebrity, USERS, st.booleans()),
    st.builds(Delta.tweet, TWEETS, USERS, TIMES, st.sampled_from(["a", "b"]), USERS),
    st.builds(Delta.tweet_deleted, TWEETS, USERS, TIMES),
    st.builds(lambda t, a, at, o, shown: Delta.repost(t, a, at, o, shown), TWEETS, USERS,
              TIMES, st.tuples(TIMES, TWEETS), st.booleans()),
    st.builds(Delta.dead_letter, st.just("tweets"), st.integers(0, 1), st.integers(0, 50),
              st.just("bad"), st.just(b"x")),
)
EVERY_KIND = st.one_of(DELTAS, OTHER_KINDS)


def _ranked(plan: WritePlan) -> tuple:
    return (plan.follows, plan.relations, plan.users, plan.deleted_users, plan.activity,
            plan.horizons, plan.offsets, plan.max_event_time)


#: Stage two's tasks: the plans below fold what all of them got, split as stage one splits.
ROUTES = [7, 3, 5]


def _executor_plan(deltas: list[Delta]) -> WritePlan:
    return _user_plan(routed(deltas_table(deltas), ROUTES))[0]


def _executor_stages(deltas: list[Delta]) -> tuple[WritePlan, WritePlan]:
    first, routed = _stage_one(deltas)
    return first, _user_plan(routed)[0]


def _stage_one(deltas: list[Delta]) -> tuple[WritePlan, pa.Table]:
    """Stage one's plan (the tweet side) and stage two's, as the tasks fold them.

    Stage one resolves its removes against nothing stored: every remove here has its
    time, and every tweet is the removing author's.
    """
    tweet_side = [d for d in deltas if d.kind in _TWEET_SIDE]
    first = Store.plan(tweet_side)
    removes = cql.removed_keys(first.removes, cql.tweet_times(first, {}), {})[0]
    rest = [*removed_deltas(removes), *(d for d in deltas if d.kind not in _TWEET_SIDE)]
    return first, routed(deltas_table(rest), ROUTES)


def _tweet_side(plan: WritePlan) -> tuple:
    return (plan.tweets, plan.reposts, sorted(plan.foreign_deletes), sorted(plan.dead),
            {(u, t, at) for u, t, at, _ in plan.removes})


def _user_side(plan: WritePlan) -> tuple:
    return (*_ranked(plan), sorted(plan.adds), plan.wipes, plan.celeb_edges, plan.celebs)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVERY_KIND, max_size=14))
def test_every_delta_kind_folds_to_one_plan_on_either_path(deltas):
    plan = Store.plan(deltas)
    first, second = _executor_stages(deltas)
    assert _tweet_side(first)[:4] == _tweet_side(plan)[:4]
    assert _tweet_side(second)[4] == _tweet_side(plan)[4]  # removes: stage two's rows
    assert _user_side(second) == _user_side(plan)
    assert not (first.adds or first.follows or second.tweets or second.reposts or second.dead)


def _users(d: Delta) -> list[int]:
    """The users whose rows a delta of stage two's writes (their task reads them first)."""
    longs = list(unpack_longs(d.raw or b""))
    if d.kind == DeltaKind.FOLLOW:
        return longs[0::2]
    if d.kind in (DeltaKind.FANOUT, DeltaKind.TL_WIPE, DeltaKind.CELEB_EDGE, DeltaKind.HORIZON):
        return longs
    return [d.author_id] if d.kind == DeltaKind.CELEB else [d.user_id]


@settings(max_examples=300, deadline=None)
@given(st.lists(EVERY_KIND, max_size=14))
def test_every_row_of_a_user_goes_to_one_task_of_stage_two(deltas):
    """A listing delta crosses the shuffle split by its users' tasks, nothing lost, none twice."""
    _, rows = _stage_one(deltas)
    tasks: dict[int, set[int]] = {}
    listed = []
    for d, route in zip(deltas_from_arrow(rows), rows.column("route").to_pylist(), strict=True):
        assert route in ROUTES
        if d.kind not in (DeltaKind.OFFSET, TALLY):
            for user in _users(d):
                tasks.setdefault(user, set()).add(route)
        if d.raw is not None and d.kind != DeltaKind.BACKFILL:
            listed += [(d.kind, d.tweet_id, d.author_id, u) for u in _users(d)]
    assert all(len(routes) == 1 for routes in tasks.values()), tasks
    whole = [(d.kind, d.tweet_id, d.author_id, u) for d in deltas
             if d.kind not in _TWEET_SIDE and d.raw is not None and d.kind != DeltaKind.BACKFILL
             for u in _users(d)]
    assert sorted(listed) == sorted(whole)


@settings(max_examples=300, deadline=None)
@given(st.lists(DELTAS, max_size=14), st.randoms(use_true_random=False))
def test_a_batch_folds_to_one_plan_in_any_order_on_either_path(deltas, rng):
    shuffled = list(deltas)
    rng.shuffle(shuffled)
    plan = _ranked(Store.plan(deltas))
    assert _ranked(Store.plan(shuffled)) == plan
    assert _ranked(_executor_plan(shuffled)) == plan


def test_the_newest_event_wins_and_an_un_op_a_tie():
    plan = Store.plan([Delta.follows(2, True, [1, 5]), Delta.follows(2, False, [1, 5]),
                       Delta.relation(1, 3, "block", True, 7),
                       Delta.relation(1, 3, "block", False, 4),
                       Delta.profile(4, 3, "new", "New"), Delta.profile(4, 2, "old", "Old"),
                       Delta.account_deleted(5, 8), Delta.account_deleted(5, 6)])
    assert not plan.follows[(1, 2)].active
    assert plan.relations[(1, 3, "block")].on
    assert plan.users[4].handle == "new"
    assert plan.deleted_users == {5: 8}
