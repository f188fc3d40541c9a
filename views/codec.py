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
from operator import itemgetter

from views.join import AuthorState, live_reposts

VERSION = 2
_HEAD = struct.Struct("<BBBqqqIIIIII")
_RELATION_CODES = {"block": 0, "mute": 1}
_RELATION_NAMES = ("block", "mute")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def encode_state(state: AuthorState) -> bytes:
    """One author's state as bytes.

    Most states a batch touches are small (a few followers, no reposts or relations),
    so the cost to beat is per array, not per element: empty arrays are skipped
    (they encode to nothing), and columns are read with ``map(itemgetter)``.
    """
    followers, tweets = state.followers, state.tweets
    reposts, relations = state.reposts, state.relations
    nf, nt, nd, nr, nu, nl = (len(followers), len(tweets), len(state.tombstones),
                              len(reposts), len(state.undone), len(relations))
    parts = [_HEAD.pack(VERSION, state.celebrity, state.deleted, state.profile_at,
                        state.evicted[0], state.evicted[1], nf, nt, nd, nr, nu, nl)]
    if nf:
        edges = followers.values()
        parts += (array("q", followers).tobytes(), array("q", map(_FIRST, edges)).tobytes(),
                  bytes(map(_SECOND, edges)))
    if nt:
        parts += (array("q", tweets).tobytes(), array("q", tweets.values()).tobytes())
    if nd:
        parts.append(array("q", state.tombstones).tobytes())
    if nr:
        seen = reposts.values()
        parts += (*(array("q", map(itemgetter(i), seen)).tobytes() for i in range(3)),
                  array("q", reposts).tobytes())
    if nu:
        parts.append(array("q", state.undone).tobytes())
    if nl:
        slots, marks = relations.keys(), relations.values()
        parts += (array("q", map(_FIRST, slots)).tobytes(),
                  bytes(_RELATION_CODES[kind] for _, kind in slots),
                  array("q", map(_FIRST, marks)).tobytes(), bytes(map(_SECOND, marks)))
    return b"".join(parts)


def decode_state(blob: bytes) -> AuthorState:
    """Inverse of :func:`encode_state`; refuses other layout versions."""
    if blob[0] != VERSION:
        msg = f"state version {blob[0]} is not {VERSION}: use a fresh checkpoint"
        raise ValueError(msg)
    (_, celeb, deleted, profile_at, ev_at, ev_id, nf, nt, nd, nr, nu,
     nl) = _HEAD.unpack_from(blob)
    pos = _HEAD.size
    followers: dict[int, tuple[int, bool]] = {}
    if nf:
        f_ids, pos = _longs(blob, pos, nf)
        f_at, pos = _longs(blob, pos, nf)
        f_on, pos = blob[pos:pos + nf], pos + nf
        followers = dict(zip(f_ids, zip(f_at, map(bool, f_on), strict=True), strict=True))
        active = f_on.count(1)
    else:
        active = 0
    tweets: dict[int, int] = {}
    if nt:
        t_ids, pos = _longs(blob, pos, nt)
        t_at, pos = _longs(blob, pos, nt)
        tweets = dict(zip(t_ids, t_at, strict=True))
    dead: set[int] = set()
    if nd:
        dead_ids, pos = _longs(blob, pos, nd)
        dead = set(dead_ids)
    reposts: dict[int, tuple[int, int, int]] = {}
    if nr:
        r_at, pos = _longs(blob, pos, nr)
        r_orig, pos = _longs(blob, pos, nr)
        r_author, pos = _longs(blob, pos, nr)
        r_ids, pos = _longs(blob, pos, nr)
        reposts = dict(zip(r_ids, zip(r_at, r_orig, r_author, strict=True), strict=True))
    undone: set[int] = set()
    if nu:
        undone_ids, pos = _longs(blob, pos, nu)
        undone = set(undone_ids)
    relations: dict[tuple[int, str], tuple[int, bool]] = {}
    if nl:
        l_users, pos = _longs(blob, pos, nl)
        l_kinds, pos = blob[pos:pos + nl], pos + nl
        l_at, pos = _longs(blob, pos, nl)
        l_on = blob[pos:pos + nl]
        relations = {(u, _RELATION_NAMES[k]): (at, bool(on))
                     for u, k, at, on in zip(l_users, l_kinds, l_at, l_on, strict=True)}
    return AuthorState(
        followers=followers,
        tweets=tweets,
        tombstones=dead,
        evicted=(ev_at, ev_id),
        celebrity=bool(celeb),
        profile_at=profile_at,
        reposts=reposts,
        undone=undone,
        shown=live_reposts(reposts, undone | dead) if reposts else {},
        relations=relations,
        deleted=bool(deleted),
        active=active,
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
