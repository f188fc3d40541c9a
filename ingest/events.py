"""The changelog contract: event types, validation, JSON encoding, topics and keys.

Everything that crosses Kafka is defined here and nowhere else (DESIGN §3, §4b). Four
topics, co-partitioned on the join key: ``tweets`` keyed by ``author_id``,
``follows`` keyed by ``followee_id``, and ``users`` and ``activity`` keyed by
``user_id``. The key is the decimal id as ASCII bytes, so any Kafka client with the
same partitioner (murmur2, the Java default) puts one author's tweets and follower
edges in the same partition number.

``decode`` is total: it returns an event or raises :class:`InvalidEvent` with a
reason a person can act on. Callers turn that into a dead-letter record; nothing
here ever drops a record silently.
"""

from __future__ import annotations

import json
import json.scanner
from dataclasses import dataclass
from typing import Any, Final

from ingest.errors import InvalidEvent

VERSION: Final = 1
MAX_ID: Final = 2**63 - 1
MAX_TEXT: Final = 280
MAX_HANDLE: Final = 50
MAX_NAME: Final = 100
#: Event times are epoch milliseconds; anything past year 9999 is a unit mistake.
MAX_CREATED_AT: Final = 253_402_300_799_999

TWEETS: Final = "tweets"
FOLLOWS: Final = "follows"
USERS: Final = "users"
#: Home-timeline reads, compacted per user (DESIGN §4b, inactive users).
ACTIVITY: Final = "activity"
TOPICS: Final = (TWEETS, FOLLOWS, USERS, ACTIVITY)
#: Rank of each topic in the per-key apply order (created_at, topic, offset).
TOPIC_RANK: Final = {FOLLOWS: 0, TWEETS: 1, USERS: 2, ACTIVITY: 3}


@dataclass(frozen=True, slots=True)
class Post:
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
class Delete:
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
class Repost:
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
class Unrepost:
    """``author_id`` takes back the repost ``tweet_id``."""

    tweet_id: int
    author_id: int
    created_at: int
    op = "unrepost"
    topic = TWEETS

    @property
    def key(self) -> int:
        return self.author_id


@dataclass(frozen=True, slots=True)
class Follow:
    """``follower_id`` starts (``active``) or stops following ``followee_id``."""

    follower_id: int
    followee_id: int
    created_at: int
    active: bool = True
    topic = FOLLOWS

    @property
    def op(self) -> str:
        return "follow" if self.active else "unfollow"

    @property
    def key(self) -> int:
        return self.followee_id


#: The relations a user sets on another besides following (DESIGN §4b).
BLOCK: Final = "block"
MUTE: Final = "mute"


@dataclass(frozen=True, slots=True)
class Relation:
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
        if self.relation not in (BLOCK, MUTE):
            msg = f"a relation is {BLOCK} or {MUTE}, not {self.relation!r}"
            raise ValueError(msg)

    @property
    def op(self) -> str:
        return self.relation if self.active else "un" + self.relation

    @property
    def key(self) -> int:
        return self.followee_id


@dataclass(frozen=True, slots=True)
class UserUpsert:
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
class AccountDelete:
    """The account ``user_id`` is gone for good (a later upsert of it is ignored)."""

    user_id: int
    created_at: int
    op = "delete"
    topic = USERS

    @property
    def key(self) -> int:
        return self.user_id


@dataclass(frozen=True, slots=True)
class Activity:
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
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def encode(event: Event) -> tuple[bytes, bytes]:
    """Return the Kafka (key, value) of ``event``; the value is compact JSON."""
    body: dict[str, Any] = {"v": VERSION, "op": event.op}
    if isinstance(event, Post):
        body |= {"tweet_id": event.tweet_id, "author_id": event.author_id,
                 "created_at": event.created_at, "text": event.text}
        if event.in_reply_to_user_id:
            body["in_reply_to_user_id"] = event.in_reply_to_user_id
    elif isinstance(event, Delete | Unrepost):
        body |= {"tweet_id": event.tweet_id, "author_id": event.author_id,
                 "created_at": event.created_at}
    elif isinstance(event, Repost):
        body |= {"tweet_id": event.tweet_id, "author_id": event.author_id,
                 "original_tweet_id": event.original_tweet_id,
                 "original_author_id": event.original_author_id,
                 "created_at": event.created_at}
    elif isinstance(event, Follow | Relation):
        body |= {"follower_id": event.follower_id, "followee_id": event.followee_id,
                 "created_at": event.created_at}
    elif isinstance(event, AccountDelete | Activity):
        body |= {"user_id": event.user_id, "created_at": event.created_at}
    else:
        body |= {"user_id": event.user_id, "handle": event.handle, "name": event.name,
                 "created_at": event.created_at}
    return encode_key(event.key), _ENCODER.encode(body).encode()


def encode_key(join_key: int) -> bytes:
    """The Kafka key of a record whose join key is ``join_key``."""
    return str(join_key).encode("ascii")


def decode(topic: str, key: bytes | None, value: bytes | None) -> Event:
    """Parse and validate one changelog record, or raise :class:`InvalidEvent`."""
    if topic not in TOPICS:
        msg = f"unknown topic {topic!r}"
        raise InvalidEvent(msg)
    if value is None:
        msg = "record has no value (tombstone)"
        raise InvalidEvent(msg)
    body = load_object(value)
    if type(body.get("v")) is not int or body["v"] != VERSION:
        msg = f"unsupported version v={body.get('v')!r} (expected {VERSION})"
        raise InvalidEvent(msg)
    event = _PARSERS[topic](body)
    _check_key(key, event.key)
    return event


_SCAN: Final = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[attr-defined,arg-type]


def load_object(raw: bytes | str) -> dict[str, Any]:
    """A JSON object from ``raw``, or :class:`InvalidEvent` saying why not.

    What ``json.loads(raw)`` returns, by a shorter road for the usual record: UTF-8
    bytes holding exactly one object. ``json.loads`` would guess the encoding and
    match whitespace with a regular expression before and after the object, a third
    of a record's decode; anything else takes that road as before.
    """
    if type(raw) is bytes and raw[:1] == b"{" and raw[1:2] != b"\x00":
        try:
            text = raw.decode("utf-8", "surrogatepass")  # what json.loads would pick
            body, end = _SCAN(text, 0)
        except (UnicodeDecodeError, StopIteration, ValueError):
            pass  # json.loads below says why
        else:
            if end == len(text):
                return body  # type: ignore[no-any-return]  # an object: it began with {
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        msg = f"value is not JSON: {exc}"
        raise InvalidEvent(msg) from None
    if not isinstance(body, dict):
        msg = f"value is JSON {type(body).__name__}, not an object"
        raise InvalidEvent(msg)
    return body


# The fields each kind of record may carry (built once: a set literal is built per call).
_POST_FIELDS: Final = frozenset({"v", "op", "tweet_id", "author_id", "created_at", "text",
                                  "in_reply_to_user_id"})
_TWEET_ID_FIELDS: Final = frozenset({"v", "op", "tweet_id", "author_id", "created_at"})
_REPOST_FIELDS: Final = frozenset({"v", "op", "tweet_id", "author_id", "original_tweet_id",
                                    "original_author_id", "created_at"})
_EDGE_FIELDS: Final = frozenset({"v", "op", "follower_id", "followee_id", "created_at"})
_USER_ID_FIELDS: Final = frozenset({"v", "op", "user_id", "created_at"})
_UPSERT_FIELDS: Final = frozenset({"v", "op", "user_id", "handle", "name", "created_at"})


def _parse_tweet(body: dict[str, Any]) -> Event:
    op = body.get("op")
    if op == "post":
        _only(body, _POST_FIELDS)
        author = _id(body, "author_id")
        reply_to = _id(body, "in_reply_to_user_id") if "in_reply_to_user_id" in body else 0
        if reply_to == author:
            msg = f"in_reply_to_user_id={reply_to} is the author: a self-reply carries none"
            raise InvalidEvent(msg)
        return Post(_id(body, "tweet_id"), author, _time(body),
                    _text(body, "text", MAX_TEXT, allow_empty=False), reply_to)
    if op in ("delete", "unrepost"):
        _only(body, _TWEET_ID_FIELDS)
        kind = Delete if op == "delete" else Unrepost
        return kind(_id(body, "tweet_id"), _id(body, "author_id"), _time(body))
    if op == "repost":
        _only(body, _REPOST_FIELDS)
        tweet, original = _id(body, "tweet_id"), _id(body, "original_tweet_id")
        if tweet == original:
            msg = f"repost tweet_id={tweet} equals original_tweet_id: a repost has its own id"
            raise InvalidEvent(msg)
        return Repost(tweet, _id(body, "author_id"), original,
                      _id(body, "original_author_id"), _time(body))
    msg = f"unknown op {op!r} on topic tweets (expected post, delete, repost or unrepost)"
    raise InvalidEvent(msg)


_EDGE_OPS: Final = ("follow", "unfollow", "block", "unblock", "mute", "unmute")


def _parse_follow(body: dict[str, Any]) -> Event:
    op = body.get("op")
    if op not in _EDGE_OPS:
        msg = f"unknown op {op!r} on topic follows (expected {', '.join(_EDGE_OPS)})"
        raise InvalidEvent(msg)
    _only(body, _EDGE_FIELDS)
    follower, followee = _id(body, "follower_id"), _id(body, "followee_id")
    if follower == followee:
        msg = f"user {follower} cannot {op} themselves"
        raise InvalidEvent(msg)
    active = not op.startswith("un")
    if op in ("follow", "unfollow"):
        return Follow(follower, followee, _time(body), active=active)
    return Relation(follower, followee, _time(body), op.removeprefix("un"), active=active)


def _parse_user(body: dict[str, Any]) -> Event:
    op = body.get("op")
    if op == "delete":
        _only(body, _USER_ID_FIELDS)
        return AccountDelete(_id(body, "user_id"), _time(body))
    if op != "upsert":
        msg = f"unknown op {op!r} on topic users (expected upsert or delete)"
        raise InvalidEvent(msg)
    _only(body, _UPSERT_FIELDS)
    return UserUpsert(_id(body, "user_id"), _text(body, "handle", MAX_HANDLE, allow_empty=False),
                      _text(body, "name", MAX_NAME, allow_empty=True), _time(body))


def _parse_activity(body: dict[str, Any]) -> Event:
    op = body.get("op")
    if op != "read":
        msg = f"unknown op {op!r} on topic activity (expected read)"
        raise InvalidEvent(msg)
    _only(body, _USER_ID_FIELDS)
    return Activity(_id(body, "user_id"), _time(body))


_PARSERS = {TWEETS: _parse_tweet, FOLLOWS: _parse_follow, USERS: _parse_user,
            ACTIVITY: _parse_activity}


def _only(body: dict[str, Any], allowed: frozenset[str]) -> None:
    if body.keys() <= allowed:
        return
    extra = sorted(body.keys() - allowed)
    if extra:
        msg = f"unexpected field(s) {', '.join(extra)}"
        raise InvalidEvent(msg)


def _int(body: dict[str, Any], field: str) -> int:
    if field not in body:
        msg = f"missing field {field}"
        raise InvalidEvent(msg)
    value = body[field]
    # bool is an int subclass in Python; JSON true is never an id.
    if not isinstance(value, int) or isinstance(value, bool):
        msg = f"{field} must be an integer, got {type(value).__name__}"
        raise InvalidEvent(msg)
    return value


def _id(body: dict[str, Any], field: str) -> int:
    value = _int(body, field)
    if not 1 <= value <= MAX_ID:
        msg = f"{field}={value} is not a positive 64-bit id"
        raise InvalidEvent(msg)
    return value


def _time(body: dict[str, Any]) -> int:
    value = _int(body, "created_at")
    if not 0 <= value <= MAX_CREATED_AT:
        msg = f"created_at={value} is not epoch milliseconds"
        raise InvalidEvent(msg)
    return value


def _text(body: dict[str, Any], field: str, limit: int, *, allow_empty: bool) -> str:
    if field not in body:
        msg = f"missing field {field}"
        raise InvalidEvent(msg)
    value = body[field]
    if not isinstance(value, str):
        msg = f"{field} must be a string, got {type(value).__name__}"
        raise InvalidEvent(msg)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        msg = f"{field} is not valid Unicode text (lone surrogate)"
        raise InvalidEvent(msg) from None
    if len(value) > limit:
        msg = f"{field} is {len(value)} characters, over the limit of {limit}"
        raise InvalidEvent(msg)
    if not allow_empty and not value.strip():
        msg = f"{field} is empty"
        raise InvalidEvent(msg)
    return value


def _check_key(key: bytes | None, expected: int) -> None:
    # A wrong key means a wrong partition: the co-partitioned join would miss it.
    if key is None:
        msg = f"record has no key (expected {expected})"
        raise InvalidEvent(msg)
    if key != encode_key(expected):
        shown = key[:40].decode("ascii", "replace")
        msg = f"key {shown!r} does not match the join key {expected}"
        raise InvalidEvent(msg)
