"""Spark's own Kafka source (views.connector): the same rows as the Python source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from confluent_kafka import Producer

from infra.services.jars import SPARK_KAFKA, artifact_id, cached, classpath
from ingest.events import MAX_ID, Post, encode
from ingest.settings import KafkaSettings
from views import connector, job
from views.delta import DeltaKind
from views.packed import read_packed
from views.row import Kind
from views.settings import ViewSettings
from views.source import ARROW_SCHEMA, FORMAT

BIG = MAX_ID - 7


def _kafka_batch(rows: list[tuple[str, int, int, bytes | None, bytes | None]]) -> pa.RecordBatch:
    """A batch as Spark's Kafka source hands it to mapInArrow."""
    names = ["topic", "partition", "offset", "key", "value"]
    types = [pa.string(), pa.int32(), pa.int64(), pa.binary(), pa.binary()]
    return pa.RecordBatch.from_arrays(
        [pa.array([r[i] for r in rows], t) for i, t in enumerate(types)], names=names)


def test_decode_maps_physical_topics_and_dead_letters_bad_records() -> None:
    key, value = encode(Post(tweet_id=MAX_ID, author_id=BIG, created_at=7, text="hi"))
    batch = _kafka_batch([("p_tweets", 1, 10, key, value), ("p_tweets", 1, 11, key, b"{bad"),
                          ("p_users", 0, 3, b"5", None)])
    out = list(connector.decode_batches("p_")([batch]))
    assert len(out) == 1 and out[0].schema.equals(ARROW_SCHEMA)
    rows = out[0].to_pylist()
    assert [(r["topic"], r["partition"], r["offset"], r["kind"]) for r in rows] == [
        ("tweets", 1, 10, Kind.POST), ("tweets", 1, 11, Kind.INVALID),
        ("users", 0, 3, Kind.INVALID)]
    assert rows[0]["tweet_id"] == MAX_ID and rows[0]["key"] == BIG
    assert "not JSON" in rows[1]["error"] and rows[1]["raw"] == b"{bad"
    assert "tombstone" in rows[2]["error"]


def test_data_loss_errors_stop_the_job_with_exit_3_and_say_how_to_recover() -> None:
    error = ("[STREAM_FAILED] Query [id = x] terminated with exception: [KAFKA_DATA_LOSS."
             "PARTITION_OFFSET_CHANGED] Some data may have been lost because they are not "
             "available in Kafka any more; ... Partition t_tweets-0 offset was changed from "
             "40 to 3. SQLSTATE: 22000\n\tat org.apache.spark...")
    message = connector.data_loss_message(error)
    assert message is not None and "PARTITION_OFFSET_CHANGED" in message
    assert "fanout rebuild" in message
    assert job._failed(error) == job.EXIT_PAST_END
    assert connector.data_loss_message("[STREAM_FAILED] something else") is None
    # What str(query.exception()) holds: the message, without the error class.
    text = ("Some data may have been lost because they are not available in Kafka any more;\n"
            "either the data was aged out ...\nReason: Partition o_tweets-0 offset was "
            "changed from 297 to 0.\nThis could be ...")
    assert "Partition o_tweets-0 offset was changed from 297 to 0" in (
        connector.data_loss_message(text) or "")
    assert job._failed(text) == job.EXIT_PAST_END


def test_a_broker_timeout_stops_the_job_with_exit_4() -> None:
    error = ("[STREAM_FAILED] ... org.apache.kafka.common.errors.TimeoutException: Timed out "
             "waiting for a node assignment. Call: listOffsets\n\tat ...")
    assert "Timed out waiting for a node" in (connector.unreachable_message(error) or "")
    assert job._failed(error) == job.EXIT_BROKER


def test_connector_classpath_leaves_out_what_pyspark_ships() -> None:
    assert artifact_id("spark-sql-kafka-0-10_2.13-4.2.0.jar") == "spark-sql-kafka-0-10_2.13"
    assert artifact_id("zstd-jni-1.5.7-7.jar") == "zstd-jni"
    if cached(SPARK_KAFKA) is None:
        pytest.skip("the spark-kafka jars are not cached (`fanout jars spark-kafka`)")
    names = {artifact_id(p.name) for p in classpath(SPARK_KAFKA)}
    assert names == {"spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13",
                     "kafka-clients", "commons-pool2"}


@pytest.mark.spark
def test_the_broker_holds_an_empty_fetch_only_briefly(spark: Any) -> None:
    # Kafka's default hold (500 ms) made every partition read of a quiet stream wait
    # it out before Spark's offset-range request was answered (views.connector).
    frame = connector.read_stream(spark, KafkaSettings(bootstrap="127.0.0.1:1"),
                                  max_records_per_batch=100, broker_retry_s=5.0, buckets=8)
    plan = frame._jdf.queryExecution().logical().toString()
    assert f"kafka.fetch.max.wait.ms={connector.FETCH_MAX_WAIT_MS}," in plan
    assert connector.FETCH_MAX_WAIT_MS < 100


def _collect(spark: Any, frame: Any, checkpoint: Path) -> set[tuple]:
    rows: list[tuple] = []

    def sink(batch: Any, _id: int) -> None:
        rows.extend(tuple(r) for r in batch.collect())
    query = (frame.writeStream.foreachBatch(sink).trigger(availableNow=True)
             .option("checkpointLocation", str(checkpoint)).start())
    assert query.awaitTermination(300), "availableNow query still running after 300 s"
    assert query.exception() is None, query.exception()
    return set(rows)


@pytest.mark.spark
@pytest.mark.broker
def test_both_sources_give_the_same_rows(spark: Any, kafka_settings: KafkaSettings,
                                         tmp_path: Path) -> None:
    if cached(SPARK_KAFKA) is None:
        pytest.skip("the spark-kafka jars are not cached (`fanout jars spark-kafka`)")
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap})
    for i in range(300):
        key, value = encode(Post(tweet_id=MAX_ID - i, author_id=BIG - i % 5, created_at=i,
                                 text=f"t{i}"))
        producer.produce(kafka_settings.topic("tweets"), key=key, value=value)
    producer.produce(kafka_settings.topic("tweets"), key=b"3", value=b"[1]")
    producer.produce(kafka_settings.topic("users"), key=b"3", value=None)
    assert producer.flush(30) == 0
    view = ViewSettings()
    spark_rows = _collect(spark, job.read_source(
        spark, kafka_settings, view.model_copy(update={"kafka_source": "spark"}), 120),
        tmp_path / "spark")
    python_rows = _collect(spark, job.read_source(
        spark, kafka_settings, view.model_copy(update={"kafka_source": "python"}), 120),
        tmp_path / "python")
    spark_view, python_view = _unpacked(spark_rows), _unpacked(python_rows)
    changes, dead = spark_view
    assert sum(map(len, changes.values())) + len(dead) == 302
    assert spark_view == python_view
    assert FORMAT != connector.FORMAT


def _unpacked(packed: set[tuple]) -> tuple[dict, list]:
    """What the join gets from a stream's packed (bucket, rows) rows, per bucket.

    The packing follows Arrow batch boundaries, which differ between the sources, so
    the unpacked contents are compared: each key's changes in its bucket, and the
    dead letters.
    """
    by_bucket: dict[int, list[bytes]] = {}
    for bucket, blob in packed:
        by_bucket.setdefault(bucket, []).append(blob)
    changes, deltas = {}, []
    for bucket, blobs in by_bucket.items():
        got, bookkeeping = read_packed([pd.DataFrame({"rows": blobs})])
        changes |= {(bucket, key): sorted(c) for key, c in got.items()}
        # A dead letter's bucket does not matter: it reaches no state.
        deltas += [d for d in bookkeeping if d.kind == DeltaKind.DEAD]
    return changes, sorted(deltas, key=repr)
