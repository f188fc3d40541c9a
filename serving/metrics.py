"""``GET /metrics`` in the Prometheus text format: the API's and the view's health.

Request latency is a histogram by method, route template (never the raw path: ids
would explode the label set) and status, recorded by an ASGI middleware around the
whole app, so 413s and 500s count too. Write requests are also counted by outcome.
The view's figures come from the store at scrape time, each read O(1) or O(batches
logged since the last scrape): lag (now − newest applied event time), the newest
micro-batch's rows and apply time, a histogram of apply times fed from the batch
log, dead letters, celebrities and applied offsets. The batch log records how long
the sink took to write a batch to the store, not the whole Spark micro-batch (the
job logs that), and the series are named so. Each app has its own registry, so
several apps can live in one process (tests); ``_created`` series are turned off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingest.writer import WriterStats
from views.stores.base import BatchInfo, Store

log = logging.getLogger(__name__)

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
_LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                           2.5, 5.0, 10.0)
_BATCH_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                         10.0, 30.0)
#: Batches read per scrape; older unseen ones are skipped (the gauges stay right).
_BATCH_WINDOW: Final = 500
_OUTCOMES: Final = {202: "accepted", 400: "invalid", 401: "unauthenticated",
                    403: "forbidden", 413: "invalid", 503: "unavailable"}


class Metrics:
    """The registry of one app and the readers that fill it at scrape time."""

    def __init__(self, store: Callable[[], Store | None],
                 writer: Callable[[], WriterStats | None],
                 activity: Callable[[], tuple[int, int] | None] = lambda: None,
                 pages: Callable[[], tuple[int, int] | None] = lambda: None) -> None:
        disable_created_metrics()  # process-wide; halves the series count
        self.registry = CollectorRegistry(auto_describe=True)
        self._store = store
        self._lock = threading.Lock()
        self._last_batch = -1
        self.requests = Histogram(
            "fanout_http_request_duration_seconds", "HTTP request latency.",
            ["method", "route", "status"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.writes = Counter("fanout_write_requests", "Write requests by outcome.",
                              ["route", "outcome"], registry=self.registry)
        self._view = _ViewGauges(self.registry)
        self.batch_seconds = Histogram(
            "fanout_view_batch_apply_seconds",
            "Time the sink took to write a micro-batch to the store, from the batch log.",
            buckets=_BATCH_BUCKETS, registry=self.registry)
        self.registry.register(_Totals(store, writer, activity, pages))

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
            self._refresh()
            return generate_latest(self.registry)

    def _refresh(self) -> None:
        store = self._store()
        if store is None:
            self._view.up.set(0)
            return
        try:
            self._read_view(store)
        except Exception:  # a scrape must answer even when the store cannot be read
            log.warning("metrics: the store cannot be read", exc_info=True)
            self._view.up.set(0)
            return
        self._view.up.set(1)

    def _read_view(self, store: Store) -> None:
        self._view.celebrities.set(len(store.celebrities()))
        for (topic, partition), offset in store.applied_offsets().items():
            self._view.offsets.labels(topic, str(partition)).set(offset)
        batches = store.batches(_BATCH_WINDOW)
        self._view.show(batches, time.time())
        self._feed(batches)

    def _feed(self, batches: list[BatchInfo]) -> None:
        if batches and batches[0].batch_id < self._last_batch:
            self._last_batch = -1  # the job restarted its batch numbering
        for batch in reversed(batches):
            if batch.batch_id > self._last_batch:
                self.batch_seconds.observe(batch.seconds)
        if batches:
            self._last_batch = batches[0].batch_id


class _ViewGauges:
    """Gauges set from the store at each scrape."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.up = Gauge("fanout_store_up", "1 if the last scrape could read the store.",
                        registry=registry)
        self.lag = Gauge("fanout_view_lag_seconds",
                         "Now minus the newest event time the view has applied "
                         "(NaN until a logged batch has applied an event).", registry=registry)
        self.lag.set(float("nan"))
        self.last_seconds = Gauge("fanout_view_last_batch_apply_seconds",
                                  "Store write time of the newest micro-batch.", registry=registry)
        self.last_rows = Gauge("fanout_view_last_batch_rows",
                               "Rows written by the newest micro-batch.", registry=registry)
        self.celebrities = Gauge("fanout_celebrities",
                                 "Authors on the celebrity (fan-out-on-read) path.",
                                 registry=registry)
        self.offsets = Gauge("fanout_view_applied_offset",
                             "Highest applied changelog offset.", ["topic", "partition"],
                             registry=registry)

    def show(self, batches: list[BatchInfo], now: float) -> None:
        if not batches:
            return
        self.last_seconds.set(batches[0].seconds)
        self.last_rows.set(batches[0].rows)
        newest = max(b.max_event_time for b in batches)
        if newest > 0:
            self.lag.set(max(0.0, now - newest / 1000))


class _Totals(Collector):
    """Counters whose source of truth lives elsewhere (the store, the producer)."""

    def __init__(self, store: Callable[[], Store | None],
                 writer: Callable[[], WriterStats | None],
                 activity: Callable[[], tuple[int, int] | None],
                 pages: Callable[[], tuple[int, int] | None]) -> None:
        self._store, self._writer, self._activity = store, writer, activity
        self._pages = pages

    def collect(self) -> Iterator[Metric]:
        pages = self._pages()
        if pages is not None:
            yield _by_outcome("fanout_page_cache_reads", "Page reads of this API process "
                              "answered from its page cache (hit) or rendered (miss).",
                              {"hit": pages[0], "miss": pages[1]})
        activity = self._activity()
        if activity is not None:
            yield _by_outcome("fanout_activity_records", "Home reads appended to the "
                              "activity log, by outcome (inactive users, DESIGN §4b).",
                              {"sent": activity[0], "failed": activity[1]})
        stats = self._writer()
        if stats is not None:
            errors = CounterMetricFamily("fanout_producer_errors",
                                         "Writes the changelog producer failed to deliver.")
            errors.add_metric([], stats.errors)
            yield errors
        dead = self._dead_letters()
        if dead is not None:
            family = CounterMetricFamily("fanout_dead_letters",
                                         "Changelog records that failed validation.")
            family.add_metric([], dead)
            yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def _dead_letters(self) -> int | None:
        store = self._store()
        if store is None:
            return None
        try:
            return store.dead_letter_count()
        except Exception:  # counted as fanout_store_up 0 by the scrape itself
            return None


def _by_outcome(name: str, documentation: str, counts: dict[str, int]) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=["outcome"])
    for outcome, count in counts.items():
        family.add_metric([outcome], count)
    return family


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
