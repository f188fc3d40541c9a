"""The source row: what every changelog record becomes, declared once.

This module owns the row a record turns into between Kafka and the join (DESIGN §3,
§5): its columns (:data:`SOURCE_COLUMNS`), the :class:`Kind` codes saying which event
it carries (0 for a record that failed validation and must be dead-lettered), and the
two mappings between events and rows, side by side (:func:`event_fields`,
:func:`to_event`). Both stream sources, ``fanout verify`` and the join go through
them, so a change to the contract (a new event) is made here.

Every schema of a row that crosses between Python and Spark (DDL, StructType, Arrow)
is derived from its :class:`Column` list by :func:`ddl`, :func:`struct_type` and
:func:`arrow_schema`: the source row's here, the delta row's from
:class:`~views.delta.Delta` (:func:`columns_of`). Checkpoints store these schemas,
so a column never changes without a migration (``tests/views/test_row.py``). Integer
columns are non-nullable so that ids near 2^63 never pass through float64. Kept free
of pyspark and pyarrow at import, so the join and the serving side import it
without Spark.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from enum import IntEnum
from typing import TYPE_CHECKING, Final, NamedTuple, get_args, get_type_hints

from ingest.events import (
    AccountDelete,
    Activity,
    Delete,
    Event,
    Follow,
    Post,
    Relation,
    Repost,
    Unrepost,
    UserUpsert,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType


# --- columns and their schemas ---------------------------------------------------------

class ColumnType(NamedTuple):
    """A column type as spelled by Spark SQL, Spark's JSON schema and pyarrow."""

    ddl: str
    spark: str
    arrow: str


STRING: Final = ColumnType("STRING", "string", "string")
INT: Final = ColumnType("INT", "integer", "int32")
BIGINT: Final = ColumnType("BIGINT", "long", "int64")
BINARY: Final = ColumnType("BINARY", "binary", "binary")


class Column(NamedTuple):
    """One column of a row."""

    name: str
    type: ColumnType
    nullable: bool = False


def columns_of(row: type, int32: Collection[str] = ()) -> tuple[Column, ...]:
    """The columns of a NamedTuple row type, from its field annotations.

    ``int`` is BIGINT (INT for the names in ``int32``), ``str`` STRING, ``bytes``
    BINARY; ``X | None`` is nullable.
    """
    out = []
    for name, hint in get_type_hints(row).items():
        args = [a for a in get_args(hint) if a is not type(None)]  # X of X | None
        base = args[0] if args else hint
        kind = {str: STRING, bytes: BINARY, int: INT if name in int32 else BIGINT}[base]
        out.append(Column(name, kind, nullable=bool(args)))
    return tuple(out)


def ddl(columns: Iterable[Column]) -> str:
    """Spark SQL DDL of ``columns``; names are quoted (``partition`` is a keyword)."""
    return ", ".join(f"`{c.name}` {c.type.ddl}{'' if c.nullable else ' NOT NULL'}"
                     for c in columns)


def struct_type(columns: Iterable[Column]) -> StructType:
    """Spark's schema of ``columns``."""
    from pyspark.sql.types import StructType  # only where Spark runs (module docstring)

    return StructType.fromJson({"type": "struct", "fields": [
        {"name": c.name, "type": c.type.spark, "nullable": c.nullable, "metadata": {}}
        for c in columns]})


def arrow_schema(columns: Iterable[Column]) -> pa.Schema:
    """The Arrow schema of ``columns``: exactly Spark's Arrow form of :func:`struct_type`."""
    import pyarrow as pa  # only where Spark runs (module docstring)

    return pa.schema([pa.field(c.name, pa.type_for_alias(c.type.arrow), nullable=c.nullable)
                      for c in columns])


# --- the source row --------------------------------------------------------------------

class Kind(IntEnum):
    """The event a source row carries."""

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


#: Relation events by (relation, active), and back.
_RELATION_KINDS: Final = {("block", True): Kind.BLOCK, ("block", False): Kind.UNBLOCK,
                          ("mute", True): Kind.MUTE, ("mute", False): Kind.UNMUTE}
_RELATIONS: Final = {kind: pair for pair, kind in _RELATION_KINDS.items()}


#: Where the record was read, the event it carries (:data:`EVENT_COLUMNS`), and for an
#: invalid record the reason and its value bytes (cut to ``views.source.MAX_RAW``).
SOURCE_COLUMNS: Final = (
    Column("topic", STRING), Column("partition", INT), Column("offset", BIGINT),
    Column("kind", INT), Column("key", BIGINT), Column("created_at", BIGINT),
    Column("tweet_id", BIGINT), Column("other_id", BIGINT), Column("ref_id", BIGINT),
    Column("text", STRING, nullable=True), Column("name", STRING, nullable=True),
    Column("error", STRING, nullable=True), Column("raw", BINARY, nullable=True),
)
#: The columns that carry the event: the fields of :func:`event_fields` and
#: :func:`to_event`, in that order.
EVENT_COLUMNS: Final = tuple(c.name for c in SOURCE_COLUMNS[3:11])

#: One source row, in SOURCE_COLUMNS order. Rows are plain tuples, not a NamedTuple:
#: the sources build one per record, and a NamedTuple costs 4 times as much to build.
Row = tuple[str, int, int, int, int, int, int, int, int, str | None, str | None, str | None,
            bytes | None]
#: The :data:`EVENT_COLUMNS` of one row.
EventFields = tuple[int, int, int, int, int, int, str | None, str | None]
#: The event columns of a row that carries no event (a record that failed validation).
NO_EVENT: Final[EventFields] = (Kind.INVALID, 0, 0, 0, 0, 0, None, None)


# --- events ↔ rows: the two mappings, side by side ---------------------------------------

def event_fields(event: Event) -> EventFields:
    """The :data:`EVENT_COLUMNS` of ``event``.

    ``key`` is its join key and ``text`` a post's text or a user's handle.
    ``other_id`` is a post's ``in_reply_to_user_id`` (0: not a reply), a repost's
    original author, or the acting user of a follow, block or mute; ``ref_id`` is a
    repost's original tweet.
    """
    if isinstance(event, Post):
        return (Kind.POST, event.author_id, event.created_at, event.tweet_id,
                event.in_reply_to_user_id, 0, event.text, None)
    if isinstance(event, Delete | Unrepost):
        kind = Kind.DELETE if isinstance(event, Delete) else Kind.UNREPOST
        return (kind, event.author_id, event.created_at, event.tweet_id, 0, 0, None, None)
    if isinstance(event, Repost):
        return (Kind.REPOST, event.author_id, event.created_at, event.tweet_id,
                event.original_author_id, event.original_tweet_id, None, None)
    if isinstance(event, Follow):
        kind = Kind.FOLLOW if event.active else Kind.UNFOLLOW
        return (kind, event.followee_id, event.created_at, 0, event.follower_id, 0, None, None)
    if isinstance(event, Relation):
        kind = _RELATION_KINDS[(event.relation, event.active)]
        return (kind, event.followee_id, event.created_at, 0, event.follower_id, 0, None, None)
    if isinstance(event, UserUpsert):
        return (Kind.USER, event.user_id, event.created_at, 0, 0, 0, event.handle, event.name)
    if isinstance(event, AccountDelete):
        return (Kind.USER_DELETE, event.user_id, event.created_at, 0, 0, 0, None, None)
    if isinstance(event, Activity):
        return (Kind.ACTIVITY, event.user_id, event.created_at, 0, 0, 0, None, None)
    msg = f"no row layout for event {event!r}"
    raise TypeError(msg)


def to_event(kind: int, key: int, created_at: int, tweet_id: int, other_id: int,
             ref_id: int, text: str | None, name: str | None) -> Event:
    """The (already validated) event a row carries: the inverse of :func:`event_fields`."""
    if kind == Kind.POST:
        return Post(tweet_id, key, created_at, text or "", other_id)
    if kind == Kind.DELETE:
        return Delete(tweet_id, key, created_at)
    if kind == Kind.UNREPOST:
        return Unrepost(tweet_id, key, created_at)
    if kind == Kind.REPOST:
        return Repost(tweet_id, key, ref_id, other_id, created_at)
    if kind in (Kind.FOLLOW, Kind.UNFOLLOW):
        return Follow(other_id, key, created_at, active=kind == Kind.FOLLOW)
    if kind in _RELATIONS:
        relation, active = _RELATIONS[Kind(kind)]
        return Relation(other_id, key, created_at, relation, active=active)
    if kind == Kind.USER:
        return UserUpsert(key, text or "", name or "", created_at)
    if kind == Kind.USER_DELETE:
        return AccountDelete(key, created_at)
    if kind == Kind.ACTIVITY:
        return Activity(key, created_at)
    msg = f"row kind {kind} carries no event"
    raise ValueError(msg)
