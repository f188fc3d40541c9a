"""One fold from deltas to a write plan, for every backend, whatever the arrival order.

The driver's path (:meth:`Store.plan`, SQLite and Cassandra's ``apply``) folds a
batch's deltas in the order the join emitted them; the Cassandra executor sink's stage
two gets the same rows in whatever order Spark's shuffle delivers them. Both go
through :class:`WritePlan`'s row folds, so for any permutation of a batch the rows
that carry precedence (follow edges, blocks and mutes, profiles and account
deletions, reads, horizons, offsets) fold to the same plan on either path.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from views.delta import Delta
from views.stores.cassandra.sink import _Routed, _unpack, _user_plan
from views.stores.contract import Store
from views.stores.plan import WritePlan

USERS = st.integers(1, 4)
TIMES = st.integers(1, 6)

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


def _ranked(plan: WritePlan) -> tuple:
    return (plan.follows, plan.relations, plan.users, plan.deleted_users, plan.activity,
            plan.horizons, plan.offsets, plan.max_event_time)


def _executor_plan(deltas: list[Delta]) -> WritePlan:
    routed = _Routed()
    for d in deltas:
        _unpack(d, routed)
    return _user_plan(routed.table())[0]


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
