"""The column-wise timeline adds equal the tuples they replaced (views.stores.adds)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from views.delta import TOP, Delta
from views.stores.adds import CHUNK, Adds, Kept, SortedAdds
from views.stores.contract import Store

ids = st.integers(min_value=0, max_value=2**62)
small = st.integers(min_value=0, max_value=6)  # collisions: equal users, times, tweets
adds = st.lists(st.tuples(small, small, st.one_of(small, ids), small), max_size=60)
horizons = st.one_of(st.just((-1, -1)), st.just(TOP), st.tuples(small, small))


@given(adds, st.dictionaries(small, horizons))
def test_the_kept_adds_are_the_sorted_filter_of_the_tuples(rows, given_horizons):
    ordered = SortedAdds(Adds(rows))  # one sort answers the users, then the kept adds
    assert ordered.users() == sorted({a[0] for a in rows})
    horizon = {user: given_horizons.get(user, (-1, -1)) for user in ordered.users()}
    kept = ordered.kept(horizon)
    expected = sorted(a for a in rows if (a[1], a[2]) > horizon[a[0]])
    assert _rows(kept) == expected
    assert len(kept) == len(expected)
    counts: dict[int, int] = {}
    for a in expected:
        counts[a[0]] = counts.get(a[0], 0) + 1
    assert list(kept.per_user()) == sorted(counts.items())


@given(st.lists(st.tuples(small, ids, ids, st.lists(ids, max_size=5)), max_size=20))
def test_a_plan_holds_the_adds_its_deltas_carry_in_arrival_order(tweets):
    deltas = []
    for author, created_at, tweet, users in tweets:
        deltas.append(Delta.fanout(tweet, author, created_at, users))
        deltas.append(Delta.timeline_add(author, tweet, author, created_at))
        deltas.append(Delta.backfill(author, author, [created_at, tweet, 1, 2]))
    plan = Store.plan(deltas)
    expected = []
    for author, created_at, tweet, users in tweets:
        expected += [(u, created_at, tweet, author) for u in users]
        expected.append((author, created_at, tweet, author))
        expected += [(author, created_at, tweet, author), (author, 1, 2, author)]
    assert list(plan.adds) == expected
    assert plan.adds == Adds(expected)
    assert len(plan.adds) == len(expected)
    assert SortedAdds(plan.adds).users() == sorted({a[0] for a in expected})


def test_rows_cross_chunk_boundaries_whole():
    rows = [(u % 7, u, u * 3, 1) for u in range(CHUNK + 5)]
    kept = SortedAdds(Adds(rows)).kept({u: (-1, -1) for u in range(7)})
    assert _rows(kept) == sorted(rows)


def test_no_adds_keep_nothing():
    kept = SortedAdds(Adds()).kept({})
    assert len(kept) == 0 and _rows(kept) == [] and list(kept.per_user()) == []


def _rows(kept: Kept) -> list[tuple[int, ...]]:
    """The kept adds as tuples, regrouped from :meth:`Kept.flat`'s flat lists."""
    return [tuple(chunk[i:i + 4]) for chunk in kept.flat() for i in range(0, len(chunk), 4)]
