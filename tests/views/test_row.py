"""The rows the job carries keep their schemas: checkpoints of existing users store them.

The literals below are the schemas as they were written out by hand before they were
derived from one declaration per row; they must never change
without a migration note.

Migration notes:

- **State v2 (DESIGN §4b).** The source row gained ``ref_id`` (a repost's
  original tweet) and the delta row ``reply_to``, ``original_id`` and
  ``original_author``. The join state's layout changed with them (``views.codec``
  VERSION 2), and the checkpoint path carries that version, so a job of this version
  starts a fresh checkpoint beside the old one and rebuilds the view from the topics;
  an old job's checkpoint is left untouched.
- **Tweet references.** The delta row gained ``record`` and ``ref_id`` (a TWEET's kind
  of record and the tweet it refers to, kept by the stores: ``views.stores.rows.TweetRow``).
  Delta rows live inside one batch (packed from the processor to the sink, shuffled by
  the executor sink), never in the join state or a checkpoint, so a checkpoint carries
  on; the stores gain the columns (SQLite on open, Cassandra schema step 9).
"""

from __future__ import annotations

from typing import Any, get_args

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from ingest.events import (
    MAX_ID,
    TOPIC_RANK,
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
    encode,
)
from views.delta import DELTA_COLUMNS, DELTA_DDL, Delta
from views.join import Change
from views.row import (
    BIGINT,
    BINARY,
    EVENT_COLUMNS,
    INT,
    NO_EVENT,
    SOURCE_COLUMNS,
    STRING,
    Row,
    event_fields,
    to_event,
)
from views.source import ARROW_SCHEMA, SOURCE_DDL, SOURCE_SCHEMA, event_row
from views.stores.cassandra.sink import _ROUTED_SCHEMA, _TALLY_SCHEMA, ROUTED_DDL, TALLY_DDL

OLD_SOURCE_DDL = (
    "topic STRING NOT NULL, `partition` INT NOT NULL, offset BIGINT NOT NULL, "
    "kind INT NOT NULL, key BIGINT NOT NULL, created_at BIGINT NOT NULL, "
    "tweet_id BIGINT NOT NULL, other_id BIGINT NOT NULL, ref_id BIGINT NOT NULL, "
    "text STRING, name STRING, error STRING, raw BINARY"
)
OLD_SOURCE_SCHEMA = StructType([
    StructField("topic", StringType(), nullable=False),
    StructField("partition", IntegerType(), nullable=False),
    StructField("offset", LongType(), nullable=False),
    StructField("kind", IntegerType(), nullable=False),
    StructField("key", LongType(), nullable=False),
    StructField("created_at", LongType(), nullable=False),
    StructField("tweet_id", LongType(), nullable=False),
    StructField("other_id", LongType(), nullable=False),
    StructField("ref_id", LongType(), nullable=False),
    StructField("text", StringType(), nullable=True),
    StructField("name", StringType(), nullable=True),
    StructField("error", StringType(), nullable=True),
    StructField("raw", BinaryType(), nullable=True),
])
OLD_ARROW_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("kind", pa.int32(), nullable=False),
    pa.field("key", pa.int64(), nullable=False),
    pa.field("created_at", pa.int64(), nullable=False),
    pa.field("tweet_id", pa.int64(), nullable=False),
    pa.field("other_id", pa.int64(), nullable=False),
    pa.field("ref_id", pa.int64(), nullable=False),
    pa.field("text", pa.string()),
    pa.field("name", pa.string()),
    pa.field("error", pa.string()),
    pa.field("raw", pa.binary()),
])

OLD_DELTA_DDL = (
    "kind int not null, user_id long not null, tweet_id long not null, "
    "author_id long not null, created_at long not null, flag int not null, "
    "text string, name string, topic string, partition int not null, "
    "offset long not null, raw binary, reply_to long not null, "
    "original_id long not null, original_author long not null, record int not null, "
    "ref_id long not null"
)
OLD_ROUTED_DDL = OLD_DELTA_DDL + ", route long not null"
OLD_TALLY_DDL = ("topic string, partition int not null, offset long not null, "
                 "max_event_time long not null, rows long not null, adds long not null, "
                 "removes long not null, dead long not null")
OLD_DELTA_SCHEMA = StructType([
    StructField("kind", IntegerType(), nullable=False),
    StructField("user_id", LongType(), nullable=False),
    StructField("tweet_id", LongType(), nullable=False),
    StructField("author_id", LongType(), nullable=False),
    StructField("created_at", LongType(), nullable=False),
    StructField("flag", IntegerType(), nullable=False),
    StructField("text", StringType(), nullable=True),
    StructField("name", StringType(), nullable=True),
    StructField("topic", StringType(), nullable=True),
    StructField("partition", IntegerType(), nullable=False),
    StructField("offset", LongType(), nullable=False),
    StructField("raw", BinaryType(), nullable=True),
    StructField("reply_to", LongType(), nullable=False),
    StructField("original_id", LongType(), nullable=False),
    StructField("original_author", LongType(), nullable=False),
    StructField("record", IntegerType(), nullable=False),
    StructField("ref_id", LongType(), nullable=False),
])
OLD_ROUTED_SCHEMA = StructType([*OLD_DELTA_SCHEMA.fields,
                                StructField("route", LongType(), nullable=False)])
OLD_TALLY_SCHEMA = StructType([
    StructField("topic", StringType(), nullable=True),
    StructField("partition", IntegerType(), nullable=False),
    StructField("offset", LongType(), nullable=False),
    StructField("max_event_time", LongType(), nullable=False),
    StructField("rows", LongType(), nullable=False),
    StructField("adds", LongType(), nullable=False),
    StructField("removes", LongType(), nullable=False),
    StructField("dead", LongType(), nullable=False),
])
OLD_ROUTED_ARROW = pa.schema([
    pa.field("kind", pa.int32(), False), pa.field("user_id", pa.int64(), False),
    pa.field("tweet_id", pa.int64(), False), pa.field("author_id", pa.int64(), False),
    pa.field("created_at", pa.int64(), False), pa.field("flag", pa.int32(), False),
    pa.field("text", pa.string()), pa.field("name", pa.string()),
    pa.field("topic", pa.string()), pa.field("partition", pa.int32(), False),
    pa.field("offset", pa.int64(), False), pa.field("raw", pa.binary()),
    pa.field("reply_to", pa.int64(), False), pa.field("original_id", pa.int64(), False),
    pa.field("original_author", pa.int64(), False),
    pa.field("record", pa.int32(), False), pa.field("ref_id", pa.int64(), False),
    pa.field("route", pa.int64(), False),
])
OLD_TALLY_ARROW = pa.schema([
    pa.field("topic", pa.string()), pa.field("partition", pa.int32(), False),
    pa.field("offset", pa.int64(), False), pa.field("max_event_time", pa.int64(), False),
    pa.field("rows", pa.int64(), False), pa.field("adds", pa.int64(), False),
    pa.field("removes", pa.int64(), False), pa.field("dead", pa.int64(), False),
])


def test_source_schemas_are_unchanged() -> None:
    assert SOURCE_SCHEMA.json() == OLD_SOURCE_SCHEMA.json()
    assert ARROW_SCHEMA.serialize() == OLD_ARROW_SCHEMA.serialize()


def test_executor_sink_arrow_schemas_are_unchanged() -> None:
    assert _ROUTED_SCHEMA.serialize() == OLD_ROUTED_ARROW.serialize()
    assert _TALLY_SCHEMA.serialize() == OLD_TALLY_ARROW.serialize()
    # What Spark hands mapInArrow for the DDL the sink declares.
    assert to_arrow_schema(OLD_ROUTED_SCHEMA).serialize() == OLD_ROUTED_ARROW.serialize()
    assert to_arrow_schema(OLD_TALLY_SCHEMA).serialize() == OLD_TALLY_ARROW.serialize()


@pytest.mark.spark
@pytest.mark.parametrize(("ddl", "old_ddl", "schema"), [
    (SOURCE_DDL, OLD_SOURCE_DDL, OLD_SOURCE_SCHEMA),
    (DELTA_DDL, OLD_DELTA_DDL, OLD_DELTA_SCHEMA),
    (ROUTED_DDL, OLD_ROUTED_DDL, OLD_ROUTED_SCHEMA),
    (TALLY_DDL, OLD_TALLY_DDL, OLD_TALLY_SCHEMA),
], ids=["source", "delta", "routed", "tally"])
def test_ddls_mean_what_they_meant(spark: Any, ddl: str, old_ddl: str,
                                   schema: StructType) -> None:
    assert spark.createDataFrame([], old_ddl).schema.json() == schema.json()
    assert spark.createDataFrame([], ddl).schema.json() == schema.json()


# --- the declaration and the mappings ----------------------------------------------------

_EVENTS: list[Event] = [
    Post(tweet_id=MAX_ID, author_id=7, created_at=1_700_000_000_123, text="hi"),
    Delete(tweet_id=3, author_id=7, created_at=9),
    Follow(follower_id=MAX_ID, followee_id=7, created_at=9),
    Follow(follower_id=2, followee_id=7, created_at=9, active=False),
    UserUpsert(user_id=7, handle="ada", name="Ada L", created_at=9),
    Post(tweet_id=4, author_id=7, created_at=9, text="re", in_reply_to_user_id=MAX_ID),
    Repost(tweet_id=5, author_id=7, original_tweet_id=MAX_ID, original_author_id=8,
           created_at=10),
    Unrepost(tweet_id=5, author_id=7, created_at=11),
    Relation(follower_id=MAX_ID, followee_id=7, created_at=9, relation="block"),
    Relation(follower_id=2, followee_id=7, created_at=9, relation="block", active=False),
    Relation(follower_id=2, followee_id=7, created_at=9, relation="mute"),
    Relation(follower_id=2, followee_id=7, created_at=9, relation="mute", active=False),
    AccountDelete(user_id=7, created_at=12),
    Activity(user_id=7, created_at=13),
]


def test_row_type_matches_the_columns() -> None:
    python = {STRING: str, INT: int, BIGINT: int, BINARY: bytes}
    assert len(get_args(Row)) == len(SOURCE_COLUMNS)
    for column, hint in zip(SOURCE_COLUMNS, get_args(Row), strict=True):
        want = python[column.type] | None if column.nullable else python[column.type]
        assert hint == want, column


def test_delta_columns_are_deltas_fields() -> None:
    assert tuple(c.name for c in DELTA_COLUMNS) == Delta._fields


@pytest.mark.parametrize("event", _EVENTS, ids=lambda e: e.op)
def test_event_fields_and_to_event_are_inverse(event: Event) -> None:
    fields = event_fields(event)
    assert len(fields) == len(EVENT_COLUMNS)
    assert fields[1] == event.key
    assert to_event(*fields) == event


@pytest.mark.parametrize("event", _EVENTS, ids=lambda e: e.op)
def test_change_of_an_event_is_its_rows_event_columns(event: Event) -> None:
    key, value = encode(event)
    row = dict(zip((c.name for c in SOURCE_COLUMNS), event_row(event.topic, 0, 4, key, value),
                   strict=True))
    change = Change.of(event, 4)
    assert change.rank == TOPIC_RANK[event.topic]
    assert change._replace(rank=0) == Change(**{f: 0 if f == "rank" else row[f]
                                                for f in Change._fields})


def test_event_fields_refuses_an_unknown_event() -> None:
    with pytest.raises(TypeError, match="no row layout"):
        event_fields(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="carries no event"):
        to_event(*NO_EVENT)
