"""Binary encoding of :class:`~views.join.AuthorState` for Spark's state store.

The whole per-author state is one value (one state read and one write per key and
batch) because each state call crosses from the Python worker to the JVM and costs
~120–260 µs (DESIGN §10), far more than decoding a few arrays. Layout, little
endian, versioned by the first byte (bump :data:`VERSION` and the checkpoint path
together when it changes):

``B version | B celebrity | q profile_at | q evicted_at | q evicted_id |
I followers | I tweets | I tombstones`` then the arrays: follower ids, follower
edge times, follower active flags (bytes), kept tweet ids, their times, tombstones.
"""

from __future__ import annotations

import struct
from array import array

from views.join import AuthorState

VERSION = 1
_HEAD = struct.Struct("<BBqqqIII")


def encode_state(state: AuthorState) -> bytes:
    """One author's state as bytes."""
    followers = state.followers
    head = _HEAD.pack(VERSION, state.celebrity, state.profile_at, state.evicted[0],
                      state.evicted[1], len(followers), len(state.tweets),
                      len(state.tombstones))
    return b"".join((
        head,
        array("q", followers.keys()).tobytes(),
        array("q", (c for c, _ in followers.values())).tobytes(),
        bytes(a for _, a in followers.values()),
        array("q", state.tweets.keys()).tobytes(),
        array("q", state.tweets.values()).tobytes(),
        array("q", state.tombstones).tobytes(),
    ))


def decode_state(blob: bytes) -> AuthorState:
    """Inverse of :func:`encode_state`; refuses other layout versions."""
    version, celeb, profile_at, ev_at, ev_id, nf, nt, nd = _HEAD.unpack_from(blob)
    if version != VERSION:
        msg = f"state version {version} is not {VERSION}: use a fresh checkpoint"
        raise ValueError(msg)
    pos = _HEAD.size
    f_ids, pos = _longs(blob, pos, nf)
    f_at, pos = _longs(blob, pos, nf)
    f_on, pos = blob[pos:pos + nf], pos + nf
    t_ids, pos = _longs(blob, pos, nt)
    t_at, pos = _longs(blob, pos, nt)
    dead, pos = _longs(blob, pos, nd)
    return AuthorState(
        followers=dict(zip(f_ids, zip(f_at, map(bool, f_on), strict=True), strict=True)),
        tweets=dict(zip(t_ids, t_at, strict=True)),
        tombstones=set(dead),
        evicted=(ev_at, ev_id),
        celebrity=bool(celeb),
        profile_at=profile_at,
        active=f_on.count(1),
    )


def _longs(blob: bytes, pos: int, count: int) -> tuple[array, int]:
    out = array("q")
    end = pos + 8 * count
    out.frombytes(blob[pos:end])
    return out, end


_BUCKET_HEAD = struct.Struct("<BI")


def encode_bucket(states: dict[int, bytes]) -> bytes:
    """Encoded author states of one key bucket: ``B version | I n | q keys | I sizes | blobs``.

    The job groups authors into hash buckets so that Spark calls the processor once
    per bucket rather than once per author (that per-call cost dominated, DESIGN §10);
    only the authors a batch touches are decoded and re-encoded.
    """
    keys = array("q", states.keys())
    sizes = array("I", map(len, states.values()))
    return b"".join((_BUCKET_HEAD.pack(VERSION, len(keys)), keys.tobytes(), sizes.tobytes(),
                     *states.values()))


def decode_bucket(blob: bytes) -> dict[int, bytes]:
    """Inverse of :func:`encode_bucket` (author states stay encoded)."""
    version, count = _BUCKET_HEAD.unpack_from(blob)
    if version != VERSION:
        msg = f"state version {version} is not {VERSION}: use a fresh checkpoint"
        raise ValueError(msg)
    keys, pos = _longs(blob, _BUCKET_HEAD.size, count)
    sizes = array("I")
    sizes.frombytes(blob[pos:pos + 4 * count])
    pos += 4 * count
    out: dict[int, bytes] = {}
    view = memoryview(blob)
    for key, size in zip(keys, sizes, strict=True):
        out[key] = bytes(view[pos:pos + size])
        pos += size
    return out
