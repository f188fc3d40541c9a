"""Spark's own Kafka source (``spark-sql-kafka-0-10``) as the job's input (DESIGN §5).

This module owns reading the changelogs with ``spark.readStream.format("kafka")``:
the JVM reads every partition of the three physical topics with ``assign()`` (no
consumer group joins, nothing committed to Kafka) and keeps the offsets in Spark's
checkpoint. Its rows (``topic, partition, offset, key, value``) go through
:func:`decode_batches` in a ``mapInArrow`` Python worker, which turns each record into
exactly the row of :data:`~views.source.SOURCE_SCHEMA` the join consumes, with the
same total function as the Python source (:func:`~views.source.event_row`): a record
that breaks the contract becomes a ``Kind.INVALID`` row with the reason and the raw
bytes, never an error. ``topic`` becomes the logical name, so ``(topic, partition,
offset)`` mean what the sink records as applied offsets.

``failOnDataLoss`` is on: a checkpoint that has read past the end of a partition
(topics deleted and recreated, a broker that lost its log) or records that vanished
before they were read stop the query with Spark's ``KAFKA_DATA_LOSS`` error, which
:func:`data_loss_message` turns into the job's own explanation (exit code 3). Off,
Spark would log a warning and skip ahead: the views would silently miss events.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Final

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ingest.settings import KafkaSettings
from views.errors import SourceError
from views.packed import PACKED_DDL, Packer, bucket_of, settle_worker
from views.row import Row
from views.settings import KAFKA_SOURCE_ENV
from views.source import SOURCE_SCHEMA, event_row, rows_to_batch

log = logging.getLogger(__name__)

FORMAT: Final = "kafka"
#: The connector's class; a session without its jars cannot load it.
PROVIDER: Final = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
#: Spark's errors that mean the checkpoint's offsets are gone from the topics: the
#: error class when the text carries it, else the data-loss message and its reason
#: (a query's exception text has the message without the class).
_LOSS: Final = re.compile(r"\[(KAFKA_DATA_LOSS\.[A-Z_]+|[A-Z_]*(?:LOST_TOPIC_PARTITIONS|"
                          r"END_OFFSET_HAS_GREATER_OFFSET)[A-Z_]*)\]\s*([^\n]*)")
_LOSS_TEXT: Final = re.compile(r"Some data may have been lost because they are not available "
                               r"in Kafka any more")
_REASON: Final = re.compile(r"Reason: ([^\n]+)")
#: The columns of Spark's Kafka rows that :func:`decode_batches` reads, in its order.
_KAFKA_COLUMNS: Final = ("topic", "partition", "offset", "key", "value")
#: How long the broker may hold a fetch that finds no new data (Kafka's default: 500 ms).
#: Spark's reader asks the broker for a partition's offset range after every fetch, on
#: the connection whose prefetch past the log's end the broker is holding; the broker
#: answers one request per connection at a time, so each partition read waited out the
#: hold. At a few writes a second a micro-batch took 1-2 s, nearly all of it there
#: (benchmarks/RESULTS.md).
FETCH_MAX_WAIT_MS: Final = 10

#: The Kafka client's own timeout: the broker did not answer within the API timeout.
_TIMEOUT: Final = re.compile(r"org\.apache\.kafka\.common\.errors\.TimeoutException:?[^\n]*")


class ConnectorMissing(SourceError):
    """Spark's Kafka connector jars are not on the session's class path."""


def read_stream(spark: SparkSession, kafka: KafkaSettings, *, max_records_per_batch: int,
                broker_retry_s: float, buckets: int | None = None) -> DataFrame:
    """The changelogs as a stream of :data:`~views.source.SOURCE_SCHEMA` rows.

    With ``buckets``, packed per key bucket instead (:mod:`views.packed`): the
    bucket comes from the record's Kafka key in the JVM, and the decode packs.
    ``maxOffsetsPerTrigger`` caps a micro-batch (split over partitions in proportion
    to their backlog). ``broker_retry_s`` bounds each admin call to an unreachable
    broker, as the Python source's retry budget does.
    """
    raw = kafka_rows(spark, kafka, max_records_per_batch, broker_retry_s)
    if buckets is None:
        return raw.mapInArrow(decode_batches(kafka.topic_prefix), SOURCE_SCHEMA)
    # One decode task per core, not one per topic partition: each task costs a
    # worker round trip and the daemon's gc.collect(), whatever its size.
    try:
        raw = raw.coalesce(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext: keep Spark's split
        log.debug("no SparkContext: one decode task per topic partition")
    return (raw.withColumn("bucket", key_bucket(buckets))
            .mapInArrow(decode_packed(kafka.topic_prefix), PACKED_DDL))


def key_bucket(buckets: int) -> Column:
    """The bucket of a Kafka record's key, computed in the JVM.

    A valid record's key is its join key in decimal (ingest.events.encode_key), so
    this is the bucket of the decoded key; any other key is a dead letter anyway.
    """
    return bucket_of(F.col("key").cast("string").try_cast("long"), buckets)


def kafka_rows(spark: SparkSession, kafka: KafkaSettings, max_records_per_batch: int,
               broker_retry_s: float) -> DataFrame:
    """The changelogs' Kafka records as Spark's Kafka source reads them (``_KAFKA_COLUMNS``)."""
    require_connector(spark)
    timeout_ms = str(max(30_000, int(broker_retry_s * 1000)))
    raw = (spark.readStream.format(FORMAT)
           .option("kafka.bootstrap.servers", kafka.bootstrap)
           .option("subscribe", ",".join(kafka.physical_topics()))
           .option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", str(max_records_per_batch))
           .option("failOnDataLoss", "true")
           .option("kafka.default.api.timeout.ms", timeout_ms)
           .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
           .load()
           .select(*_KAFKA_COLUMNS))
    return raw


def require_connector(spark: SparkSession) -> None:
    """Raise :class:`ConnectorMissing`, saying how to fix it, if the jars are absent."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        return  # Spark Connect: the server's class path is not ours to check
    try:
        jvm.org.apache.spark.util.Utils.classForName(PROVIDER, True, False)
    except Exception as exc:  # py4j wraps the ClassNotFoundException
        msg = ("Spark's Kafka source (org.apache.spark:spark-sql-kafka-0-10_2.13) is not on "
               "this SparkSession's class path: run `fanout jars spark-kafka` (or `make "
               "install`) once with access to Maven Central, then start the job again; or "
               f"set {KAFKA_SOURCE_ENV}=python to read with the project's Python source")
        raise ConnectorMissing(msg) from exc


def decode_batches(topic_prefix: str) -> Callable[[Iterable[pa.RecordBatch]],
                                                  Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: Kafka rows in, source rows out, never raising."""
    def decode(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        logical: dict[str, str] = {}
        for batch in batches:
            rows: list[Row] = []
            for topic, partition, offset, key, value in zip(
                    *(batch.column(c).to_pylist() for c in _KAFKA_COLUMNS), strict=True):
                name = logical.get(topic)
                if name is None:
                    name = logical[topic] = topic.removeprefix(topic_prefix)
                rows.append(event_row(name, partition, offset, key, value))
            yield rows_to_batch(rows)
    return decode


def decode_packed(topic_prefix: str) -> Callable[[Iterable[pa.RecordBatch]],
                                                 Iterator[pa.RecordBatch]]:
    """The job's ``mapInArrow`` function: Kafka rows with a bucket in, packed rows out.

    Each record is decoded as :func:`decode_batches` does, then packed by
    :class:`views.packed.Packer`; it never raises.
    """
    def decode(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settle_worker()
        logical: dict[str, str] = {}
        packer = Packer()
        for batch in batches:
            if batch.num_rows == 0:
                continue
            for topic, partition, offset, key, value, bucket in zip(
                    *(batch.column(c).to_pylist() for c in (*_KAFKA_COLUMNS, "bucket")),
                    strict=True):
                name = logical.get(topic)
                if name is None:
                    name = logical[topic] = topic.removeprefix(topic_prefix)
                packer.add(bucket, event_row(name, partition, offset, key, value))
            yield packer.batch()
    return decode


def unreachable_message(error: str) -> str | None:
    """The job's explanation of the Kafka client giving up on the broker, else None."""
    found = _TIMEOUT.search(error)
    if found is None:
        return None
    return (f"Spark's Kafka source gave up on the broker ({found.group(0).strip()}). "
            f"Start the view job again once the broker is back with its topics; it resumes "
            f"from its checkpoint")


def data_loss_message(error: str) -> str | None:
    """The job's explanation of a Spark data-loss error in ``error``, else None."""
    found = _LOSS.search(error)
    if found is not None:
        what = f"{found.group(1)}: {found.group(2).strip()}"
    elif _LOSS_TEXT.search(error):
        reason = _REASON.search(error)
        what = reason.group(1).strip() if reason else "KAFKA_DATA_LOSS"
    else:
        return None
    return (f"Spark's Kafka source found that records this view job's checkpoint refers "
            f"to are gone from the changelog topics ({what}). The topics were deleted and "
            f"recreated, or the broker lost its log. The views cannot continue from this checkpoint. To "
            f"recover: stop the job, run `fanout rebuild` (it moves the checkpoint and the "
            f"store aside), start the job again and replay the history into the broker "
            f"(`fanout replay DIR`).")
