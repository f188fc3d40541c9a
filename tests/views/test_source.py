"""The fanout-kafka source: rows, Arrow schema, offsets, and real streaming queries."""

from __future__ import annotations

import json
import pickle
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from ingest.events import (
    ACTIVITY,
    FOLLOWS,
    MAX_ID,
    TWEETS,
    USERS,
    Delete,
    Event,
    Follow,
    Post,
    Repost,
    UserUpsert,
    encode,
    encode_key,
)
from ingest.settings import KafkaSettings
from views.errors import OffsetsPastEnd
from views.kafka_offsets import KafkaReadError
from views.row import Kind
from views.source import (
    ARROW_SCHEMA,
    FORMAT,
    MAX_RAW,
    SOURCE_DDL,
    SOURCE_SCHEMA,
    KafkaRange,
    KafkaStreamReader,
    SourceOptions,
    encode_offsets,
    event_row,
    fair_share,
    read_range,
    read_ranges,
    rows_to_batch,
)

BIG = MAX_ID - 7  # ids near 2^63 - 1: float64 would corrupt them


def _row(event: Event, offset: int = 5) -> tuple[Any, ...]:
    key, value = encode(event)
    return event_row(event.topic, 1, offset, key, value)


# --- event_row --------------------------------------------------------------------------

def test_event_row_post_with_ids_near_2_63() -> None:
    row = _row(Post(tweet_id=MAX_ID, author_id=BIG, created_at=1_700_000_000_123, text="hi"))
    assert row == (TWEETS, 1, 5, Kind.POST, BIG, 1_700_000_000_123, MAX_ID, 0, 0, "hi",
                   None, None, None)


def test_event_row_delete_follow_unfollow_user() -> None:
    assert _row(Delete(tweet_id=BIG, author_id=3, created_at=9)) == (
        TWEETS, 1, 5, Kind.DELETE, 3, 9, BIG, 0, 0, None, None, None, None)
    assert _row(Follow(follower_id=BIG, followee_id=MAX_ID, created_at=9)) == (
        FOLLOWS, 1, 5, Kind.FOLLOW, MAX_ID, 9, 0, BIG, 0, None, None, None, None)
    assert _row(Follow(follower_id=2, followee_id=BIG, created_at=9, active=False)) == (
        FOLLOWS, 1, 5, Kind.UNFOLLOW, BIG, 9, 0, 2, 0, None, None, None, None)
    assert _row(UserUpsert(user_id=BIG, handle="ada", name="Ada L", created_at=9)) == (
        USERS, 1, 5, Kind.USER, BIG, 9, 0, 0, 0, "ada", "Ada L", None, None)


def test_event_row_repost_and_reply() -> None:
    assert _row(Repost(tweet_id=BIG, author_id=3, original_tweet_id=MAX_ID,
                       original_author_id=4, created_at=9)) == (
        TWEETS, 1, 5, Kind.REPOST, 3, 9, BIG, 4, MAX_ID, None, None, None, None)
    assert _row(Post(tweet_id=7, author_id=3, created_at=9, text="re",
                     in_reply_to_user_id=BIG)) == (
        TWEETS, 1, 5, Kind.POST, 3, 9, 7, BIG, 0, "re", None, None, None)


@pytest.mark.parametrize(("topic", "key", "value", "reason"), [
    (TWEETS, b"1", None, "tombstone"),
    (TWEETS, b"1", b"{not json", "not JSON"),
    (TWEETS, b"1", b"\xff\xfe", "not JSON"),
    (TWEETS, b"2", encode(Post(1, 1, 1, "x"))[1], "does not match the join key"),
    (FOLLOWS, b"1", encode(Post(1, 1, 1, "x"))[1], "unknown op"),
    ("nope", b"1", b"{}", "unknown topic"),
    (USERS, b"1", b"[" * 100_000 + b"]" * 100_000, "undecodable record"),
])
def test_event_row_invalid_records_become_dead_letter_rows(
        topic: str, key: bytes, value: bytes | None, reason: str) -> None:
    row = event_row(topic, 0, 42, key, value)
    assert row[:9] == (topic, 0, 42, Kind.INVALID, 0, 0, 0, 0, 0)
    assert row[9] is None and row[10] is None
    assert reason in row[11]
    assert row[12] == (None if value is None else value[:MAX_RAW])


def test_event_row_truncates_raw_to_64_kib() -> None:
    value = b"x" * (MAX_RAW + 10)
    row = event_row(TWEETS, 0, 0, b"1", value)
    assert row[3] == Kind.INVALID and row[12] == value[:MAX_RAW]


@hypothesis_settings(deadline=None)
@given(st.sampled_from([TWEETS, FOLLOWS, USERS, ACTIVITY]), st.one_of(st.none(), st.binary(max_size=30)),
       st.one_of(st.none(), st.binary(max_size=200)))
def test_event_row_never_raises(topic: str, key: bytes | None, value: bytes | None) -> None:
    row = event_row(topic, 0, 0, key, value)
    assert len(row) == len(SOURCE_SCHEMA.fields)
    assert (row[3] == Kind.INVALID) == (row[11] is not None)
    rows_to_batch([row])  # every row fits the schema


# --- Arrow schema -----------------------------------------------------------------------

def test_arrow_schema_is_exactly_sparks() -> None:
    assert ARROW_SCHEMA.equals(to_arrow_schema(SOURCE_SCHEMA, timezone="UTC"))
    int_fields = [f for f in SOURCE_SCHEMA.fields if f.dataType.typeName() in ("long", "integer")]
    assert int_fields and not any(f.nullable for f in int_fields)


def test_rows_to_batch_keeps_big_ids_exact() -> None:
    rows = [_row(Post(tweet_id=MAX_ID - i, author_id=BIG, created_at=i, text="t"), offset=i)
            for i in range(3)] + [event_row(TWEETS, 0, 9, None, None)]
    batch = rows_to_batch(rows)
    assert batch.schema.equals(ARROW_SCHEMA)
    assert batch.column("tweet_id").to_pylist() == [MAX_ID, MAX_ID - 1, MAX_ID - 2, 0]
    assert batch.column("tweet_id").type == pa.int64()
    assert rows_to_batch([]).num_rows == 0


# --- offsets and limits -----------------------------------------------------------------

def test_offsets_serialize_in_sorted_key_order() -> None:
    offsets = encode_offsets({"b_tweets:1": 5, "a_users:0": 1, "b_tweets:0": 7})
    assert json.dumps(offsets) == '{"a_users:0": 1, "b_tweets:0": 7, "b_tweets:1": 5}'


def test_fair_share_fills_small_partitions_and_splits_the_rest() -> None:
    assert fair_share({"a": 5, "b": 100, "c": 100, "d": 0}, 105) == {
        "a": 5, "b": 50, "c": 50, "d": 0}
    assert fair_share({"a": 5, "b": 7}, 1000) == {"a": 5, "b": 7}


@hypothesis_settings(deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 10_000), max_size=8),
       st.integers(1, 20_000))
def test_fair_share_properties(available: dict[str, int], budget: int) -> None:
    share = fair_share(available, budget)
    assert set(share) == set(available)
    assert all(0 <= share[k] <= available[k] for k in available)
    assert sum(share.values()) == min(budget, sum(available.values()))


def test_options_parse_is_case_insensitive_and_checked() -> None:
    options = SourceOptions.parse({"bootstrap": "h:1", "MAXRECORDSPERBATCH": "10",
                                   "startingOffsets": "Latest", "partitions": "3"})
    assert (options.max_records_per_batch, options.starting_offsets, options.partitions) == (
        10, "latest", 3)
    with pytest.raises(ValueError, match="bootstrap"):
        SourceOptions.parse({})
    with pytest.raises(ValueError, match="startingOffsets"):
        SourceOptions.parse({"bootstrap": "h:1", "startingOffsets": "middle"})


# --- against the broker, without Spark ------------------------------------------------------

ProduceEvents = Callable[[list[Event]], None]


@pytest.fixture
def produce_events(kafka_settings: KafkaSettings) -> Iterator[ProduceEvents]:
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap, "linger.ms": 20,
                         "acks": "all", "enable.idempotence": True})

    def send(events: list[Event]) -> None:
        for event in events:
            key, value = encode(event)
            producer.produce(kafka_settings.topic(event.topic), key=key, value=value)
        assert producer.flush(30) == 0, "records still unacknowledged after 30 s"

    yield send


def _events(n: int, start: int = 0) -> list[Event]:
    """A mix of every event type with ids near 2^63."""
    out: list[Event] = []
    for i in range(start, start + n):
        author = BIG - i % 13
        match i % 4:
            case 0 | 1:
                out.append(Post(tweet_id=MAX_ID - i, author_id=author, created_at=i, text=f"t{i}"))
            case 2:
                out.append(Follow(follower_id=i + 1, followee_id=author, created_at=i))
            case _:
                out.append(UserUpsert(user_id=author, handle=f"u{i}", name="", created_at=i))
    return out


def _options(settings: KafkaSettings, **extra: Any) -> SourceOptions:
    return SourceOptions(bootstrap=settings.bootstrap, topic_prefix=settings.topic_prefix,
                         **extra)


@pytest.mark.broker
def test_reader_plans_and_reads_exact_ranges(kafka_settings: KafkaSettings,
                                             produce_events: ProduceEvents) -> None:
    produce_events(_events(400))
    reader = KafkaStreamReader(_options(kafka_settings))
    start = reader.initialOffset()
    assert list(start) == sorted(start) and set(start.values()) == {0}
    limited = reader.latestOffset(start, ReadMaxRows(100))
    assert sum(limited.values()) == 100
    end = reader.latestOffset(start, ReadAllAvailable())
    assert sum(end.values()) == 400
    assert reader.latestOffset(end, ReadAllAvailable()) == end  # nothing new
    batches = [b for part in reader.partitions(start, end)
               for b in pickle.loads(pickle.dumps(reader)).read(part)]
    assert all(b.schema.equals(ARROW_SCHEMA) for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.num_rows == 400
    assert table.column("kind").to_pylist().count(Kind.INVALID) == 0
    assert max(table.column("tweet_id").to_pylist()) == MAX_ID


@pytest.mark.broker
def test_reader_refuses_offsets_past_the_end(kafka_settings: KafkaSettings,
                                            produce_events: ProduceEvents) -> None:
    produce_events(_events(40))
    reader = KafkaStreamReader(_options(kafka_settings))
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    past = {key: n + 5 if n else n for key, n in end.items()}  # a checkpoint of a lost log
    with pytest.raises(OffsetsPastEnd, match=r"read up to offset \d+ but it now ends at"):
        reader.latestOffset(past, ReadAllAvailable())
    with pytest.raises(OffsetsPastEnd, match="fanout rebuild"):
        KafkaStreamReader(_options(kafka_settings)).partitions(end, past)


@pytest.mark.broker
def test_read_raises_when_records_do_not_arrive(kafka_settings: KafkaSettings) -> None:
    part = KafkaRange(kafka_settings.topic(TWEETS), 0, 0, 5)
    with pytest.raises(KafkaReadError, match=r"no record for 1 s at offset 0"):
        list(read_range(_options(kafka_settings, read_timeout=1.0), part))


@pytest.mark.broker
def test_read_turns_bad_records_into_rows(kafka_settings: KafkaSettings) -> None:
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap})
    topic = kafka_settings.topic(FOLLOWS)
    for value in (None, b"garbage", encode(Follow(1, 2, 3))[1]):
        producer.produce(topic, key=encode_key(2), value=value, partition=1)
    assert producer.flush(30) == 0
    rows = pa.Table.from_batches(read_range(_options(kafka_settings),
                                            KafkaRange(topic, 1, 0, 3))).to_pylist()
    assert [r["kind"] for r in rows] == [Kind.INVALID, Kind.INVALID, Kind.FOLLOW]
    assert [r["offset"] for r in rows] == [0, 1, 2]
    assert rows[0]["raw"] is None and rows[1]["raw"] == b"garbage"


@pytest.mark.broker
def test_one_consumer_reads_ranges_of_several_partitions_exactly_in_the_order_given(
        kafka_settings: KafkaSettings) -> None:
    """Each range whole and alone, in offset order, the ranges in the order asked; a
    partition's records past its range's end are left, an empty range gives nothing."""
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap})
    topic = kafka_settings.topic(FOLLOWS)
    for i in range(24):
        producer.produce(topic, key=encode_key(i), value=encode(Follow(i, i + 1, i))[1],
                         partition=i % 2)
    assert producer.flush(30) == 0
    ranges = [KafkaRange(topic, 1, 1, 9), KafkaRange(kafka_settings.topic(TWEETS), 0, 3, 3),
              KafkaRange(topic, 0, 2, 10)]
    read = [(part.partition, row["partition"], row["offset"])
            for part, batch in read_ranges(_options(kafka_settings, batch_rows=3), ranges)
            for row in batch.to_pylist()]
    assert read == [(1, 1, o) for o in range(1, 9)] + [(0, 0, o) for o in range(2, 10)]


# --- Spark ------------------------------------------------------------------------------------

class Collector:
    """foreachBatch sink keeping each micro-batch's rows (one action per batch)."""

    def __init__(self) -> None:
        self.batches: dict[int, Any] = {}

    def __call__(self, frame: Any, batch_id: int) -> None:
        self.batches[batch_id] = frame.toPandas()


def _run_available_now(spark: Any, settings: KafkaSettings, checkpoint: Path,
                       **options: str) -> Collector:
    sink = Collector()
    reader = (spark.readStream.format(FORMAT).option("bootstrap", settings.bootstrap)
              .option("topic_prefix", settings.topic_prefix))
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (reader.load().writeStream.foreachBatch(sink).trigger(availableNow=True)
             .option("checkpointLocation", str(checkpoint)).start())
    finished = query.awaitTermination(180)
    assert finished, "availableNow query still running after 180 s"
    assert query.exception() is None
    return sink


@pytest.mark.spark
def test_source_ddl_matches_schema(spark: Any) -> None:
    assert spark.createDataFrame([], SOURCE_DDL).schema == SOURCE_SCHEMA


@pytest.mark.spark
def test_session_is_configured_for_the_job(spark: Any) -> None:
    conf = spark.conf
    assert conf.get("spark.sql.streaming.stateStore.providerClass").endswith(
        "RocksDBStateStoreProvider")
    assert conf.get("spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype") == "true"
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.sql.shuffle.partitions") == "2"
    frame = spark.createDataFrame([(MAX_ID, None)], "id BIGINT NOT NULL, maybe BIGINT")
    assert frame.toPandas()["id"].tolist() == [MAX_ID]


@pytest.mark.parametrize(("output", "major"), [
    ('openjdk version "17.0.15" 2025-04-15', 17),
    ('java version "1.8.0_402"', 8),
    ('openjdk version "21" 2023-09-19', 21),
    ("no java here", None),
])
def test_java_major_version(output: str, major: int | None) -> None:
    from infra.services.spark import java_major_version

    assert java_major_version(output) == major


@pytest.mark.spark
@pytest.mark.broker
def test_streaming_query_reads_everything_in_limited_batches_and_resumes(
        spark: Any, kafka_settings: KafkaSettings, produce_events: ProduceEvents,
        tmp_path: Path) -> None:
    checkpoint = tmp_path / f"ckpt-{uuid.uuid4().hex}"
    produce_events(_events(2500))
    first = _run_available_now(spark, kafka_settings, checkpoint, maxRecordsPerBatch="1000")
    sizes = [len(b) for _, b in sorted(first.batches.items())]
    assert sum(sizes) == 2500
    assert len(sizes) >= 3 and max(sizes) <= 1000
    frames = list(first.batches.values())
    ids = {int(x) for frame in frames for x in frame["tweet_id"]}
    assert MAX_ID in ids and str(frames[0]["tweet_id"].dtype) in ("int64", "Int64")
    seen = {(r.topic, r.partition, r.offset) for frame in frames for r in frame.itertuples()}
    assert len(seen) == 2500

    produce_events(_events(300, start=2500))
    second = _run_available_now(spark, kafka_settings, checkpoint, maxRecordsPerBatch="1000")
    new = [r for frame in second.batches.values() for r in frame.itertuples()]
    assert len(new) == 300
    assert not seen & {(r.topic, r.partition, r.offset) for r in new}


def _process_all_available(query: Any, timeout: float = 180) -> None:
    """query.processAllAvailable(), bounded: it has no timeout of its own."""
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            query.processAllAvailable()
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(timeout)
    if waiter.is_alive():
        query.stop()
        pytest.fail(f"query did not process all available data within {timeout:.0f} s")
    if errors:
        raise errors[0]


@pytest.mark.spark
@pytest.mark.broker
def test_continuous_query_follows_new_records(
        spark: Any, kafka_settings: KafkaSettings, produce_events: ProduceEvents,
        tmp_path: Path) -> None:
    sink = Collector()
    query = (spark.readStream.format(FORMAT).option("bootstrap", kafka_settings.bootstrap)
             .option("topic_prefix", kafka_settings.topic_prefix)
             .option("maxRecordsPerBatch", "500").load()
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "c"))
             .start())
    try:
        total = 0
        for start, n in ((0, 1200), (1200, 7), (1207, 1)):
            produce_events(_events(n, start=start))
            total += n
            _process_all_available(query)
            rows = sum(len(frame) for frame in sink.batches.values())
            assert rows == total
    finally:
        query.stop()
    assert max(len(frame) for frame in sink.batches.values()) <= 500
