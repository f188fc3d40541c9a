"""The state codec: every field survives it, and its bytes are the checkpoint's layout.

The layout is what a running job's checkpoint holds, so a faster encoder must write
the same bytes as the one before it, and read what that one wrote: the golden value
below was written by the encoder of ``00bf083``. (The join's own tests used to hold
the round trips; they live here now, over states with every field set.)
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from views.codec import decode_bucket, decode_state, encode_bucket, encode_state
from views.join import AuthorState, live_reposts

BIG = 2**63 - 1
IDS = st.integers(1, BIG)
TIMES = st.integers(0, 2**62)

#: A state with every field set, as the encoder of 00bf083 wrote it.
GOLDEN_STATE = AuthorState(
    followers={5: (10, True), 7: (11, False), 3: (12, True)}, tweets={100: 50, 101: 51},
    tombstones={99}, evicted=(40, 98), celebrity=False, profile_at=7,
    reposts={200: (60, 1000, 9), 201: (61, 1001, 8)}, undone={201}, shown={1000: 200},
    relations={(5, "block"): (70, True), (6, "mute"): (71, False)}, deleted=True)
GOLDEN = bytes.fromhex(
    "020001070000000000000028000000000000006200000000000000030000000200000001000000020000"
    "0001000000020000000500000000000000070000000000000003000000000000000a000000000000000b"
    "000000000000000c00000000000000010001640000000000000065000000000000003200000000000000"
    "330000000000000063000000000000003c000000000000003d00000000000000e803000000000000e903"
    "00000000000009000000000000000800000000000000c800000000000000c900000000000000c9000000"
    "00000000050000000000000006000000000000000001460000000000000047000000000000000100")


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
    undone = draw(st.sets(IDS, max_size=4) | st.sets(st.sampled_from(sorted(reposts) or [1])))
    tombstones = draw(st.sets(IDS))
    return AuthorState(
        followers=draw(st.dictionaries(IDS, st.tuples(TIMES, st.booleans()))),
        tweets=draw(st.dictionaries(IDS, TIMES)),
        tombstones=tombstones,
        evicted=draw(st.tuples(st.integers(-1, 2**62), st.integers(-1, BIG))),
        celebrity=draw(st.booleans()), profile_at=draw(st.integers(-1, 2**62)),
        reposts=reposts, undone=undone, shown=live_reposts(reposts, undone | tombstones),
        relations=draw(st.dictionaries(st.tuples(IDS, st.sampled_from(["block", "mute"])),
                                       st.tuples(TIMES, st.booleans()), max_size=5)),
        deleted=draw(st.booleans()))


@given(states())
def test_every_field_round_trips(state):
    blob = encode_state(state)
    decoded = decode_state(blob)
    assert decoded == state
    assert decoded.follower_count() == sum(on for _, on in state.followers.values())
    # Sets re-encode in their own order, so compare what the bytes mean.
    assert decode_state(encode_state(decoded)) == state


@given(st.dictionaries(IDS, st.binary(max_size=64)))
def test_a_bucket_round_trips(states):
    assert decode_bucket(encode_bucket(states)) == states


def test_another_layout_is_refused():
    try:
        decode_state(b"\x01" + GOLDEN[1:])
    except ValueError as exc:
        assert "fresh checkpoint" in str(exc)
    else:
        raise AssertionError("a state of another layout version was decoded")
