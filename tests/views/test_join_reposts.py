"""The join's own rules for DESIGN §4b's records, checked on its deltas and its state.

What the served pages must equal is checked end to end against the reference in
``tests/views/test_timeline_4b.py``; these tests pin what the join itself emits: which of a
user's reposts of a tweet is shown (in any arrival order), how blocks, mutes and
account deletes become store rows, and that the state survives its codec.
"""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from ingest.events import (
    AccountDelete,
    Activity,
    Delete,
    Event,
    Follow,
    Post,
    Relation,
    Repost,
    Unrepost,
    UserUpsert,
)
from views.codec import decode_state, encode_state
from views.delta import Delta, DeltaKind, timeline_adds, timeline_removes
from views.join import AuthorState, Change, JoinConfig, apply_batch

BIG = 2**63 - 1
CONFIG = JoinConfig(cap=10, promote_at=100, demote_below=80)
REPOSTER = 7


def _run(batches: list[list[Event]], key: int = REPOSTER,
         state: AuthorState | None = None) -> tuple[AuthorState, list[Delta]]:
    """Apply ``batches`` to one key in turn; all deltas in order."""
    deltas: list[Delta] = []
    offset = itertools.count()
    for batch in batches:
        state, out = apply_batch(state, key, [Change.of(e, next(offset)) for e in batch],
                                 CONFIG)
        deltas += out
    assert state is not None
    return state, deltas


def _shown(deltas: list[Delta]) -> dict[int, bool]:
    """Repost id → shown, by the last REPOST delta for it."""
    return {d.tweet_id: bool(d.flag) for d in deltas if d.kind == DeltaKind.REPOST}


def _timeline(deltas: list[Delta]) -> set[tuple[int, int]]:
    """Net (user, entry) pairs the deltas leave in timelines."""
    rows: set[tuple[int, int]] = set()
    for d in deltas:
        for user, _, entry, _ in timeline_adds(d) if d.kind in (
                DeltaKind.TL_ADD, DeltaKind.FANOUT, DeltaKind.BACKFILL) else ():
            rows.add((user, entry))
        if d.kind in (DeltaKind.TL_DEL, DeltaKind.UNFANOUT):
            for user, entry, _, _ in timeline_removes(d):
                rows.discard((user, entry))
    return rows


FOLLOWERS = [Follow(1, REPOSTER, 0), Follow(2, REPOSTER, 0)]


def test_a_shown_repost_is_fanned_out_with_its_original():
    state, deltas = _run([FOLLOWERS, [Repost(500, REPOSTER, 40, 3, 5)]])
    [repost] = [d for d in deltas if d.kind == DeltaKind.REPOST]
    assert (repost.tweet_id, repost.author_id, repost.created_at, repost.flag) == (
        500, REPOSTER, 5, 1)
    assert (repost.original_id, repost.original_author) == (40, 3)
    assert _timeline(deltas) == {(1, 500), (2, 500)}
    assert state.shown == {40: 500} and 500 in state.tweets


def test_a_second_repost_is_a_no_op_while_the_first_stands_then_takes_over():
    first, second = Repost(500, REPOSTER, 40, 3, 5), Repost(501, REPOSTER, 40, 3, 6)
    _, deltas = _run([FOLLOWERS, [first], [second]])
    # The second is told to the store, hidden: its id is this reposter's claim.
    assert _shown(deltas) == {500: True, 501: False}
    _, deltas = _run([FOLLOWERS, [first], [second], [Unrepost(500, REPOSTER, 7)]])
    assert _shown(deltas) == {500: False, 501: True}
    assert _timeline(deltas) == {(1, 501), (2, 501)}


def test_a_late_earlier_repost_takes_over_from_the_one_shown():
    _, deltas = _run([FOLLOWERS, [Repost(501, REPOSTER, 40, 3, 6)],
                      [Repost(500, REPOSTER, 40, 3, 5)]])
    assert _shown(deltas) == {501: False, 500: True}
    assert _timeline(deltas) == {(1, 500), (2, 500)}


def test_an_unrepost_seen_before_its_repost_keeps_it_hidden():
    state, deltas = _run([FOLLOWERS, [Unrepost(500, REPOSTER, 9)],
                          [Repost(500, REPOSTER, 40, 3, 5)]])
    assert _shown(deltas) == {500: False}  # told to the store, hidden (a claim on 500)
    assert _timeline(deltas) == set() and state.shown == {}


def test_a_delete_naming_a_repost_undoes_it():
    _, deltas = _run([FOLLOWERS, [Repost(500, REPOSTER, 40, 3, 5)],
                      [Delete(500, REPOSTER, 8)]])
    assert _shown(deltas) == {500: False}
    assert _timeline(deltas) == set()


def test_a_new_follower_gets_shown_reposts_backfilled():
    _, deltas = _run([[Repost(500, REPOSTER, 40, 3, 5)], [Follow(4, REPOSTER, 9)]])
    assert _timeline(deltas) == {(4, 500)}


def test_arrival_order_does_not_change_what_is_shown():
    events: list[Event] = [Repost(500, REPOSTER, 40, 3, 5), Repost(501, REPOSTER, 40, 3, 6),
                           Repost(502, REPOSTER, 41, 3, 4), Unrepost(500, REPOSTER, 9),
                           Repost(503, REPOSTER, 40, 3, 2), Unrepost(503, REPOSTER, 3)]
    outcomes = set()
    for order in itertools.permutations(events):
        state, _ = _run([FOLLOWERS, *[[e] for e in order]])
        outcomes.add(tuple(sorted(state.shown.items())))
    assert outcomes == {((40, 501), (41, 502))}


def test_blocks_and_mutes_become_relation_rows_newest_wins_unblock_wins_ties():
    _, deltas = _run([[Relation(1, REPOSTER, 5, "block")],
                      [Relation(1, REPOSTER, 5, "block", active=False)],
                      [Relation(1, REPOSTER, 4, "block")],
                      [Relation(2, REPOSTER, 6, "mute")]])
    rows = [(d.user_id, d.author_id, d.text, d.flag) for d in deltas
            if d.kind == DeltaKind.RELATION]
    assert rows == [(1, REPOSTER, "block", 1), (1, REPOSTER, "block", 0),
                    (2, REPOSTER, "mute", 1)]


def test_an_account_delete_is_final_and_later_profiles_are_ignored():
    _, deltas = _run([[UserUpsert(REPOSTER, "h", "n", 1)], [AccountDelete(REPOSTER, 5)],
                      [UserUpsert(REPOSTER, "h2", "n2", 9)], [AccountDelete(REPOSTER, 7)]])
    users = [(d.created_at, d.flag, d.text) for d in deltas if d.kind == DeltaKind.USER]
    assert users == [(1, 0, "h"), (5, 1, None)]


def test_a_reply_carries_the_user_it_answers():
    _, deltas = _run([FOLLOWERS, [Post(600, REPOSTER, 5, "hi", in_reply_to_user_id=3)]])
    [tweet] = [d for d in deltas if d.kind == DeltaKind.TWEET]
    assert tweet.reply_to == 3
    assert _timeline(deltas) == {(1, 600), (2, 600)}  # filtered at read time, not here


def test_reads_become_one_activity_row_per_batch_with_the_newest_time():
    _, deltas = _run([[Activity(REPOSTER, 9), Activity(REPOSTER, 12), Activity(REPOSTER, 3)],
                      [Activity(REPOSTER, 5)]])
    rows = [(d.user_id, d.created_at) for d in deltas if d.kind == DeltaKind.ACTIVITY]
    assert rows == [(REPOSTER, 12), (REPOSTER, 5)]  # the store keeps the newest


IDS = st.integers(1, BIG)
TIMES = st.integers(0, 2**62)


@given(st.builds(
    AuthorState,
    followers=st.dictionaries(IDS, st.tuples(TIMES, st.booleans()), max_size=5),
    tweets=st.dictionaries(IDS, TIMES, max_size=5),
    tombstones=st.dictionaries(IDS, TIMES, max_size=5),
    evicted=st.tuples(st.integers(-1, 2**62), st.integers(-1, BIG)),
    celebrity=st.booleans(), profile_at=st.integers(-1, 2**62),
    reposts=st.dictionaries(IDS, st.tuples(TIMES, IDS, IDS), max_size=6),
    undone=st.dictionaries(IDS, TIMES, max_size=4),
    relations=st.dictionaries(st.tuples(IDS, st.sampled_from(["block", "mute"])),
                              st.tuples(TIMES, st.booleans()), max_size=5),
    deleted=st.booleans(),
    marks=st.lists(st.integers(-(2**63), 2**62), min_size=2, max_size=2)))
def test_state_with_reposts_relations_and_deletes_round_trips(state):
    # ``shown`` is derived from the reposts (as the join settles it), not stored.
    best: dict[int, tuple[int, int]] = {}
    for rid, (at, original, _) in state.reposts.items():
        if rid not in state.undone and rid not in state.tombstones:
            best[original] = min(best.get(original, (at, rid)), (at, rid))
    state.shown = {original: rid for original, (_, rid) in best.items()}
    assert decode_state(encode_state(state)) == state
