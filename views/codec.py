"""Binary encoding of :class:`~views.join.AuthorState` for Spark's state store.

The whole per-author state is one value (one state read and one write per key and
batch) because each state call crosses from the Python worker to the JVM and costs
~120–260 µs (DESIGN §10), far more than decoding a few arrays. Layout, little
endian, versioned by the first byte (bump :data:`VERSION` and the checkpoint path
together when it changes):

``B version | B celebrity | B deleted | q profile_at | q evicted_at | q evicted_id |
I followers | I tweets | I tombstones | I reposts | I undone | I relations`` then the
arrays: follower ids, follower edge times, follower active flags (bytes), kept tweet
ids, their times, tombstones; repost ids, their times, originals, original authors,
undone ids; relation users, their kinds (bytes: 0 block, 1 mute), times, on flags
(bytes). The shown repost per original is derived from the reposts on decode.
"""

from __future__ import annotations

import struct
from array import array

from views.join import AuthorState, live_reposts

VERSION = 2
_HEAD = struct.Struct("<BBBqqqIIIIII")
_RELATION_CODES = {"block": 0, "mute": 1}
_RELATION_NAMES = ("block", "mute")


def encode_state(state: AuthorState) -> bytes:
    """One author's state as bytes."""
    followers = state.followers
    reposts, relations = state.reposts, state.relations
    head = _HEAD.pack(VERSION, state.celebrity, state.deleted, state.profile_at,
                      state.evicted[0], state.evicted[1], len(followers), len(state.tweets),
                      len(state.tombstones), len(reposts), len(state.undone), len(relations))
    return b"".join((
        head,
        array("q", followers.keys()).tobytes(),
        array("q", (c for c, _ in followers.values())).tobytes(),
        bytes(a for _, a in followers.values()),
        array("q", state.tweets.keys()).tobytes(),
        array("q", state.tweets.values()).tobytes(),
        array("q", state.tombstones).tobytes(),
        *(array("q", (r[i] for r in reposts.values())).tobytes() for i in range(3)),
        array("q", reposts.keys()).tobytes(),
        array("q", state.undone).tobytes(),
        array("q", (u for u, _ in relations)).tobytes(),
        bytes(_RELATION_CODES[kind] for _, kind in relations),
        array("q", (at for at, _ in relations.values())).tobytes(),
        bytes(on for _, on in relations.values()),
    ))


def decode_state(blob: bytes) -> AuthorState:
    """Inverse of :func:`encode_state`; refuses other layout versions."""
    if blob[0] != VERSION:
        msg = f"state version {blob[0]} is not {VERSION}: use a fresh checkpoint"
        raise ValueError(msg)
    (_, celeb, deleted, profile_at, ev_at, ev_id, nf, nt, nd, nr, nu,
     nl) = _HEAD.unpack_from(blob)
    pos = _HEAD.size
    f_ids, pos = _longs(blob, pos, nf)
    f_at, pos = _longs(blob, pos, nf)
    f_on, pos = blob[pos:pos + nf], pos + nf
    t_ids, pos = _longs(blob, pos, nt)
    t_at, pos = _longs(blob, pos, nt)
    dead, pos = _longs(blob, pos, nd)
    r_at, pos = _longs(blob, pos, nr)
    r_orig, pos = _longs(blob, pos, nr)
    r_author, pos = _longs(blob, pos, nr)
    r_ids, pos = _longs(blob, pos, nr)
    undone, pos = _longs(blob, pos, nu)
    l_users, pos = _longs(blob, pos, nl)
    l_kinds, pos = blob[pos:pos + nl], pos + nl
    l_at, pos = _longs(blob, pos, nl)
    l_on = blob[pos:pos + nl]
    reposts = dict(zip(r_ids, zip(r_at, r_orig, r_author, strict=True), strict=True))
    undone_set = set(undone)
    return AuthorState(
        followers=dict(zip(f_ids, zip(f_at, map(bool, f_on), strict=True), strict=True)),
        tweets=dict(zip(t_ids, t_at, strict=True)),
        tombstones=set(dead),
        evicted=(ev_at, ev_id),
        celebrity=bool(celeb),
        profile_at=profile_at,
        reposts=reposts,
        undone=undone_set,
        shown=live_reposts(reposts, undone_set | set(dead)),
        relations={(u, _RELATION_NAMES[k]): (at, bool(on))
                   for u, k, at, on in zip(l_users, l_kinds, l_at, l_on, strict=True)},
        deleted=bool(deleted),
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
