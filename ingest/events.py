"""The changelog contract: event types, the table of record kinds, validation, encoding.

Everything that crosses Kafka is defined here and nowhere else (DESIGN §3, §4b). Four
topics, co-partitioned on the join key: ``tweets`` keyed by ``author_id``,
``follows`` keyed by ``followee_id``, and ``users`` and ``activity`` keyed by
``user_id``. The key is the decimal id as ASCII bytes, so any Kafka client with the
same partitioner (murmur2, the Java default) puts one author's tweets and follower
edges in the same partition number.

**Kinds of record.** A record's kind is its ``op`` on its topic, and each one is
declared once, as a row of :data:`KINDS`: its :class:`Kind` code (what the view
carries and keeps), its event class (whose fields are the record's body), how its
body is validated, and its *flat form*, the eight columns every kind shares in which
the view carries it (``ingest.kinds``, which derives from a row what the rest needs).
Everything else that depends on the kinds — encoding and decoding, the ops of each
topic, the view's rows and back (:func:`flatten`, :func:`unflatten`), history files,
the API's edge verbs — is derived from this table. What a new kind adds besides its
row is its meaning: the join's rule for it (``views.join``), the reference's
(``views.reference``), and the stores' rows if it needs new ones. The rules every
field follows (ids, event times, text) are in ``ingest.fields``.

``decode`` is total: it returns an event or raises :class:`InvalidEvent` with a
reason a person can act on. Callers turn that into a dead-letter record; nothing
here ever drops a record silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

from ingest.errors import InvalidEvent
from ingest.fields import MAX_CREATED_AT as MAX_CREATED_AT  # the contract's value rules
from ingest.fields import MAX_ID as MAX_ID
from ingest.fields import id_of, load_object, only, text_of, time_of
from ingest.kinds import (
    Columns,
    Fields,
    Flat,
    Record,
    RecordKind,
    by_class,
    flattener,
    writer,
)

VERSION: Final = 1
MAX_TEXT: Final = 280
MAX_HANDLE: Final = 50
MAX_NAME: Final = 100

TWEETS: Final = "tweets"
FOLLOWS: Final = "follows"
USERS: Final = "users"
#: Home-timeline reads, compacted per user (DESIGN §4b, inactive users).
ACTIVITY: Final = "activity"
TOPICS: Final = (TWEETS, FOLLOWS, USERS, ACTIVITY)
#: Rank of each topic in the per-key apply order (created_at, topic, offset).
TOPIC_RANK: Final = {FOLLOWS: 0, TWEETS: 1, USERS: 2, ACTIVITY: 3}


class Kind(IntEnum):
    """The code of a kind of record, as the view carries and keeps it (:data:`KINDS`).

    Source rows, the join's packed input and checkpointed state hold these numbers:
    a code is never changed or reused, a new kind takes the next one. 0 is a record
    that failed validation (a dead letter), which carries no event.
    """

    INVALID = 0
    POST = 1
    DELETE = 2
    FOLLOW = 3
    UNFOLLOW = 4
    USER = 5
    REPOST = 6
    UNREPOST = 7
    BLOCK = 8
    UNBLOCK = 9
    MUTE = 10
    UNMUTE = 11
    USER_DELETE = 12
    ACTIVITY = 13


@dataclass(frozen=True, slots=True)
class Post(Record):
    """A tweet posted by ``author_id``; a reply names the user replied to (0: not a reply)."""

    tweet_id: int
    author_id: int
    created_at: int
    text: str
    in_reply_to_user_id: int = 0
    op = "post"
    topic = TWEETS

    @property
    def key(self) -> int:
        return self.author_id


@dataclass(frozen=True, slots=True)
class Delete(Record):
    """A tweet deleted by its author; ``created_at`` is the time of the delete."""

    tweet_id: int
    author_id: int
    created_at: int
    op = "delete"
    topic = TWEETS

    @property
    def key(self) -> int:
        return self.author_id


@dataclass(frozen=True, slots=True)
class Repost(Record):
    """``author_id`` reposts ``original_tweet_id``; ``tweet_id`` is the repost's own id."""

    tweet_id: int
    author_id: int
    original_tweet_id: int
    original_author_id: int
    created_at: int
    op = "repost"
    topic = TWEETS

    @property
    def key(self) -> int:
        return self.author_id


@dataclass(frozen=True, slots=True)
class Unrepost(Record):
    """``author_id`` takes back the repost ``tweet_id``."""

    tweet_id: int
    author_id: int
    created_at: int
    op = "unrepost"
    topic = TWEETS

    @property
    def key(self) -> int:
        return self.author_id


#: The edges a user sets on another: following, and besides it (DESIGN §4b) blocking
#: and muting. The relations' order is their code in the join's state
#: (``views.codec``): append only.
FOLLOW: Final = "follow"
BLOCK: Final = "block"
MUTE: Final = "mute"
RELATIONS: Final = (BLOCK, MUTE)


def edge_op(edge: str, active: bool) -> str:
    """The op of an edge record: ``edge`` (follow, block or mute) set, or undone."""
    return edge if active else "un" + edge


@dataclass(frozen=True, slots=True)
class Follow(Record):
    """``follower_id`` starts (``active``) or stops following ``followee_id``."""

    follower_id: int
    followee_id: int
    created_at: int
    active: bool = True
    topic = FOLLOWS

    @property
    def op(self) -> str:
        return edge_op(FOLLOW, self.active)

    @property
    def key(self) -> int:
        return self.followee_id


@dataclass(frozen=True, slots=True)
class Relation(Record):
    """``follower_id`` blocks or mutes (``active``), or unblocks or unmutes, ``followee_id``.

    On the follows topic, keyed by the user acted on, like a follow edge.
    """

    follower_id: int
    followee_id: int
    created_at: int
    relation: str = BLOCK
    active: bool = True
    topic = FOLLOWS

    def __post_init__(self) -> None:
        # Any other word would encode as another op: "follow" would decode as a Follow.
        if self.relation not in RELATIONS:
            msg = f"a relation is {' or '.join(RELATIONS)}, not {self.relation!r}"
            raise ValueError(msg)

    @property
    def op(self) -> str:
        return edge_op(self.relation, self.active)

    @property
    def key(self) -> int:
        return self.followee_id


@dataclass(frozen=True, slots=True)
class UserUpsert(Record):
    """A user's profile, as of ``created_at`` (compacted topic: latest wins)."""

    user_id: int
    handle: str
    name: str
    created_at: int
    op = "upsert"
    topic = USERS

    @property
    def key(self) -> int:
        return self.user_id


@dataclass(frozen=True, slots=True)
class AccountDelete(Record):
    """The account ``user_id`` is gone for good (a later upsert of it is ignored)."""

    user_id: int
    created_at: int
    op = "delete"
    topic = USERS

    @property
    def key(self) -> int:
        return self.user_id


@dataclass(frozen=True, slots=True)
class Activity(Record):
    """``user_id`` read their home timeline at ``created_at``.

    The log that inactive users are derived from (DESIGN §4b), so that which users get
    fan-out writes is a function of the changelogs, as the view is.
    """

    user_id: int
    created_at: int
    op = "read"
    topic = ACTIVITY

    @property
    def key(self) -> int:
        return self.user_id


Event = (Post | Delete | Repost | Unrepost | Follow | Relation | UserUpsert | AccountDelete
         | Activity)


# --- the table of kinds ----------------------------------------------------------------

# Each parser validates the fields in a fixed order, and the first problem found is
# the reason given: keep the order when changing one, or dead letters read differently.

def _parse_post(body: dict[str, Any], kind: RecordKind) -> Fields:
    only(body, kind.allowed)
    author = id_of(body, "author_id")
    reply_to = id_of(body, "in_reply_to_user_id") if "in_reply_to_user_id" in body else 0
    if reply_to == author:
        msg = f"in_reply_to_user_id={reply_to} is the author: a self-reply carries none"
        raise InvalidEvent(msg)
    return (id_of(body, "tweet_id"), author, time_of(body),
            text_of(body, "text", MAX_TEXT, allow_empty=False), reply_to)


def _parse_repost(body: dict[str, Any], kind: RecordKind) -> Fields:
    only(body, kind.allowed)
    tweet, original = id_of(body, "tweet_id"), id_of(body, "original_tweet_id")
    if tweet == original:
        msg = f"repost tweet_id={tweet} equals original_tweet_id: a repost has its own id"
        raise InvalidEvent(msg)
    return (tweet, id_of(body, "author_id"), original, id_of(body, "original_author_id"),
            time_of(body))


def _parse_tweet_id(body: dict[str, Any], kind: RecordKind) -> Fields:
    """A record naming one of its author's tweets: a delete or an unrepost."""
    only(body, kind.allowed)
    return (id_of(body, "tweet_id"), id_of(body, "author_id"), time_of(body))


def _parse_edge(body: dict[str, Any], kind: RecordKind) -> Fields:
    only(body, kind.allowed)
    follower, followee = id_of(body, "follower_id"), id_of(body, "followee_id")
    if follower == followee:
        msg = f"user {follower} cannot {kind.op} themselves"
        raise InvalidEvent(msg)
    return (follower, followee, time_of(body))


def _parse_upsert(body: dict[str, Any], kind: RecordKind) -> Fields:
    only(body, kind.allowed)
    return (id_of(body, "user_id"), text_of(body, "handle", MAX_HANDLE, allow_empty=False),
            text_of(body, "name", MAX_NAME, allow_empty=True), time_of(body))


def _parse_user_id(body: dict[str, Any], kind: RecordKind) -> Fields:
    """A record naming only its user: an account's delete, a read."""
    only(body, kind.allowed)
    return (id_of(body, "user_id"), time_of(body))


_TWEET: Final = Columns("author_id", tweet_id="tweet_id")
_EDGE: Final = Columns("followee_id", other_id="follower_id")
_USER: Final = Columns("user_id")


def _edge(kind: Kind, edge: str, active: bool) -> RecordKind:
    """The kind of an edge record: ``edge`` (follow, block or mute) set, or undone."""
    if edge == FOLLOW:
        return RecordKind(kind, edge_op(edge, active), Follow, _parse_edge, _EDGE,
                          {"active": active})
    return RecordKind(kind, edge_op(edge, active), Relation, _parse_edge, _EDGE,
                      {"relation": edge, "active": active})


#: Every kind of record (module docstring). A topic's kinds are listed here in the order
#: its "unknown op" reason names their ops.
KINDS: Final = (
    RecordKind(Kind.POST, Post.op, Post, _parse_post,
               Columns("author_id", tweet_id="tweet_id", other_id="in_reply_to_user_id",
                       text="text")),
    RecordKind(Kind.DELETE, Delete.op, Delete, _parse_tweet_id, _TWEET),
    RecordKind(Kind.REPOST, Repost.op, Repost, _parse_repost,
               Columns("author_id", tweet_id="tweet_id", other_id="original_author_id",
                       ref_id="original_tweet_id")),
    RecordKind(Kind.UNREPOST, Unrepost.op, Unrepost, _parse_tweet_id, _TWEET),
    _edge(Kind.FOLLOW, FOLLOW, True),
    _edge(Kind.UNFOLLOW, FOLLOW, False),
    _edge(Kind.BLOCK, BLOCK, True),
    _edge(Kind.UNBLOCK, BLOCK, False),
    _edge(Kind.MUTE, MUTE, True),
    _edge(Kind.UNMUTE, MUTE, False),
    RecordKind(Kind.USER, UserUpsert.op, UserUpsert, _parse_upsert,
               Columns("user_id", text="handle", name="name")),
    RecordKind(Kind.USER_DELETE, AccountDelete.op, AccountDelete, _parse_user_id, _USER),
    RecordKind(Kind.ACTIVITY, Activity.op, Activity, _parse_user_id, _USER),
)
#: Each topic's kinds by op.
OPS: Final = {topic: {k.op: k for k in KINDS if k.topic == topic} for topic in TOPICS}
#: Each kind's row of :data:`KINDS`, by code.
BY_CODE: Final[dict[int, RecordKind]] = {int(k.kind): k for k in KINDS}
#: The body field that holds each topic's join key.
KEY_FIELDS: Final = {k.topic: k.columns.key for k in KINDS}
#: Every field a body of some kind holds (besides ``v`` and ``op``), and its JSON type.
FIELDS: Final = {name: kind for k in KINDS for name, kind in k.field_types().items()}


_FLATTEN: Final = {cls: flattener(kinds) for cls, kinds in by_class(KINDS).items()}


def flatten(event: Event) -> Flat:
    """The flat form of ``event`` (:class:`Columns`): how the view carries a record."""
    try:
        return _FLATTEN[type(event)](event)
    except KeyError:
        msg = f"no row layout for event {event!r}: no kind of record has its class"
        raise TypeError(msg) from None


def unflatten(kind: int, key: int, created_at: int, tweet_id: int, other_id: int,
              ref_id: int, text: str | None, name: str | None) -> Event:
    """The (already validated) event of a flat form: the inverse of :func:`flatten`."""
    found = BY_CODE.get(kind)
    if found is None:
        msg = f"row kind {kind} carries no event"
        raise ValueError(msg)
    return found.event_of((key, created_at, tweet_id, other_id, ref_id, text, name))


_WRITE: Final = {cls: writer(kinds[0], VERSION) for cls, kinds in by_class(KINDS).items()}


def encode(event: Event) -> tuple[bytes, bytes]:
    """Return the Kafka (key, value) of ``event``; the value is compact JSON.

    The body is ``v``, ``op`` and the fields of its kind's body (:class:`RecordKind`).
    """
    return encode_key(event.key), _WRITE[type(event)](event)


def encode_key(join_key: int) -> bytes:
    """The Kafka key of a record whose join key is ``join_key``."""
    return str(join_key).encode("ascii")


def decode(topic: str, key: bytes | None, value: bytes | None) -> Event:
    """Parse and validate one changelog record, or raise :class:`InvalidEvent`."""
    kind, fields = _parse(topic, key, value)
    return kind.event_from(fields)


def decode_flat(topic: str, key: bytes | None, value: bytes | None) -> Flat:
    """:func:`flatten` of :func:`decode`, without making the event (the job's decode)."""
    kind, fields = _parse(topic, key, value)
    return kind.flat_of(fields)


def _parse(topic: str, key: bytes | None, value: bytes | None) -> tuple[RecordKind, Fields]:
    """The kind of one changelog record and its validated body fields."""
    ops = OPS.get(topic)
    if ops is None:
        msg = f"unknown topic {topic!r}"
        raise InvalidEvent(msg)
    if value is None:
        msg = "record has no value (tombstone)"
        raise InvalidEvent(msg)
    body = load_object(value)
    if type(body.get("v")) is not int or body["v"] != VERSION:
        msg = f"unsupported version v={body.get('v')!r} (expected {VERSION})"
        raise InvalidEvent(msg)
    op = body.get("op")
    kind = ops.get(op) if type(op) is str else None
    if kind is None:
        *others, last = ops
        expected = f"{', '.join(others)} or {last}" if others else last
        msg = f"unknown op {op!r} on topic {topic} (expected {expected})"
        raise InvalidEvent(msg)
    fields = kind.parse(body, kind)
    _check_key(key, fields[kind.key_at])
    return kind, fields


def _check_key(key: bytes | None, expected: int) -> None:
    # A wrong key means a wrong partition: the co-partitioned join would miss it.
    if key is None:
        msg = f"record has no key (expected {expected})"
        raise InvalidEvent(msg)
    if key != encode_key(expected):
        shown = key[:40].decode("ascii", "replace")
        msg = f"key {shown!r} does not match the join key {expected}"
        raise InvalidEvent(msg)
