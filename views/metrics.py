"""The view job's own metrics: its lag, micro-batches, state and freshness as series.

Spark's Kafka source reads with ``assign()`` and commits no consumer-group offsets,
so no lag tool sees the job: how far it is behind, how long its micro-batches take
and how much state it keeps live in Spark's ``StreamingQueryProgress``. This module
owns the series that say it, named ``fanout_job_*`` (:class:`JobMetrics`), fed with
what :mod:`views.exporter` gathers on the driver: each finished micro-batch's
progress (its duration, input rows, end offsets and state), the store's batch log
(rows written, and post → visible freshness: the store's commit time minus the
newest event time the batch applied, one observation per batch), the dead-letter
count, and each partition's log end; offsets behind are the log end minus the
newest batch's end offset. Freshness is a histogram for Prometheus (rates over any
window) and, for a glance, exact quantiles over the newest logged batches: a
replayed history's old event times would otherwise fill the cumulative histogram's
top bucket for good. Nothing here touches Spark, Kafka or the store, so a test feeds
it progress dicts. :func:`summary` reads a scrape back into the few figures
``fanout status`` prints.
"""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from pydantic import Field

from ingest.settings import FanoutSettings, KafkaSettings, env_alias
from views.kafka_offsets import TP
from views.stores.base import BatchInfo

__all__ = ("DEFAULT_JOB_METRICS_PORT", "JOB_METRICS_PORT_ENV", "JobMetrics",
           "JobMetricsSettings", "summary")

JOB_METRICS_PORT_ENV: Final = "FANOUT_JOB_METRICS_PORT"
DEFAULT_JOB_METRICS_PORT: Final = 9417
_BATCH_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0,
                         120.0)
_FRESHNESS_BUCKETS: Final = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
                             300.0)
#: Logged batches the recent freshness quantiles are over.
_RECENT: Final = 100
_QUANTILES: Final = (0.5, 0.99)


class JobMetricsSettings(FanoutSettings):
    """Where the job's driver serves its metrics (on the interface the driver binds)."""

    port: int = Field(
        default=DEFAULT_JOB_METRICS_PORT, ge=0, le=65535,
        validation_alias=env_alias(JOB_METRICS_PORT_ENV, "port"),
        description="TCP port of the view job's Prometheus endpoint (0: any free port).")


@dataclass
class _Last:
    """The newest finished micro-batch, as its progress reported it."""

    batch_id: int = -1
    run_id: str = ""
    ends: dict[TP, int] = field(default_factory=dict)


class JobMetrics(Collector):
    """The job's series, fed with progress dicts, batch-log rows and log ends.

    Thread-safe: the exporter's thread (:mod:`views.exporter`) feeds it while the
    HTTP server collects.
    """

    def __init__(self, kafka: KafkaSettings) -> None:
        disable_created_metrics()  # process-wide; the series say nothing a scrape needs
        self._kafka = kafka
        self._lock = threading.Lock()
        self._last = _Last()
        self._log_ends: dict[TP, int] = {}
        self._last_logged = -1
        self.batch_seconds = Histogram(
            "fanout_job_batch_duration_seconds", "Micro-batch duration, planning to "
            "commit (the progress' triggerExecution).", buckets=_BATCH_BUCKETS, registry=None)
        self.freshness = Histogram(
            "fanout_job_freshness_seconds", "Post -> visible: store commit time of a batch "
            "minus the newest event time it applied, one per batch (the batch log).",
            buckets=_FRESHNESS_BUCKETS, registry=None)
        self.rows_in = Counter("fanout_job_input_rows",
                               "Changelog records the micro-batches read.", registry=None)
        self.rows_out = Counter("fanout_job_output_rows",
                                "Rows the sink wrote to the store (the batch log).", registry=None)
        self.dead = Gauge("fanout_job_dead_letters", "Dead letters the store holds.",
                          registry=None)
        self._recent: deque[float] = deque(maxlen=_RECENT)
        self._gauges = _BatchGauges()

    def progress(self, progress: Mapping[str, Any]) -> None:
        """A ``StreamingQueryProgress`` as its JSON dict; each finished batch counts once.

        A trigger that found no data reports progress too, under the id of the batch
        to come and without ``addBatch``: it ran no batch, and is left out.
        """
        batch_id, run_id = int(progress["batchId"]), str(progress.get("runId", ""))
        durations = progress.get("durationMs") or {}
        with self._lock:
            if "addBatch" not in durations or (
                    run_id == self._last.run_id and batch_id <= self._last.batch_id):
                return
            seconds = durations.get("triggerExecution", 0) / 1000
            self.batch_seconds.observe(seconds)
            self.rows_in.inc(max(0, int(progress.get("numInputRows") or 0)))
            ends = _end_offsets(progress.get("sources") or ())
            self._last = _Last(batch_id, run_id, ends or self._last.ends)
            self._gauges.show(progress, seconds)

    def counted(self, run_id: str) -> int:
        """The newest batch of run ``run_id`` counted so far (-1: none)."""
        with self._lock:
            return self._last.batch_id if self._last.run_id == run_id else -1

    def batches(self, logged: list[BatchInfo]) -> None:
        """The store's batch log, newest first: each batch not seen yet counts once."""
        with self._lock:
            if logged and logged[0].batch_id < self._last_logged:
                self._last_logged = -1  # a new checkpoint numbers its batches from 0
            for batch in reversed(logged):
                if batch.batch_id <= self._last_logged:
                    continue
                self.rows_out.inc(batch.rows)
                if batch.max_event_time > 0:
                    seconds = max(0.0, (batch.finished_at - batch.max_event_time) / 1000)
                    self.freshness.observe(seconds)
                    self._recent.append(seconds)
            if logged:
                self._last_logged = logged[0].batch_id

    def dead_letters(self, count: int) -> None:
        """How many dead letters the store holds now."""
        self.dead.set(count)

    def log_ends(self, ends: Mapping[TP, int] | None) -> None:
        """Each partition's log end now; None when Kafka did not answer (lag unknown)."""
        with self._lock:
            self._log_ends = dict(ends or {})

    def partitions(self) -> list[TP]:
        """The partitions the newest batch read up to, by physical topic."""
        with self._lock:
            return sorted(self._last.ends)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield self._behind()
            for metric in (self.batch_seconds, self.freshness, self.rows_in, self.rows_out,
                           self.dead):
                yield from metric.collect()
            yield self._recent_freshness()
            yield from self._gauges.families()

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def _behind(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "fanout_job_offsets_behind", "Log end minus the newest finished batch's end "
            "offset, per partition (absent while Kafka does not answer).",
            labels=["topic", "partition"])
        for (topic, partition), end in sorted(self._log_ends.items()):
            read = self._last.ends.get((topic, partition))
            if read is not None:
                family.add_metric([self._logical(topic), str(partition)], max(0, end - read))
        return family

    def _recent_freshness(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "fanout_job_recent_freshness_seconds", f"Post -> visible over the newest {_RECENT} "
            "logged batches that applied an event (nearest rank).", labels=["quantile"])
        ranked = sorted(self._recent)
        for q in _QUANTILES if ranked else ():
            family.add_metric([str(q)], ranked[max(0, math.ceil(q * len(ranked)) - 1)])
        return family

    def _logical(self, topic: str) -> str:
        try:
            return self._kafka.logical(topic)
        except ValueError:
            return topic


class _BatchGauges:
    """The newest batch at a glance, and the state its stateful operators keep."""

    def __init__(self) -> None:
        self._values: dict[str, float] = {}
        self._state: dict[str, tuple[float, float, float | None]] = {}

    def show(self, progress: Mapping[str, Any], seconds: float) -> None:
        self._values = {"id": float(progress["batchId"]), "duration": seconds,
                        "rows": float(progress.get("numInputRows") or 0),
                        "timestamp": _epoch(str(progress.get("timestamp", "")))}
        self._state = {
            str(op.get("operatorName", "")): (
                float(op.get("numRowsTotal") or 0), float(op.get("memoryUsedBytes") or 0),
                (op.get("customMetrics") or {}).get("rocksdbSstFileSize"))
            for op in progress.get("stateOperators") or ()}

    def families(self) -> Iterator[Metric]:
        if self._values:
            for key, name, doc in _LAST_BATCH:
                yield GaugeMetricFamily(name, doc, value=self._values[key])
        rows, memory, disk = (GaugeMetricFamily(name, doc, labels=["operator"])
                              for name, doc in _STATE)
        for operator, (n, used, sst) in sorted(self._state.items()):
            rows.add_metric([operator], n)
            memory.add_metric([operator], used)
            if sst is not None:
                disk.add_metric([operator], float(sst))
        yield from (rows, memory, disk)


_LAST_BATCH: Final = (
    ("id", "fanout_job_last_batch_id", "Id of the newest finished micro-batch."),
    ("timestamp", "fanout_job_last_batch_timestamp_seconds",
     "When the newest finished micro-batch started (epoch seconds)."),
    ("duration", "fanout_job_last_batch_duration_seconds",
     "Duration of the newest finished micro-batch."),
    ("rows", "fanout_job_last_batch_input_rows",
     "Changelog records the newest finished micro-batch read."))
_STATE: Final = (
    ("fanout_job_state_rows", "Rows the stateful operator keeps (numRowsTotal)."),
    ("fanout_job_state_memory_bytes", "Memory the operator's state store uses."),
    ("fanout_job_state_disk_bytes", "Size of the operator's RocksDB SST files."))


def _end_offsets(sources: Iterable[Mapping[str, Any]]) -> dict[TP, int]:
    """(physical topic, partition) → end offset, from every source of a progress.

    Spark's Kafka source reports ``{"topic": {"0": n}}``, the Python source
    (:mod:`views.source`) ``{"topic:0": n}``; either may come as JSON text.
    """
    ends: dict[TP, int] = {}
    for source in sources:
        offsets = source.get("endOffset")
        if isinstance(offsets, str):
            try:
                offsets = json.loads(offsets)
            except ValueError:
                continue
        for key, value in (offsets or {}).items() if isinstance(offsets, dict) else ():
            if isinstance(value, dict):
                ends.update({(key, int(p)): int(n) for p, n in value.items()})
            elif ":" in key:
                topic, partition = key.rsplit(":", 1)
                ends[(topic, int(partition))] = int(value)
    return ends


def _epoch(timestamp: str) -> float:
    """Spark's progress timestamp (``2026-01-02T03:04:05.678Z``) in epoch seconds; 0 if none."""
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def summary(text: str, now: float) -> dict[str, Any]:
    """What ``fanout status`` shows of a scrape of the job: lag, freshness, last batch."""
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    behind = [s for s in samples if s.name == "fanout_job_offsets_behind"]
    worst = max(behind, key=lambda s: s.value, default=None)
    recent = {s.labels["quantile"]: round(s.value, 3) for s in samples
              if s.name == "fanout_job_recent_freshness_seconds"}
    last = {s.name.removeprefix("fanout_job_last_batch_"): s.value for s in samples
            if s.name.startswith("fanout_job_last_batch_")}
    out: dict[str, Any] = {
        "offsets_behind": int(sum(s.value for s in behind)) if behind else None,
        "most_behind": None if worst is None else
        f"{worst.labels['topic']}/{worst.labels['partition']}: {int(worst.value)}",
        "freshness_p50_s": recent.get("0.5"), "freshness_p99_s": recent.get("0.99"),
        "last_batch": None}
    if "id" in last:
        out["last_batch"] = {"id": int(last["id"]), "seconds": round(last["duration_seconds"], 3),
                             "input_rows": int(last["input_rows"]),
                             "age_s": round(max(0.0, now - last["timestamp_seconds"]), 1)}
    return out
