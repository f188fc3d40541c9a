"""The streaming view job: Kafka source → per-author join → store (DESIGN §5).

``start_query`` wires the pieces on a given SparkSession; ``run`` is the long-running
entry point used by ``fanout job`` / ``fanout up``: it opens the store, starts the
query, logs progress, and stops cleanly on SIGTERM/SIGINT. The checkpoint path is
versioned with the state layout, the shuffle partition count and the number of key
buckets, because changing any of them makes an old checkpoint unreadable (DESIGN §10).
A checkpoint of another state layout beside it is refused, not silently left behind:
its views must be rebuilt (:func:`other_layout`); so is one asked for settings the
checkpoint cannot take (:mod:`views.fingerprint`, checked and recorded by :func:`run`).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from ingest.settings import KafkaSettings
from views import connector, fingerprint
from views.codec import LAYOUT
from views.delta import PACKED_DELTA_DDL
from views.errors import BrokerUnreachable, OffsetsPastEnd, ViewError
from views.exporter import JobMetricsSettings, export
from views.packed import PACKED_DDL, bucket_of, pack_source_batches
from views.processor import JoinProcessor
from views.settings import CHECKPOINT_DIR_ENV, STORE_ENV, ViewSettings
from views.sink import Sink, SpoolingSink
from views.source import FORMAT as PYTHON_FORMAT
from views.stores.base import ViewWriter

log = logging.getLogger(__name__)
QUERY_NAME = "fanout_views"


def checkpoint_path(view: ViewSettings) -> Path:
    """Where this state layout and partitioning keep their checkpoint."""
    return view.checkpoint_dir / (f"state-v{LAYOUT}-p{view.shuffle_partitions}"
                                  f"-b{view.key_buckets}")


_LAYOUT_DIR = re.compile(r"state-v(\d+)(?:-|$)")


def other_layout(view: ViewSettings) -> str | None:
    """Why the job must not start: its checkpoint directory holds views of another layout.

    A job of this layout would start afresh beside such a checkpoint and apply the
    whole log again onto the store the old one kept; the state cannot be carried over
    (:data:`views.codec.LAYOUT`), so the views are rebuilt from the topics instead.
    None when this layout's checkpoint has started, or no other one has.
    """
    if _started(checkpoint_path(view)):
        return None
    for old in sorted(view.checkpoint_dir.glob("state-v*")):
        found = _LAYOUT_DIR.match(old.name)
        if found and int(found.group(1)) != LAYOUT and _started(old):
            return (f"the checkpoint {old} keeps the join's state in layout "
                    f"v{found.group(1)}; this job keeps layout v{LAYOUT} and cannot read it. "
                    "Rebuild the views from the topics: run `fanout rebuild` (it sets the "
                    "checkpoint and the SQLite store aside), start the job again, and "
                    "replay the history (`fanout replay DIR`) if the topics no longer hold "
                    "all of it; or build them beside the live views, which go on "
                    "serving meanwhile: `fanout rebuild --beside` (DESIGN §5; by hand: a "
                    f"job with a new {CHECKPOINT_DIR_ENV} and {STORE_ENV})")
    return None


def _started(checkpoint: Path) -> bool:
    return any(checkpoint.glob("offsets/*"))


def spooling_sink(view: ViewSettings, store: ViewWriter) -> SpoolingSink:
    """The job's sink, after applying any batch an earlier run left spooled."""
    sink = SpoolingSink(store, checkpoint_path(view) / "spool")
    recovered = sink.recover()
    if recovered:
        log.info("applied %d spooled batch(es) left by the previous run", recovered)
    return sink


def job_sink(view: ViewSettings, store: ViewWriter, *, spool: bool = True) -> Sink:
    """The sink for ``store``: the backend's own, else the driver's.

    A backend that takes writes from many clients at once builds its own sink for
    the checkpoint (:meth:`~views.stores.base.ViewWriter.job_sink`), so its batches
    never leave the executors; any other store's batches come to the driver and are
    applied there (spooled, with ``spool``; see :mod:`views.sink`).
    """
    own = store.job_sink(checkpoint_path(view))
    if own is not None:
        if spool and (checkpoint_path(view) / "spool").is_dir():
            spooling_sink(view, store)  # batches an older, driver-side run left behind
        return own
    return spooling_sink(view, store) if spool else Sink(store)


def start_query(spark: SparkSession, kafka: KafkaSettings, view: ViewSettings,
                store: ViewWriter, *, available_now: bool = False,
                sink: Sink | None = None) -> StreamingQuery:
    """Start the view query; ``available_now`` drains what is there and stops.

    Without a ``sink`` it writes synchronously (:func:`job_sink` without spooling),
    so a drained query has applied everything; :func:`run` spools the driver's batches.
    Raises :class:`~views.errors.ViewError` beside a checkpoint of another state
    layout (:func:`other_layout`).
    """
    refused = other_layout(view)
    if refused is not None:
        raise ViewError(refused)
    packed = read_source(spark, kafka, view, view.records_per_batch(store))
    deltas = packed.groupBy("bucket").transformWithStateInPandas(
        statefulProcessor=JoinProcessor(view.join_config(), view.state_page_bytes),
        outputStructType=PACKED_DELTA_DDL, outputMode="Append", timeMode="None")
    writer = (deltas.writeStream.queryName(QUERY_NAME)
              .foreachBatch(sink or job_sink(view, store, spool=False))
              .option("checkpointLocation", str(checkpoint_path(view))))
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif view.trigger_seconds > 0:
        writer = writer.trigger(processingTime=f"{view.trigger_seconds} seconds")
    return writer.start()


def read_source(spark: SparkSession, kafka: KafkaSettings, view: ViewSettings,
                records: int) -> DataFrame:
    """The changelogs packed per key bucket, read with the source ``view.kafka_source`` names.

    A micro-batch takes at most ``records`` records (:meth:`ViewSettings.records_per_batch`).

    Packing: :mod:`views.packed`. Both sources read the same rows
    (``views.source.SOURCE_SCHEMA``) with the same offsets, so the checkpoint's
    offsets differ in form only: switching sources needs a new checkpoint (the state
    and the store stay valid only with ``fanout rebuild``).
    """
    if view.kafka_source == "spark":
        return connector.read_stream(spark, kafka,
                                     max_records_per_batch=records,
                                     broker_retry_s=view.broker_retry_s,
                                     buckets=view.key_buckets)
    rows = (spark.readStream.format(PYTHON_FORMAT)
            .option("bootstrap", kafka.bootstrap)
            .option("topic_prefix", kafka.topic_prefix)
            .option("partitions", str(kafka.partitions))
            .option("maxRecordsPerBatch", str(records))
            .option("brokerRetrySeconds", str(view.broker_retry_s))
            .load())
    return (rows.withColumn("bucket", bucket_of(F.col("key"), view.key_buckets))
            .mapInArrow(pack_source_batches, PACKED_DDL))


def run(spark: SparkSession, kafka: KafkaSettings, view: ViewSettings,
        stop: threading.Event,
        on_started: Callable[[], object] | None = None,
        metrics: JobMetricsSettings | None = None) -> int:
    """Run the job until ``stop`` is set (the caller owns signals); return an exit code."""
    view = fingerprint.adopted(view)
    refused = other_layout(view)
    if refused is not None:
        log.error("view job not started: %s", refused)
        return EXIT_LAYOUT
    refused = fingerprint.refusal(view, checkpoint_path(view))
    if refused is not None:
        log.error("view job not started: %s", refused)
        return EXIT_SETTINGS
    fingerprint.record(view)
    store = view.store().open()
    sink = job_sink(view, store)
    query = start_query(spark, kafka, view, store, sink=sink)
    export(spark, query, store, kafka, metrics)
    log.info("view job started: store %s, checkpoint %s, at most %s records a batch",
             view.store_url, checkpoint_path(view), f"{view.records_per_batch(store):,}")
    if on_started is not None:
        on_started()
    try:
        while not stop.wait(5.0):
            if query.exception() is not None:
                return _failed(str(query.exception()))
            _log_progress(query.lastProgress)
        return 0
    finally:
        query.stop()
        sink.close()
        store.close()
        log.info("view job stopped")


#: Exit code of a job stopped because its checkpoint is past the end of the topics.
EXIT_PAST_END = 3
#: Exit code of a job that gave up on an unreachable broker.
EXIT_BROKER = 4
#: Exit code of a job that found a checkpoint of another state layout (:func:`other_layout`).
EXIT_LAYOUT = 5
#: Exit code of a job asked for settings its checkpoint cannot take (:mod:`views.fingerprint`).
EXIT_SETTINGS = 6


def _failed(error: str) -> int:
    """Log why the query failed — the source's own words when it is one of ours."""
    for explain, code in ((connector.data_loss_message, EXIT_PAST_END),
                          (connector.unreachable_message, EXIT_BROKER)):
        explained = explain(error)  # Spark's Kafka source fails in the JVM's words
        if explained is not None:
            log.error("view job stopped: %s", explained)
            return code
    for name, code in ((OffsetsPastEnd.__name__, EXIT_PAST_END),
                       (BrokerUnreachable.__name__, EXIT_BROKER)):
        # The source runs in a Python worker: its exception reaches us as text.
        reason = re.search(rf"{name}: (.+)", error)
        if reason is not None:
            log.error("view job stopped: %s", reason.group(1).strip())
            return code
    log.error("view query failed: %s", error)
    return 1


def _log_progress(progress: dict[str, Any] | None) -> None:
    if progress:
        log.info("batch %s: %s input rows, %.0f rows/s, %s ms",
                 progress.get("batchId"), progress.get("numInputRows"),
                 progress.get("processedRowsPerSecond") or 0.0,
                 (progress.get("durationMs") or {}).get("triggerExecution"))
