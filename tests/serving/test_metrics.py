"""``GET /metrics`` over real HTTP, parsed with prometheus_client's own text parser.

The store holds a logged micro-batch history, dead letters and a celebrity, written
through :meth:`Store.apply` as the job's sink writes them; requests of every kind
(200, 400, 401, 404, 413, a write refused with 503) must show up by route template.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infra import webclient
from serving.app import create_app
from tests.support.api import bearer, open_store, running, serve, settings, unreachable_kafka
from tests.support.metrics import HOME, batch, scrape, value
from views.delta import Delta
from views.stores.sqlite import SQLiteStore


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SQLiteStore]:
    store = open_store(tmp_path_factory.mktemp("metrics"))
    now_ms = int(time.time() * 1000)
    for batch_id in range(3):
        batch(store, batch_id, now_ms - 60_000 + batch_id * 1000, dead=2)
    store.apply([Delta.celebrity(5, True)])
    yield store
    store.close()


@pytest.fixture(scope="module")
def client(store: SQLiteStore) -> Iterator[httpx.Client]:
    config = settings(store, write_timeout_ms=300)
    with serve(config, store, unreachable_kafka()) as c:
        yield c


def test_request_latency_by_route_template_and_status(client: httpx.Client):
    client.get("/v1/users/42/home", headers=bearer(42))
    client.get("/v1/users/43/home", headers=bearer(43))
    client.get("/v1/users/42/home")  # 401
    client.get("/v1/users/x/tweets")  # 400
    client.get("/nope")  # 404
    client.post("/v1/tweets", content=b"x" * 20_000, headers=bearer(42))  # 413
    families = scrape(client)
    latency = families["fanout_http_request_duration_seconds"]
    count = "fanout_http_request_duration_seconds_count"
    assert value(latency, count, method="GET", route=HOME, status="200") == 2
    assert value(latency, count, method="GET", route=HOME, status="401") == 1
    assert value(latency, count, route="/v1/users/{user_id}/tweets", status="400") == 1
    assert value(latency, count, route="unmatched", status="404") == 1
    assert value(latency, count, method="POST", status="413") == 1
    assert not any("42" in s.labels.get("route", "") for s in latency), "raw paths leaked"
    buckets = [s for s in latency if s.name.endswith("_bucket")
               and s.labels["route"] == HOME and s.labels["status"] == "200"]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 2


def test_page_cache_reads_by_outcome(client: httpx.Client):
    def reads() -> tuple[float, float]:
        family = scrape(client)["fanout_page_cache_reads"]
        return tuple(value(family, "fanout_page_cache_reads_total", outcome=o)
                     for o in ("hit", "miss"))  # type: ignore[return-value]

    hits, misses = reads()
    for _ in range(3):  # rendered once, then from the cache while the store stands still
        assert client.get("/v1/users/44/home", headers=bearer(44)).status_code == 200
    assert reads() == (hits + 2, misses + 1)


def test_write_outcomes_and_producer_errors(client: httpx.Client):
    assert client.put("/v1/users/42/following/7", headers=bearer(42)).status_code == 503
    assert client.put("/v1/users/42/following/7").status_code == 401
    assert client.put("/v1/users/42/following/42", headers=bearer(42)).status_code == 400
    families = scrape(client)
    writes = families["fanout_write_requests"]
    route = "PUT /v1/users/{user_id}/following/{other_id}"
    for outcome in ("unavailable", "unauthenticated", "invalid"):
        assert value(writes, "fanout_write_requests_total", route=route, outcome=outcome) >= 1
    errors = families["fanout_producer_errors"]
    assert value(errors, "fanout_producer_errors_total") >= 1


def test_view_series_come_from_the_store(client: httpx.Client, store: SQLiteStore):
    families = scrape(client)
    lag = value(families["fanout_view_lag_seconds"], "fanout_view_lag_seconds")
    assert 57 < lag < 120, lag  # newest applied event is ~58 s old
    assert value(families["fanout_view_last_batch_rows"], "fanout_view_last_batch_rows") == 2
    assert value(families["fanout_view_last_batch_apply_seconds"],
                  "fanout_view_last_batch_apply_seconds") > 0
    assert value(families["fanout_dead_letters"], "fanout_dead_letters_total") == 6
    assert value(families["fanout_celebrities"], "fanout_celebrities") == 1
    assert value(families["fanout_store_up"], "fanout_store_up") == 1
    assert value(families["fanout_view_applied_offset"], "fanout_view_applied_offset",
                  topic="tweets", partition="0") == 20


def test_batch_histogram_counts_each_logged_batch_once(client: httpx.Client, store: SQLiteStore):
    family, name = "fanout_view_batch_apply_seconds", "fanout_view_batch_apply_seconds_count"
    assert value(scrape(client)[family], name) == 3
    assert value(scrape(client)[family], name) == 3
    batch(store, 3, int(time.time() * 1000))
    families = scrape(client)
    assert value(families[family], name) == 4
    assert value(families["fanout_view_lag_seconds"], "fanout_view_lag_seconds") < 30


class _Unreadable(SQLiteStore):
    def celebrities(self) -> list[int]:
        msg = "disk I/O error"
        raise OSError(msg)

    def dead_letter_count(self) -> int:
        msg = "disk I/O error"
        raise OSError(msg)


def test_metrics_answer_when_the_store_cannot_be_read(tmp_path: Path):
    store = _Unreadable(tmp_path / "s.sqlite").open()
    app = create_app(settings(store), store, kafka=unreachable_kafka())
    with running(app) as base, webclient.client(base_url=base) as client:
        families = scrape(client)
    store.close()
    assert value(families["fanout_store_up"], "fanout_store_up") == 0
    assert "fanout_dead_letters" not in families
    assert math.isnan(value(families["fanout_view_lag_seconds"], "fanout_view_lag_seconds"))
    assert not any(name.endswith("_created") for samples in families.values()
                   for name in (s.name for s in samples))
