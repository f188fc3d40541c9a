"""The view job's metrics endpoint: Spark's progress, the batch log and Kafka in, HTTP out.

:func:`export` serves :class:`views.metrics.JobMetrics` from the driver for as long
as the query runs. One thread feeds it:

- four times a second, the query's ``lastProgress`` (two calls into the JVM). With
  a processing-time trigger, batches end at least a trigger apart, so each is seen;
  when the batch id jumps (batches shorter than the poll, or ended before the first
  poll), the ones in between come from ``recentProgress``, so every finished batch
  counts once;
- once a second, the store's batch log and dead-letter count, and the log end of
  each partition the query reads (one ListOffsets request, bounded by a short
  timeout).

``prometheus_client``'s HTTP server answers scrapes from what the thread last saw,
so a scrape never waits on Kafka, the store or the JVM. Polling, rather than a
``StreamingQueryListener``, keeps Python out of Spark's listener bus: the JVM never
calls back into a driver that may be exiting, and the thread ends with the query.

The endpoint listens on the interface the Spark driver binds (``spark.driver.
bindAddress``: loopback on one machine, every interface under spark-submit, where
executors and Prometheus must both reach the driver). A port that cannot be bound
costs the metrics, never the job.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Final

from prometheus_client import CollectorRegistry, start_http_server
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from ingest.settings import KafkaSettings
from views.kafka_offsets import EndOffsets, KafkaReadError
from views.metrics import JobMetrics, JobMetricsSettings
from views.stores.base import Store

__all__ = ("JobExporter", "JobMetricsSettings", "export")

log = logging.getLogger(__name__)

_LOOPBACK: Final = "127.0.0.1"
_POLL_S: Final = 0.25
_REFRESH_S: Final = 1.0
#: Batches read from the log per refresh: at one refresh a second, far more than run.
_BATCH_WINDOW: Final = 200
#: Longest a refresh waits for the log ends.
_KAFKA_TIMEOUT_S: Final = 2.0


def export(spark: SparkSession, query: StreamingQuery, store: Store, kafka: KafkaSettings,
           settings: JobMetricsSettings | None = None) -> JobExporter | None:
    """Serve ``query``'s metrics until it stops; None if the port cannot be bound.

    ``settings`` default to the environment's (``FANOUT_JOB_METRICS_PORT``).
    """
    settings = settings or JobMetricsSettings()
    host = spark.conf.get("spark.driver.bindAddress", None) or _LOOPBACK
    metrics = JobMetrics(kafka)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    try:
        server, _thread = start_http_server(settings.port, addr=host, registry=registry)
    except OSError as exc:
        log.error("the view job's metrics are not served: %s:%d: %s", host, settings.port, exc)
        return None
    log.info("view job metrics on http://%s:%d/metrics", host, server.server_port)
    return JobExporter(query, store, kafka, metrics, server).start()


class JobExporter:
    """The endpoint of one query: its HTTP server and the thread that feeds it."""

    def __init__(self, query: StreamingQuery, store: Store, kafka: KafkaSettings,
                 metrics: JobMetrics, server: Any) -> None:
        self.metrics, self.server = metrics, server
        self._query, self._store = query, store
        self._ends = EndOffsets(kafka.bootstrap, timeout=_KAFKA_TIMEOUT_S)
        self._seen = ("", -1, "")  # (run id, batch id, trigger time) of the last progress
        self._closed = threading.Event()
        self._warned: set[str] = set()

    @property
    def port(self) -> int:
        """The port the endpoint listens on."""
        return int(self.server.server_port)

    def start(self) -> JobExporter:
        threading.Thread(target=self._loop, name="fanout-job-metrics", daemon=True).start()
        return self

    def poll(self) -> None:
        """Feed the newest progress, and any batch finished since the last poll before it."""
        last = self._query.lastProgress
        if last is None:
            return
        progress = json.loads(last.json)
        seen = (str(progress["runId"]), int(progress["batchId"]), str(progress["timestamp"]))
        if seen == self._seen:
            return
        self._seen = seen
        if seen[1] > self.metrics.counted(seen[0]) + 1:  # batches ended between two polls
            for earlier in self._query.recentProgress:
                self.metrics.progress(json.loads(earlier.json))
        self.metrics.progress(progress)

    def refresh(self) -> None:
        """Read the batch log, the dead letters and the log ends into the metrics."""
        try:
            self.metrics.batches(self._store.batches(_BATCH_WINDOW))
            self.metrics.dead_letters(self._store.dead_letter_count())
            self._warned.discard("store")
        except Exception as exc:  # the store's own errors are the sink's to report
            self._warn("store", "the store's batch log cannot be read", exc)
        try:
            self.metrics.log_ends(self._ends.ends(self.metrics.partitions()))
            self._warned.discard("kafka")
        except KafkaReadError as exc:
            self.metrics.log_ends(None)
            self._warn("kafka", "the log ends cannot be listed", exc)

    def close(self) -> None:
        """Stop serving (idempotent); the thread ends at its next poll."""
        if not self._closed.is_set():
            self._closed.set()
            self.server.shutdown()
            self.server.server_close()

    def _loop(self) -> None:
        refreshed = 0.0
        while not self._closed.wait(_POLL_S):
            try:
                if not self._query.isActive:
                    break
            except Exception:  # the JVM is gone: the process is exiting
                break
            try:
                self.poll()
                self._warned.discard("progress")
            except Exception as exc:
                self._warn("progress", "the query's progress cannot be read", exc)
            if time.monotonic() - refreshed >= _REFRESH_S:
                self.refresh()
                refreshed = time.monotonic()
        self.close()

    def _warn(self, what: str, message: str, exc: Exception) -> None:
        """Log a failure once until it clears (it would repeat every second)."""
        if what not in self._warned:
            log.warning("view job metrics: %s: %s", message, exc)
        self._warned.add(what)
