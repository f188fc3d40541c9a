"""Binary encoding of the join's state for Spark's state store, and its layout there.

**An author's state** (:class:`~views.join.AuthorState`) is one value. Layout, little
endian, versioned by the first byte (bump :data:`VERSION` and :data:`LAYOUT`
together when it changes):

``B version | B celebrity | B deleted | q profile_at | q evicted_at | q evicted_id |
q follows mark | q tweets mark | I followers | I tweets | I tombstones | I reposts |
I undone | I relations`` then the arrays: follower ids, follower edge times, follower
active flags (bytes), kept tweet ids, their times, tombstone ids, their times; repost
times, originals, original authors, ids, undone ids, their times; relation users,
their kinds (bytes: 0 block, 1 mute), times, on flags (bytes). The shown repost per
original is derived from the reposts on decode.

**Pages.** Spark calls the processor once per key bucket of authors (its fixed cost
per call dominated a call per author, DESIGN §10), and each state call crosses from
the Python worker to the JVM (~120–260 µs), far more than decoding a few arrays. So
authors' states are not one state entry each: a bucket keeps them in *pages*
(:func:`encode_page`), entries of a map state, and a :class:`Layout` that says which
page holds an author. A batch reads and writes only the pages of the authors it
touches, and pages split as the bucket grows, so they stay about
:data:`DEFAULT_PAGE_BYTES` whatever the total state: a batch's cost follows what it
touches, not what the job holds (DESIGN §5).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import Final

from ingest.events import RELATIONS
from views.join import AuthorState, live_reposts

VERSION: Final = 3
#: How the state sits in Spark's state store (the state variables, :class:`Layout`,
#: the page and author formats); the checkpoint path carries it.
LAYOUT: Final = 4
#: Bytes a page holds on average before the bucket splits one more page. Each page a
#: batch touches costs two state calls (~0.25–0.5 ms) and its bytes read and written
#: (~35 ns a byte, docs/capacity.md V9): at 16 KiB a steady batch spends about as much
#: on either, and a bulk batch, which writes nearly every page, one call a page more
#: than it would with fewer, larger pages (``benchmarks/bench_codec.py --state-users``).
DEFAULT_PAGE_BYTES: Final = 16_384
_HEAD = struct.Struct("<BBBqqqqqIIIIII")
#: A relation's byte in the state: its place in the contract's list (append only).
_RELATION_NAMES: Final = RELATIONS
_RELATION_CODES: Final = {relation: code for code, relation in enumerate(RELATIONS)}
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
    late_marks = state.marks
    parts = [_HEAD.pack(VERSION, state.celebrity, state.deleted, state.profile_at,
                        state.evicted[0], state.evicted[1], late_marks[0], late_marks[1],
                        nf, nt, nd, nr, nu, nl)]
    if nf:
        edges = followers.values()
        parts += (array("q", followers).tobytes(), array("q", map(_FIRST, edges)).tobytes(),
                  bytes(map(_SECOND, edges)))
    if nt:
        parts += (array("q", tweets).tobytes(), array("q", tweets.values()).tobytes())
    if nd:
        parts += (array("q", state.tombstones).tobytes(),
                  array("q", state.tombstones.values()).tobytes())
    if nr:
        seen = reposts.values()
        parts += (*(array("q", map(itemgetter(i), seen)).tobytes() for i in range(3)),
                  array("q", reposts).tobytes())
    if nu:
        parts += (array("q", state.undone).tobytes(),
                  array("q", state.undone.values()).tobytes())
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
    (_, celeb, deleted, profile_at, ev_at, ev_id, mark_follows, mark_tweets, nf, nt, nd, nr,
     nu, nl) = _HEAD.unpack_from(blob)
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
    dead: dict[int, int] = {}
    if nd:
        dead_ids, pos = _longs(blob, pos, nd)
        dead_at, pos = _longs(blob, pos, nd)
        dead = dict(zip(dead_ids, dead_at, strict=True))
    reposts: dict[int, tuple[int, int, int]] = {}
    if nr:
        r_at, pos = _longs(blob, pos, nr)
        r_orig, pos = _longs(blob, pos, nr)
        r_author, pos = _longs(blob, pos, nr)
        r_ids, pos = _longs(blob, pos, nr)
        reposts = dict(zip(r_ids, zip(r_at, r_orig, r_author, strict=True), strict=True))
    undone: dict[int, int] = {}
    if nu:
        undone_ids, pos = _longs(blob, pos, nu)
        undone_at, pos = _longs(blob, pos, nu)
        undone = dict(zip(undone_ids, undone_at, strict=True))
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
        shown=live_reposts(reposts, undone.keys() | dead.keys()) if reposts else {},
        relations=relations,
        deleted=bool(deleted),
        marks=[mark_follows, mark_tweets],
        active=active,
    )


def _longs(blob: bytes, pos: int, count: int) -> tuple[array, int]:
    out = array("q")
    end = pos + 8 * count
    out.frombytes(blob[pos:end])
    return out, end


_PAGE_HEAD = struct.Struct("<BI")
_MASK = (1 << 64) - 1


def encode_page(states: dict[int, bytes]) -> bytes:
    """Encoded author states of one page: ``B version | I n | q authors | I sizes | states``."""
    keys = array("q", states.keys())
    sizes = array("I", map(len, states.values()))
    return b"".join((_PAGE_HEAD.pack(VERSION, len(keys)), keys.tobytes(), sizes.tobytes(),
                     *states.values()))


def page_size(states: dict[int, bytes]) -> int:
    """``len(encode_page(states))``, without encoding."""
    return _PAGE_HEAD.size + 12 * len(states) + sum(map(len, states.values()))


def decode_page(blob: bytes) -> dict[int, bytes]:
    """Inverse of :func:`encode_page` (author states stay encoded)."""
    version, count = _PAGE_HEAD.unpack_from(blob)
    if version != VERSION:
        msg = f"state version {version} is not {VERSION}: use a fresh checkpoint"
        raise ValueError(msg)
    keys, pos = _longs(blob, _PAGE_HEAD.size, count)
    sizes = array("I")
    sizes.frombytes(blob[pos:pos + 4 * count])
    pos += 4 * count
    out: dict[int, bytes] = {}
    view = memoryview(blob)
    for key, size in zip(keys, sizes, strict=True):
        out[key] = bytes(view[pos:pos + size])
        pos += size
    return out


def page_hash(author: int) -> int:
    """64 well-mixed bits of an author id (splitmix64's finalizer).

    Not Spark's ``xxhash64``, which picked the author's bucket: every author of a
    bucket shares that hash modulo the bucket count, so its low bits cannot tell the
    bucket's pages apart.
    """
    z = (author + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


@dataclass(frozen=True, slots=True)
class Layout:
    """Which page of its key bucket holds an author: linear hashing (Litwin, 1980).

    A bucket has ``2**level + split`` pages. Page ``p`` holds the authors whose
    :func:`page_hash` is ``p`` modulo ``2**level``, or modulo ``2**(level + 1)`` when
    ``p < split`` (the pages split already in this round). One page splits, in
    order, whenever the bucket's ``size`` (the bytes of all its pages) passes
    ``page_bytes`` a page on average, so pages stay near that size however much the
    bucket holds, and the whole directory is these three numbers. Pages never merge:
    state shrinks (tombstones, undos and dead edges past the lateness bound, evicted
    tweets), the size with it, and the pages only hold less.
    """

    level: int = 0
    split: int = 0
    size: int = 0

    @property
    def pages(self) -> int:
        return (1 << self.level) + self.split

    def page_of(self, author: int) -> int:
        hashed = page_hash(author)
        page = hashed & ((1 << self.level) - 1)
        return page if page >= self.split else hashed & ((2 << self.level) - 1)

    def by_page(self, authors: Iterable[int]) -> dict[int, list[int]]:
        """``authors`` grouped by the page that holds them."""
        out: dict[int, list[int]] = {}
        for author in authors:
            out.setdefault(self.page_of(author), []).append(author)
        return out

    def full(self, page_bytes: int) -> bool:
        """Whether the pages hold more than ``page_bytes`` each on average."""
        return self.size > page_bytes * self.pages

    def grown(self, by: int) -> Layout:
        return Layout(self.level, self.split, self.size + by)

    def split_next(self) -> tuple[int, int, Layout]:
        """The page to split, the new page it gives authors to, and the layout after.

        The new page is always the next page number; it adds one page header.
        """
        page, new = self.split, self.pages
        last = page + 1 == 1 << self.level
        return page, new, Layout(self.level + last, 0 if last else page + 1,
                                 self.size + _PAGE_HEAD.size)
