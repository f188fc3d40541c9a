"""Signed changes to the materialized tables, and the sortable timeline key.

The join emits :class:`Delta` rows; the sink applies them to a store. One flat row
type serves every table so that Spark carries a single output schema
(:data:`DELTA_DDL`); ``kind`` says which fields matter:

========== ============================================================
kind       fields used
========== ============================================================
TL_ADD     user_id, tweet_id, author_id, created_at
TL_DEL     user_id, tweet_id, author_id, created_at (0 if not known)
TL_WIPE    author_id, raw (user ids): drop all of the author's tweets there
HORIZON    created_at, tweet_id, raw (user ids): raise each user's horizon to it
TWEET      tweet_id, author_id, created_at (0 if not known), text, flag (1 = deleted),
           reply_to (the user a reply answers; 0: not a reply), record (the code of the
           record's kind, ``ingest.events.Kind``) and ref_id (its flat form's ref_id:
           the tweet it refers to, 0: none)
REPOST     tweet_id (the repost's id), author_id (reposter), created_at, flag (1 = shown,
           0 = hidden: undone, or superseded), original_id, original_author
RELATION   user_id (who acts), author_id (who is acted on), created_at, text ("block" or
           "mute"), flag (1 = on)
FOLLOW     author_id (followee), flag (1 = follows), raw ((follower, created_at) pairs)
CELEB_EDGE author_id (celebrity), flag (1 = on), raw (follower ids)
CELEB      author_id, flag (1 = is a celebrity)
USER       user_id, created_at, text (handle), name, flag (1 = the account is deleted)
ACTIVITY   user_id, created_at (the user's newest home-timeline read in the batch)
OFFSET     topic, partition, offset (highest offset seen in the batch)
DEAD       topic, partition, offset, text (reason), raw (value bytes)
FANOUT     tweet_id, author_id, created_at, raw (follower ids): TL_ADD to each
UNFANOUT   tweet_id, author_id, created_at, raw (follower ids): TL_DEL from each
BACKFILL   user_id, author_id, raw ((created_at, tweet_id) pairs): TL_ADD of each
========== ============================================================

Rows that concern many users carry them packed in ``raw`` (:func:`pack`): one row
for a post that reaches many followers, not one per follower, because every row
crosses from the Python worker to the JVM and on to the sink, and that per-row cost
dominated. Packed arrays are native-endian signed 64-bit integers (the driver and
the Python workers share one architecture).

**The timeline key.** Home timelines are ordered by ``(created_at, tweet_id)``
descending (DESIGN §4). :data:`Key` is that pair; a *horizon* is such a key
below which a cached timeline may be incomplete (it was trimmed to the cap, or a
backfill brought only an author's most recent tweets). Above its horizon a cached
timeline is exact; reads that go below it evaluate the query at read time.
"""

from __future__ import annotations

import marshal
from array import array
from collections.abc import Collection, Iterator, Mapping, Sequence
from enum import IntEnum
from functools import partial
from typing import NamedTuple

from views.row import BINARY, Column, columns_of, ddl

Key = tuple[int, int]
"""A timeline position: (created_at, tweet_id); larger is newer."""


#: Above every real position (created_at is at most year 9999 in ms, far below 2^63).
TOP: Key = (2**63 - 1, 2**63 - 1)


class DeltaKind(IntEnum):
    """What a delta changes; see the module docstring for the fields of each."""

    TL_ADD = 1
    TL_DEL = 2
    TL_WIPE = 3
    HORIZON = 4
    TWEET = 5
    FOLLOW = 6
    CELEB_EDGE = 7
    CELEB = 8
    USER = 9
    OFFSET = 10
    DEAD = 11
    FANOUT = 12
    UNFANOUT = 13
    BACKFILL = 14
    REPOST = 15
    RELATION = 16
    ACTIVITY = 17


class Delta(NamedTuple):
    """One change to one table row; unused fields are 0 / None.

    Build deltas with the named constructors below, one per kind: they are the one
    place that knows which fields a kind uses (the module docstring's table).
    """

    kind: int
    user_id: int = 0
    tweet_id: int = 0
    author_id: int = 0
    created_at: int = 0
    flag: int = 0
    text: str | None = None
    name: str | None = None
    topic: str | None = None
    partition: int = 0
    offset: int = 0
    raw: bytes | None = None
    reply_to: int = 0
    original_id: int = 0
    original_author: int = 0
    record: int = 0
    ref_id: int = 0

    # -- tables ----------------------------------------------------------------------
    @classmethod
    def tweet(cls, tweet_id: int, author_id: int, created_at: int, text: str | None,
              reply_to: int = 0, record: int = 0, ref_id: int = 0) -> Delta:
        """TWEET: a posted tweet, for hydration and ``author_tweets``.

        A reply names ``reply_to``; ``record`` is the code of the kind of record that
        posted it and ``ref_id`` the tweet it refers to, which the stores keep as they
        are, whatever the kind (a post: its code, 0).
        """
        return cls(DeltaKind.TWEET, tweet_id=tweet_id, author_id=author_id,
                   created_at=created_at, text=text, reply_to=reply_to, record=int(record),
                   ref_id=ref_id)

    @classmethod
    def repost(cls, tweet_id: int, author_id: int, created_at: int, original: Key,
               shown: bool) -> Delta:
        """REPOST: a repost shown or hidden; ``original`` is (tweet id, author id).

        Unlike a tweet's delete, hiding is not final: the join decides which of a
        user's reposts of one tweet is the live one (``views.join``), and the store
        keeps the last state written.
        """
        return cls(DeltaKind.REPOST, tweet_id=tweet_id, author_id=author_id,
                   created_at=created_at, flag=int(shown), original_id=original[0],
                   original_author=original[1])

    @classmethod
    def relation(cls, user_id: int, other_id: int, relation: str, on: bool,
                 created_at: int) -> Delta:
        """RELATION: ``user_id`` blocks or mutes ``other_id`` (``relation``), or stops."""
        return cls(DeltaKind.RELATION, user_id=user_id, author_id=other_id,
                   created_at=created_at, text=relation, flag=int(on))

    @classmethod
    def activity(cls, user_id: int, read_at: int) -> Delta:
        """ACTIVITY: ``user_id`` read their home timeline at ``read_at`` (inactive users)."""
        return cls(DeltaKind.ACTIVITY, user_id=user_id, created_at=read_at)

    @classmethod
    def account_deleted(cls, user_id: int, created_at: int) -> Delta:
        """USER with the deleted flag: the account is gone for good."""
        return cls(DeltaKind.USER, user_id=user_id, created_at=created_at, flag=1)

    @classmethod
    def tweet_deleted(cls, tweet_id: int, author_id: int, created_at: int = 0) -> Delta:
        """TWEET with the deleted flag; ``created_at`` 0 when the join no longer knows it."""
        return cls(DeltaKind.TWEET, tweet_id=tweet_id, author_id=author_id,
                   created_at=created_at, flag=1)

    @classmethod
    def follows(cls, followee_id: int, active: bool, pairs: Sequence[int]) -> Delta:
        """FOLLOW: edges to ``followee_id``, ``pairs`` flat (follower, created_at) pairs."""
        return cls(DeltaKind.FOLLOW, author_id=followee_id, flag=int(active),
                   raw=_longs(pairs))

    @classmethod
    def celebrity_edges(cls, celebrity_id: int, on: bool, users: Sequence[int]) -> Delta:
        """CELEB_EDGE: ``users``' edges to the celebrity, on or off."""
        return cls(DeltaKind.CELEB_EDGE, author_id=celebrity_id, flag=int(on),
                   raw=_longs(users))

    @classmethod
    def celebrity(cls, author_id: int, on: bool) -> Delta:
        """CELEB: the author is on the celebrity path, or back on fan-out."""
        return cls(DeltaKind.CELEB, author_id=author_id, flag=int(on))

    @classmethod
    def profile(cls, user_id: int, created_at: int, handle: str | None,
                name: str | None) -> Delta:
        """USER: a user's profile as of ``created_at``."""
        return cls(DeltaKind.USER, user_id=user_id, created_at=created_at, text=handle,
                   name=name)

    # -- home timelines --------------------------------------------------------------
    @classmethod
    def timeline_add(cls, user_id: int, tweet_id: int, author_id: int,
                     created_at: int) -> Delta:
        """TL_ADD: one tweet into one user's timeline."""
        return cls(DeltaKind.TL_ADD, user_id=user_id, tweet_id=tweet_id, author_id=author_id,
                   created_at=created_at)

    @classmethod
    def timeline_remove(cls, user_id: int, tweet_id: int, author_id: int,
                        created_at: int = 0) -> Delta:
        """TL_DEL: one tweet out of one user's timeline (``created_at`` 0: not known)."""
        return cls(DeltaKind.TL_DEL, user_id=user_id, tweet_id=tweet_id, author_id=author_id,
                   created_at=created_at)

    @classmethod
    def fanout(cls, tweet_id: int, author_id: int, created_at: int,
               users: Sequence[int]) -> Delta:
        """FANOUT: one tweet into the timelines of ``users``."""
        return cls(DeltaKind.FANOUT, tweet_id=tweet_id, author_id=author_id,
                   created_at=created_at, raw=_longs(users))

    @classmethod
    def unfanout(cls, tweet_id: int, author_id: int, created_at: int,
                 users: Sequence[int]) -> Delta:
        """UNFANOUT: one tweet out of the timelines of ``users``."""
        return cls(DeltaKind.UNFANOUT, tweet_id=tweet_id, author_id=author_id,
                   created_at=created_at, raw=_longs(users))

    @classmethod
    def backfill(cls, user_id: int, author_id: int, pairs: Sequence[int]) -> Delta:
        """BACKFILL: the author's tweets, flat (created_at, tweet_id) pairs, into a timeline."""
        return cls(DeltaKind.BACKFILL, user_id=user_id, author_id=author_id, raw=_longs(pairs))

    @classmethod
    def timeline_wipe(cls, author_id: int, users: Sequence[int]) -> Delta:
        """TL_WIPE: every tweet of the author out of the timelines of ``users``."""
        return cls(DeltaKind.TL_WIPE, author_id=author_id, raw=_longs(users))

    @classmethod
    def horizon(cls, key: Key, users: Sequence[int]) -> Delta:
        """HORIZON: raise each of ``users``' horizons to ``key``."""
        return cls(DeltaKind.HORIZON, tweet_id=key[1], created_at=key[0], raw=_longs(users))

    # -- bookkeeping -----------------------------------------------------------------
    @classmethod
    def source_offset(cls, topic: str, partition: int, offset: int,
                      event_time: int = 0) -> Delta:
        """OFFSET: the highest offset of a partition seen in the batch, and its event time."""
        return cls(DeltaKind.OFFSET, created_at=event_time, topic=topic, partition=partition,
                   offset=offset)

    @classmethod
    def dead_letter(cls, topic: str, partition: int, offset: int, reason: str,
                    raw: bytes | None) -> Delta:
        """DEAD: a record that failed validation, with the reason and its value bytes."""
        return cls(DeltaKind.DEAD, text=reason, topic=topic, partition=partition,
                   offset=offset, raw=raw)


DELTA_FIELDS = Delta._fields
#: The delta row's columns, from :class:`Delta`'s fields, and Spark's schema of them.
DELTA_COLUMNS = columns_of(Delta, int32=("kind", "flag", "partition", "record"))
DELTA_DDL = ddl(DELTA_COLUMNS)

#: What the join's Spark step emits: one row per processor call, its deltas packed
#: (:func:`pack_deltas`). A row costs the same to cross the JVM whatever it holds, and
#: one row per bucket instead of one per delta is what made the crossing cheap.
#: :func:`views.sink.deltas_from_arrow` reads both forms.
PACKED_DELTA_COLUMNS = (Column("deltas", BINARY),)
PACKED_DELTA_DDL = ddl(PACKED_DELTA_COLUMNS)


_as_delta = partial(tuple.__new__, Delta)


def pack_deltas(deltas: Sequence[Delta]) -> bytes:
    """``deltas`` as one :mod:`marshal` blob (format 4: any CPython 3 reads it)."""
    # marshal takes plain tuples and ints only: the kind is an IntEnum.
    return marshal.dumps([(int(d[0]), *d[1:]) for d in deltas], 4)


def unpack_deltas(blob: bytes) -> list[Delta]:
    """The inverse of :func:`pack_deltas`.

    Rows become deltas through ``tuple.__new__``, not ``Delta._make`` (a Python call and
    a length check per row, a fifth of the time); the rows of one blob all come from
    one :func:`pack_deltas`, so checking the first one's length checks them all.
    """
    rows = marshal.loads(blob)  # noqa: S302 (our own blobs)
    if rows and len(rows[0]) != len(Delta._fields):
        msg = f"packed deltas of {len(rows[0])} fields, not {len(Delta._fields)}"
        raise ValueError(msg)
    return list(map(_as_delta, rows))


def pack(author: int, home: Mapping[tuple[int, int], tuple[bool, int]],
         wipes: Collection[int] = (), edges: Mapping[int, tuple[bool, int]] | None = None,
         starred: Mapping[int, bool] | None = None,
         horizons: Mapping[int, Key] | None = None) -> list[Delta]:
    """One author's net changes of a batch, packed into as few rows as is simple.

    ``home`` maps (user, tweet) to (added, created_at): adds that share a tweet become
    one FANOUT row, the remaining adds that share a user one BACKFILL row, removes
    that share a tweet one UNFANOUT row. ``wipes`` (users), ``edges`` (follower →
    (active, created_at)), ``starred`` (follower → celebrity edge on) and
    ``horizons`` (user → key) become one row per distinct flag or key.
    """
    out = _pack_timeline(author, home)
    if wipes:
        out.append(Delta.timeline_wipe(author, sorted(wipes)))
    for flag in (True, False):
        pairs = [v for u, (on, at) in (edges or {}).items() if on == flag for v in (u, at)]
        if pairs:
            out.append(Delta.follows(author, flag, pairs))
        users = [u for u, on in (starred or {}).items() if on == flag]
        if users:
            out.append(Delta.celebrity_edges(author, flag, users))
    by_key: dict[Key, list[int]] = {}
    for user, key in (horizons or {}).items():
        by_key.setdefault(key, []).append(user)
    out += [Delta.horizon(key, users) for key, users in by_key.items()]
    return out


def _pack_timeline(author: int, home: Mapping[tuple[int, int], tuple[bool, int]]
                   ) -> list[Delta]:
    adds: dict[int, tuple[int, list[int]]] = {}
    removes: dict[int, tuple[int, list[int]]] = {}
    for (user, tweet), (added, created_at) in home.items():
        (adds if added else removes).setdefault(tweet, (created_at, []))[1].append(user)
    out: list[Delta] = []
    singles: dict[int, list[int]] = {}
    for tweet, (created_at, users) in adds.items():
        if len(users) > 1:
            out.append(Delta.fanout(tweet, author, created_at, users))
        else:
            singles.setdefault(users[0], []).extend((created_at, tweet))
    for user, pairs in singles.items():
        if len(pairs) > 2:
            out.append(Delta.backfill(user, author, pairs))
        else:
            out.append(Delta.timeline_add(user, pairs[1], author, pairs[0]))
    for tweet, (created_at, users) in removes.items():
        if len(users) > 1:
            out.append(Delta.unfanout(tweet, author, created_at, users))
        else:
            out.append(Delta.timeline_remove(users[0], tweet, author, created_at))
    return out


def unpack_longs(raw: bytes) -> array:
    """The int64 array a packed delta carries."""
    out = array("q")
    out.frombytes(raw)
    return out


def timeline_add_columns(d: Delta) -> tuple[array, array, array, array]:
    """The adds a TL_ADD/FANOUT/BACKFILL carries, column-wise: users, created_ats, tweets, authors."""
    if d.kind == DeltaKind.TL_ADD:
        return (array("q", (d.user_id,)), array("q", (d.created_at,)),
                array("q", (d.tweet_id,)), array("q", (d.author_id,)))
    longs = unpack_longs(d.raw or b"")
    if d.kind == DeltaKind.FANOUT:
        n = len(longs)
        return (longs, array("q", (d.created_at,)) * n, array("q", (d.tweet_id,)) * n,
                array("q", (d.author_id,)) * n)
    n = len(longs) // 2  # BACKFILL: (created_at, tweet) pairs
    return (array("q", (d.user_id,)) * n, longs[::2], longs[1::2], array("q", (d.author_id,)) * n)


def timeline_adds(d: Delta) -> Iterator[tuple[int, int, int, int]]:
    """(user, created_at, tweet, author) of every add a TL_ADD/FANOUT/BACKFILL carries."""
    return zip(*timeline_add_columns(d), strict=True)


def timeline_removes(d: Delta) -> Iterator[tuple[int, int, int, int]]:
    """(user, tweet, created_at, author) of every remove a TL_DEL/UNFANOUT carries."""
    if d.kind == DeltaKind.TL_DEL:
        yield (d.user_id, d.tweet_id, d.created_at, d.author_id)
    else:
        for user in unpack_longs(d.raw or b""):
            yield (user, d.tweet_id, d.created_at, d.author_id)


def _longs(values: Sequence[int]) -> bytes:
    return array("q", values).tobytes()
