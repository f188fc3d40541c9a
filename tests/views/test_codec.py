"""The state codec: every field survives it, its bytes are the checkpoint's layout, and
the pages of a bucket split without losing or misplacing an author.

The layout is what a running job's checkpoint holds, so a faster encoder must write
the same bytes as the one before it, and read what that one wrote: the golden value
below is state version 3 (tombstone and undo times, the lateness marks) as its first
encoder wrote it. (The join's own tests used to hold the round trips; they live here
now, over states with every field set.)
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from views.codec import (
    Layout,
    decode_page,
    decode_state,
    encode_page,
    encode_state,
    page_hash,
    page_size,
)
from views.join import AuthorState, live_reposts

BIG = 2**63 - 1
IDS = st.integers(1, BIG)
TIMES = st.integers(0, 2**62)

#: A state with every field set, as the first encoder of state version 3 wrote it.
GOLDEN_STATE = AuthorState(
    followers={5: (10, True), 7: (11, False), 3: (12, True)}, tweets={100: 50, 101: 51},
    tombstones={99: 45}, evicted=(40, 98), celebrity=False, profile_at=7,
    reposts={200: (60, 1000, 9), 201: (61, 1001, 8)}, undone={201: 62}, shown={1000: 200},
    relations={(5, "block"): (70, True), (6, "mute"): (71, False)}, deleted=True,
    marks=[-(2**63), 71])
GOLDEN = bytes.fromhex(
    "030001070000000000000028000000000000006200000000000000000000000000008047000000000000"
    "000300000002000000010000000200000001000000020000000500000000000000070000000000000003"
    "000000000000000a000000000000000b000000000000000c000000000000000100016400000000000000"
    "65000000000000003200000000000000330000000000000063000000000000002d000000000000003c00"
    "0000000000003d00000000000000e803000000000000e903000000000000090000000000000008000000"
    "00000000c800000000000000c900000000000000c9000000000000003e00000000000000050000000000"
    "000006000000000000000001460000000000000047000000000000000100")


def test_the_layout_is_the_checkpoints():
    assert encode_state(GOLDEN_STATE) == GOLDEN
    decoded = decode_state(GOLDEN)
    assert decoded == GOLDEN_STATE
    assert decoded.follower_count() == 2


def test_an_empty_state_round_trips():
    state = AuthorState()
    assert decode_state(encode_state(state)) == state
    assert decode_state(encode_state(state)).follower_count() == 0


@st.composite
def states(draw) -> AuthorState:
    reposts = draw(st.dictionaries(IDS, st.tuples(TIMES, IDS, IDS), max_size=6))
    undone_ids = draw(st.sets(IDS, max_size=4)
                      | st.sets(st.sampled_from(sorted(reposts) or [1])))
    undone = {rid: draw(TIMES) for rid in undone_ids}
    tombstones = draw(st.dictionaries(IDS, TIMES))
    return AuthorState(
        followers=draw(st.dictionaries(IDS, st.tuples(TIMES, st.booleans()))),
        tweets=draw(st.dictionaries(IDS, TIMES)),
        tombstones=tombstones,
        evicted=draw(st.tuples(st.integers(-1, 2**62), st.integers(-1, BIG))),
        celebrity=draw(st.booleans()), profile_at=draw(st.integers(-1, 2**62)),
        reposts=reposts, undone=undone,
        shown=live_reposts(reposts, undone.keys() | tombstones.keys()),
        relations=draw(st.dictionaries(st.tuples(IDS, st.sampled_from(["block", "mute"])),
                                       st.tuples(TIMES, st.booleans()), max_size=5)),
        deleted=draw(st.booleans()),
        marks=[draw(st.integers(-(2**63), 2**62)), draw(st.integers(-(2**63), 2**62))])


@given(states())
def test_every_field_round_trips(state):
    blob = encode_state(state)
    decoded = decode_state(blob)
    assert decoded == state
    assert decoded.follower_count() == sum(on for _, on in state.followers.values())
    # Sets re-encode in their own order, so compare what the bytes mean.
    assert decode_state(encode_state(decoded)) == state


@given(st.dictionaries(IDS, st.binary(max_size=64)))
def test_a_page_round_trips(states):
    blob = encode_page(states)
    assert decode_page(blob) == states
    assert page_size(states) == len(blob)


@st.composite
def layouts(draw) -> Layout:
    level = draw(st.integers(0, 12))
    return Layout(level, draw(st.integers(0, (1 << level) - 1)), draw(st.integers(0, 2**40)))


@given(layouts(), st.lists(IDS, max_size=200))
def test_a_split_moves_only_the_split_pages_authors_and_only_to_the_new_page(layout, authors):
    page, new, after = layout.split_next()
    assert (new, after.pages) == (layout.pages, layout.pages + 1)
    assert after.size == layout.size + page_size({})  # the new page's header
    for author in authors:
        was, now = layout.page_of(author), after.page_of(author)
        assert 0 <= was < layout.pages and 0 <= now < after.pages
        assert now == was or (was == page and now == new)
    assert sorted(a for group in after.by_page(authors).values() for a in group) == sorted(authors)


def test_splitting_on_walks_every_page_then_doubles():
    layout, seen = Layout(), []
    for _ in range(7):
        page, new, layout = layout.split_next()
        seen.append((page, new))
    assert seen == [(0, 1), (0, 2), (1, 3), (0, 4), (1, 5), (2, 6), (3, 7)]
    assert (layout.level, layout.split, layout.pages) == (3, 0, 8)


def test_the_authors_of_one_bucket_spread_evenly_over_its_pages():
    # Spark's bucket is a hash modulo the bucket count: a bucket's authors share it,
    # and sequential ids are the common case. Pages must spread them all the same.
    layout = Layout(6, 0)
    authors = range(5, 64 * 64 * 200, 64)  # one bucket of 64 by id, 200 a page
    counts = Counter(map(layout.page_of, authors))
    assert len(counts) == 64
    assert 150 < min(counts.values()) and max(counts.values()) < 250
    assert len({page_hash(a) for a in authors}) == len(authors)


def test_a_layout_is_full_past_its_page_bytes_on_average():
    assert not Layout(1, 1, 3 * 100).full(100)
    assert Layout(1, 1, 3 * 100 + 1).full(100)


def test_another_layout_is_refused():
    for decode, blob in ((decode_state, GOLDEN), (decode_page, encode_page({1: GOLDEN}))):
        try:
            decode(b"\x01" + blob[1:])
        except ValueError as exc:
            assert "fresh checkpoint" in str(exc)
        else:
            raise AssertionError("a value of another layout version was decoded")
