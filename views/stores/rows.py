"""The rows of the store contract: what a page reads and what a write plan writes.

Plain named tuples, shared by every backend, the write plan (:mod:`views.stores.plan`)
and the read path: timeline entries, tweets and profiles, a reader's relations, the
answers of a page's grouped reads (:class:`HomeStart`, :class:`Hydrated`), the rows a
plan writes, and the bookkeeping an operator reads (dead letters, the batch log).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

from views.delta import TOP, Delta, Key

#: The horizon of a *dormant* user's timeline: above every key, so every read of it is
#: evaluated at read time (exact) and no fan-out write lands in it. A user becomes
#: dormant when an entry arrives more than ``ViewWriter.inactive_ms`` after their newest
#: read (the ``activity`` log); their next read's record regenerates the cache.
DORMANT: Key = TOP


#: Below every timeline key (times are ≥ 0, ids ≥ 1): a read bounded by it reads all.
FLOOR: Key = (-1, -1)


class Entry(NamedTuple):
    """One timeline entry: position and author."""

    created_at: int
    tweet_id: int
    author_id: int

    @property
    def key(self) -> Key:
        return (self.created_at, self.tweet_id)


#: An Entry from a (created_at, tweet_id, author_id) tuple, without the keyword handling
#: of its constructor: a store builds one per timeline row it reads.
as_entry: Callable[[tuple[int, int, int]], Entry] = functools.partial(tuple.__new__, Entry)


class TweetRow(NamedTuple):
    """A tweet or a repost: what hydration reads, and what a write plan writes.

    A post has ``original_id`` 0 and, if it is a reply, ``reply_to`` the user it
    answers. A repost has ``original_id``/``original_author`` and empty text;
    its ``deleted`` is "not shown" (undone or superseded, see ``views.join``), which
    unlike a post's delete may be lifted again by a later write. ``record`` and
    ``ref_id`` are a post's kind of record and the tweet it refers to (0, 0 for a plain
    post and a repost): kept as they came, so that a new kind that posts needs no
    column of its own (``serving.render`` says what the reference is from the kind).
    """

    tweet_id: int
    author_id: int
    created_at: int
    text: str
    deleted: bool
    reply_to: int = 0
    original_id: int = 0
    original_author: int = 0
    record: int = 0
    ref_id: int = 0

    @property
    def is_repost(self) -> bool:
        return self.original_id != 0


class UserRow(NamedTuple):
    """A user's profile for hydration; a deleted account reads as ``deleted`` (DESIGN §4b)."""

    user_id: int
    handle: str
    name: str
    deleted: bool = False


class Relations(NamedTuple):
    """What one user's home timeline must leave out besides deletes (DESIGN §4b).

    ``blocked``: users this user blocks or is blocked by (blocks act both ways);
    ``muted``: users this user mutes (one way).
    """

    blocked: frozenset[int] = frozenset()
    muted: frozenset[int] = frozenset()


class HomeStart(NamedTuple):
    """What a home page reads before it knows any entry (:meth:`TimelineReader.home_start`)."""

    horizon: Key | None
    celebrities: list[int]
    relations: Relations
    #: The first cached entries asked for, newest first.
    cached: list[Entry]


class Hydrated(NamedTuple):
    """What :meth:`TimelineReader.hydrate` read: rows by id, reposts by original, followees."""

    tweets: dict[int, TweetRow]
    users: dict[int, UserRow]
    reposts: dict[int, list[Entry]]
    #: The reader's followees, when asked for.
    followees: list[int] | None = None


class RelationRow(NamedTuple):
    """A block or mute to write: ``user_id`` acts on ``other_id``; ``on`` sets, else clears."""

    user_id: int
    other_id: int
    relation: str
    on: bool
    created_at: int


class ProfileRow(NamedTuple):
    """A profile to write: the newest ``created_at`` wins in the store."""

    user_id: int
    handle: str
    name: str
    created_at: int

    @classmethod
    def of(cls, d: Delta) -> ProfileRow:
        """The profile a USER delta carries."""
        return cls(d.user_id, d.text or "", d.name or "", d.created_at)


class FollowRow(NamedTuple):
    """A follow edge to write: ``active`` upserts it, else deletes it."""

    follower_id: int
    followee_id: int
    created_at: int
    active: bool


class DeadRow(NamedTuple):
    """A dead letter to write (the store stamps when it saw it)."""

    topic: str
    partition: int
    offset: int
    reason: str
    raw: bytes | None


class DeadLetter(NamedTuple):
    """A changelog record that failed validation."""

    topic: str
    partition: int
    offset: int
    reason: str
    raw: bytes
    seen_at: int


class BatchInfo(NamedTuple):
    """One applied micro-batch, from the store's batch log (for metrics)."""

    batch_id: int
    finished_at: int
    rows: int
    seconds: float
    max_event_time: int

