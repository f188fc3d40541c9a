"""The source row: what every changelog record becomes, declared once.

This module owns the row a record turns into between Kafka and the join (DESIGN §3,
§5): its columns (:data:`SOURCE_COLUMNS`). Which event a row carries and how its
fields fill the event columns is the contract's (``ingest.events``: each kind's
:class:`~ingest.events.Kind` code, 0 for a record that failed validation and must be
dead-lettered, and its flat form in the table of kinds), so a new kind of record is
declared there, not here; :func:`event_fields` and :func:`to_event` are the two
mappings it derives. Both stream sources, ``fanout verify`` and the join go through
them.

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
from typing import TYPE_CHECKING, Final, NamedTuple, get_args, get_type_hints

# Kind is the contract's, imported from here too: the code of the event a row carries.
from ingest.events import Kind, flatten, unflatten
from ingest.kinds import Flat

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

#: Where the record was read, the event it carries (:data:`EVENT_COLUMNS`), and for an
#: invalid record the reason and its value bytes (cut to ``views.source.MAX_RAW``).
SOURCE_COLUMNS: Final = (
    Column("topic", STRING), Column("partition", INT), Column("offset", BIGINT),
    Column("kind", INT), Column("key", BIGINT), Column("created_at", BIGINT),
    Column("tweet_id", BIGINT), Column("other_id", BIGINT), Column("ref_id", BIGINT),
    Column("text", STRING, nullable=True), Column("name", STRING, nullable=True),
    Column("error", STRING, nullable=True), Column("raw", BINARY, nullable=True),
)
#: The columns that carry the event: a record's flat form (``ingest.kinds.Columns``),
#: the fields of :func:`event_fields` and :func:`to_event`, in that order.
EVENT_COLUMNS: Final = tuple(c.name for c in SOURCE_COLUMNS[3:11])

#: One source row, in SOURCE_COLUMNS order. Rows are plain tuples, not a NamedTuple:
#: the sources build one per record, and a NamedTuple costs 4 times as much to build.
Row = tuple[str, int, int, int, int, int, int, int, int, str | None, str | None, str | None,
            bytes | None]
#: The :data:`EVENT_COLUMNS` of one row.
EventFields = Flat
#: The event columns of a row that carries no event (a record that failed validation).
NO_EVENT: Final[EventFields] = (Kind.INVALID, 0, 0, 0, 0, 0, None, None)


# --- events ↔ rows: the two mappings, derived from the table of kinds --------------------

#: The :data:`EVENT_COLUMNS` of an event. ``key`` is its join key; which field fills
#: each other column is its kind's (``ingest.events.KINDS``): for example ``other_id``
#: is a post's ``in_reply_to_user_id`` (0: not a reply), a repost's original author, or
#: the acting user of a follow, block or mute, and ``ref_id`` a repost's original tweet.
event_fields = flatten
#: The (already validated) event a row's event columns carry: the inverse of
#: :func:`event_fields`.
to_event = unflatten
