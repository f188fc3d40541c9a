"""``GET /metrics`` in the Prometheus text format: the API's and the view's health.

Request latency is a histogram by method, route template (never the raw path: ids
would explode the label set) and status, recorded by an ASGI middleware around the
whole app, so 413s and 500s count too. Write requests are also counted by outcome.
The view's figures come from the store at scrape time, each read O(1) or O(batches
logged since the last scrape): lag (now − newest applied event time), the newest
micro-batch's rows and apply time, a histogram of apply times fed from the batch
log, dead letters, celebrities and applied offsets. The batch log records how long
the sink took to write a batch to the store, not the whole Spark micro-batch (the
job's own exporter, :mod:`views.metrics`, has that), and the series are named so.
Each app has its own registry, so several apps can live in one process (tests);
``_created`` series are turned off.

Several worker processes on one port (:mod:`serving.workers`) answer a scrape
together through prometheus_client's multiprocess mode: each worker keeps its
counters and histograms in memory-mapped files in a directory made fresh for each
API start (:func:`shared_dir`), and whichever worker answers sums them all. What
the store says is the same for every worker, so it is read by the answering worker
at scrape time and reported outside those files, once (:class:`_StoreFigures`);
the batch-log histogram is fed by one worker, the *leader*, so every worker
answers the same counts. Counts held by other objects of a worker (its page cache,
activity log, producer) are copied into counters at each scrape and, with several
workers, once a second, so every worker's share is in the files.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingest.writer import WriterStats
from views.stores.contract import Store
from views.stores.rows import BatchInfo

log = logging.getLogger(__name__)

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
#: prometheus_client's own variable: where multiprocess mode keeps its files.
MULTIPROC_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
_LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                           2.5, 5.0, 10.0)
_BATCH_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                         10.0, 30.0)
#: Batches read per scrape; older unseen ones are skipped (the gauges stay right).
_BATCH_WINDOW: Final = 500
#: How often a worker of several copies its counts into the shared files (seconds).
_SYNC_S: Final = 1.0
_OUTCOMES: Final = {202: "accepted", 400: "invalid", 401: "unauthenticated",
                    403: "forbidden", 413: "invalid", 503: "unavailable"}


@contextlib.contextmanager
def shared_dir() -> Iterator[Path]:
    """Multiprocess mode in a fresh directory for this API start; removed at the end.

    prometheus_client picks how metrics keep their values when it is first imported,
    from ``PROMETHEUS_MULTIPROC_DIR``; the API decides to fork workers later, so this
    sets the variable (which the library also reads to name each worker's files) and
    makes the same choice the import would have, before any worker builds its app.
    A fresh temporary directory per start means no counts of an earlier run are
    summed in. Only for a process that forks the workers: metrics built in it
    meanwhile share one set of files.
    """
    path = Path(tempfile.mkdtemp(prefix="fanout-api-metrics-"))
    before, os.environ[MULTIPROC_DIR_ENV] = os.environ.get(MULTIPROC_DIR_ENV), str(path)
    kept = values.ValueClass
    values.ValueClass = values.MultiProcessValue()
    try:
        yield path
    finally:
        values.ValueClass = kept
        if before is None:
            os.environ.pop(MULTIPROC_DIR_ENV, None)
        else:
            os.environ[MULTIPROC_DIR_ENV] = before
        shutil.rmtree(path, ignore_errors=True)


def worker_exited(path: Path, pid: int) -> None:
    """Drop what a stopped worker's live gauges said (its counters still count)."""
    multiprocess.mark_process_dead(pid, str(path))


class Metrics:
    """The series of one app and the readers that fill them at scrape time.

    ``shared``: the multiprocess directory of a worker of several (None: this
    process alone); ``leader``: whether this process feeds the batch-log histogram.
    """

    def __init__(self, store: Callable[[], Store | None],
                 writer: Callable[[], WriterStats | None],
                 activity: Callable[[], tuple[int, int] | None] = lambda: None,
                 pages: Callable[[], tuple[int, int] | None] = lambda: None, *,
                 shared: Path | None = None, leader: bool = True) -> None:
        disable_created_metrics()  # process-wide; halves the series count
        # What a scrape renders; with several workers the metrics themselves live in
        # the shared files and must not be registered here too (they would show twice).
        self.registry = CollectorRegistry(auto_describe=shared is None)
        own = self.registry if shared is None else None
        if shared is not None:
            multiprocess.MultiProcessCollector(self.registry, path=str(shared))
        self._store, self._shared, self._leader = store, shared, leader
        self._lock = threading.Lock()
        self._last_batch = -1
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        self.requests = Histogram(
            "fanout_http_request_duration_seconds", "HTTP request latency.",
            ["method", "route", "status"], buckets=_LATENCY_BUCKETS, registry=own)
        self.writes = Counter("fanout_write_requests", "Write requests by outcome.",
                              ["route", "outcome"], registry=own)
        self.batch_seconds = Histogram(
            "fanout_view_batch_apply_seconds",
            "Time the sink took to write a micro-batch to the store, from the batch log.",
            buckets=_BATCH_BUCKETS, registry=own)
        self.streams = StreamMetrics(own)
        self._totals = _ProcessTotals(writer, activity, pages, own)
        self._view = _StoreFigures()
        self.registry.register(self._view)

    def observe(self, scope: Scope, status: int, seconds: float) -> None:
        """Record one finished request."""
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        method = scope.get("method", "")
        method = method if method in _METHODS else "other"
        self.requests.labels(method, route, str(status)).observe(seconds)
        if "writes" in getattr(scope.get("route"), "tags", ()):
            outcome = _OUTCOMES.get(status, "error" if status >= 500 else "rejected")
            self.writes.labels(f"{method} {route}", outcome).inc()

    def render(self) -> bytes:
        """The exposition text, after reading the view's figures from the store."""
        with self._lock:
            self._totals.sync()
            read = self._read_store()
            self._view.show(read, time.time())
            if read is not None and self._leader:
                self._feed(read.batches)
            return generate_latest(self.registry)

    def start(self) -> None:
        """With several workers, keep the shared files current in the background.

        Every second this worker's counts are copied in, and the leader feeds the
        batch-log histogram, so a scrape answered by any worker sees them.
        """
        if self._shared is not None and self._syncer is None:
            self._stop.clear()
            self._syncer = threading.Thread(target=self._sync_loop, name="fanout-metrics",
                                            daemon=True)
            self._syncer.start()

    def stop(self) -> None:
        """Stop copying; what was copied last stays in the files."""
        syncer, self._syncer = self._syncer, None
        if syncer is not None:
            self._stop.set()
            syncer.join()

    def _sync_loop(self) -> None:
        while not self._stop.wait(_SYNC_S):
            with self._lock:
                self._totals.sync()
                if self._leader:
                    self._feed_from_store()

    def _feed_from_store(self) -> None:
        store = self._store()
        if store is None:
            return
        try:
            self._feed(store.batches(_BATCH_WINDOW))
        except Exception:  # the next scrape says so (fanout_store_up 0)
            log.debug("metrics: the batch log cannot be read", exc_info=True)

    def _read_store(self) -> _StoreRead | None:
        store = self._store()
        if store is None:
            return None
        try:
            return _StoreRead(store.batches(_BATCH_WINDOW), len(store.celebrities()),
                              store.applied_offsets(), store.dead_letter_count())
        except Exception:  # a scrape must answer even when the store cannot be read
            log.warning("metrics: the store cannot be read", exc_info=True)
            return None

    def _feed(self, batches: list[BatchInfo]) -> None:
        if batches and batches[0].batch_id < self._last_batch:
            self._last_batch = -1  # the job restarted its batch numbering
        for batch in reversed(batches):
            if batch.batch_id > self._last_batch:
                self.batch_seconds.observe(batch.seconds)
        if batches:
            self._last_batch = batches[0].batch_id


class StreamMetrics:
    """The live streams' series (:mod:`serving.stream`), kept by the hub as it goes.

    The open-streams gauge sums the live workers' values (a stopped worker's streams
    are gone with it).
    """

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.open = Gauge("fanout_streams_open", "Live home streams open.",
                          registry=registry, multiprocess_mode="livesum")
        self.events = Counter("fanout_stream_events", "Events sent on live streams, by type.",
                              ["type"], registry=registry)
        self.resets = Counter("fanout_stream_resets", "Streams told to re-read their page "
                              "(an id past the retention, or of another view).",
                              registry=registry)
        self.cut_off = Counter("fanout_stream_cut_off", "Streams ended because the client "
                               "read too slowly, by reason (queue_full, send_timeout).",
                               ["reason"], registry=registry)
        for kind in ("add", "remove", "reset", "end"):
            self.events.labels(kind)
        for reason in ("queue_full", "send_timeout"):
            self.cut_off.labels(reason)


@dataclass(frozen=True)
class _StoreRead:
    """What one scrape read from the store."""

    batches: list[BatchInfo]
    celebrities: int
    offsets: dict[tuple[str, int], int]
    dead_letters: int


class _StoreFigures(Collector):
    """The store's figures as of the last scrape, reported by the worker that answers.

    Never in the multiprocess files: every worker would report the same store, and
    the sum would count it once per worker.
    """

    def __init__(self) -> None:
        self._families: list[Metric] = []
        self._newest_event = 0  # ms; the newest applied event time seen so far

    def show(self, read: _StoreRead | None, now: float) -> None:
        if read is not None and read.batches:
            newest = max(b.max_event_time for b in read.batches)
            self._newest_event = max(self._newest_event, newest)
        lag = max(0.0, now - self._newest_event / 1000) if self._newest_event else math.nan
        families: list[Metric] = [
            _gauge("fanout_store_up", "1 if the last scrape could read the store.",
                   0 if read is None else 1),
            _gauge("fanout_view_lag_seconds", "Now minus the newest event time the view has "
                   "applied (NaN until a logged batch has applied an event).", lag)]
        if read is not None:
            families += _read_families(read)
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)

    def describe(self) -> Iterator[Metric]:
        return iter(())


def _read_families(read: _StoreRead) -> list[Metric]:
    newest = read.batches[0] if read.batches else None
    offsets = GaugeMetricFamily("fanout_view_applied_offset",
                                "Highest applied changelog offset.",
                                labels=["topic", "partition"])
    for (topic, partition), offset in sorted(read.offsets.items()):
        offsets.add_metric([topic, str(partition)], offset)
    dead = CounterMetricFamily("fanout_dead_letters", "Changelog records that failed validation.")
    dead.add_metric([], read.dead_letters)
    return [_gauge("fanout_view_last_batch_apply_seconds",
                   "Store write time of the newest micro-batch.",
                   newest.seconds if newest else 0.0),
            _gauge("fanout_view_last_batch_rows", "Rows written by the newest micro-batch.",
                   newest.rows if newest else 0),
            _gauge("fanout_celebrities", "Authors on the celebrity (fan-out-on-read) path.",
                   read.celebrities),
            offsets, dead]


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


class _ProcessTotals:
    """Counters whose source of truth is another object of this process, copied in.

    Copying (rather than reporting at scrape time) puts each worker's share in the
    multiprocess files, where a scrape answered by any worker sums them.
    """

    def __init__(self, writer: Callable[[], WriterStats | None],
                 activity: Callable[[], tuple[int, int] | None],
                 pages: Callable[[], tuple[int, int] | None],
                 registry: CollectorRegistry | None) -> None:
        self._sources: list[tuple[Callable[[], tuple[int, ...] | None], list[Counter]]] = []
        if pages() is not None:
            self._sources.append((pages, _by_outcome(
                "fanout_page_cache_reads", "Page reads of the API answered from its page "
                "cache (hit) or rendered (miss).", ("hit", "miss"), registry)))
        if activity() is not None:
            self._sources.append((activity, _by_outcome(
                "fanout_activity_records", "Home reads appended to the activity log, by "
                "outcome (inactive users, DESIGN §4b).", ("sent", "failed"), registry)))
        if writer() is not None:
            errors = Counter("fanout_producer_errors",
                             "Writes the changelog producer failed to deliver.",
                             registry=registry)
            self._sources.append((lambda: _errors(writer()), [errors]))
        self._copied: dict[Counter, int] = {}

    def sync(self) -> None:
        """Add to each counter what its source counted since the last copy."""
        for source, counters in self._sources:
            counts = source()
            for counter, value in zip(counters, counts or (), strict=False):
                copied = self._copied.get(counter, 0)
                if value > copied:
                    counter.inc(value - copied)
                    self._copied[counter] = value


def _errors(stats: WriterStats | None) -> tuple[int] | None:
    return None if stats is None else (stats.errors,)


def _by_outcome(name: str, documentation: str, outcomes: tuple[str, ...],
                registry: CollectorRegistry | None) -> list[Counter]:
    """One child per outcome, in order; each shows from the start, at 0."""
    counter = Counter(name, documentation, ["outcome"], registry=registry)
    return [counter.labels(outcome) for outcome in outcomes]


class RequestMetrics:
    """ASGI middleware: time every HTTP request and record it with its final status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def tracking(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        finally:
            self.metrics.observe(scope, status, time.perf_counter() - start)
