"""The view job's metrics without Spark: progress dicts in, Prometheus series out.

:class:`views.metrics.JobMetrics` is fed the JSON of Spark's ``StreamingQueryProgress``
in the shape the view query reports it (taken from a run of ``views.job.start_query``
on Spark 4, its state operator's custom metrics trimmed), the store's batch log and
log ends. The exporter (:mod:`views.exporter`) is then run for real — HTTP server and the
thread that polls the query and reads the store and Kafka — against a Kafka node and
a SQLite store, with the Spark session and query mocked; ``fanout status`` reads its
endpoint back.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import httpx
import pytest
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.listener import StreamingQueryProgress

from infra import webclient
from infra.cli import main
from infra.stack.stack import Stack
from ingest.settings import KafkaSettings
from tests.support.job_metrics import KAFKA, QUERY_ID, RUN_ID, STARTED, logged, progress, samples
from views.delta import Delta
from views.exporter import export
from views.metrics import JobMetrics, JobMetricsSettings, summary
from views.stores.sqlite import SQLiteStore


def idle(next_batch: int) -> dict[str, Any]:
    """What a trigger that found no data reports: the next batch's id, no addBatch."""
    p = progress(next_batch, rows=0, ms=12)
    p["durationMs"] = {"latestOffset": 10, "triggerExecution": 12}
    p["timestamp"] = "2026-11-27T00:00:00.000Z"
    return p


def scrape(metrics: JobMetrics) -> dict[str, float]:
    """Every sample of a render, by name and labels (``name{k=v,...}``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return samples(generate_latest(registry).decode())


def test_a_progress_becomes_the_batch_series():
    metrics = JobMetrics(KAFKA)
    metrics.progress(progress())
    got = scrape(metrics)
    assert got["fanout_job_batch_duration_seconds_count"] == 1
    assert got["fanout_job_batch_duration_seconds_sum"] == pytest.approx(1.199)
    assert got["fanout_job_batch_duration_seconds_bucket{le=1.5}"] == 1
    assert got["fanout_job_batch_duration_seconds_bucket{le=1.0}"] == 0
    assert got["fanout_job_input_rows_total"] == 499
    assert got["fanout_job_last_batch_id"] == 1
    assert got["fanout_job_last_batch_duration_seconds"] == pytest.approx(1.199)
    assert got["fanout_job_last_batch_input_rows"] == 499
    assert got["fanout_job_last_batch_timestamp_seconds"] == pytest.approx(STARTED)
    operator = "operator=transformWithStateInPandasExec"
    assert got[f"fanout_job_state_rows{{{operator}}}"] == 102
    assert got[f"fanout_job_state_memory_bytes{{{operator}}}"] == 2127208
    assert got[f"fanout_job_state_disk_bytes{{{operator}}}"] == 12251
    assert not any(name.endswith("_created") for name in got)


def test_each_batch_counts_once_and_a_new_run_counts_afresh():
    metrics = JobMetrics(KAFKA)
    metrics.progress(progress(1, rows=10))
    metrics.progress(progress(1, rows=10))  # the same report twice
    metrics.progress(idle(2))  # no batch ran: nothing counts, and batch 2 still will
    metrics.progress(progress(2, rows=5))
    assert scrape(metrics)["fanout_job_input_rows_total"] == 15
    assert metrics.counted(RUN_ID) == 2 and metrics.counted("another-run") == -1
    metrics.progress(progress(0, run_id="another-run", rows=7))  # a restart numbers from 0
    got = scrape(metrics)
    assert got["fanout_job_input_rows_total"] == 22
    assert got["fanout_job_batch_duration_seconds_count"] == 3
    assert got["fanout_job_last_batch_id"] == 0


def test_offsets_behind_are_the_log_end_minus_the_newest_batch_end():
    metrics = JobMetrics(KAFKA)
    assert metrics.partitions() == []
    metrics.log_ends({("cap_tweets", 0): 200})
    assert not any(k.startswith("fanout_job_offsets_behind") for k in scrape(metrics))
    metrics.progress(progress())
    assert ("cap_tweets", 1) in metrics.partitions() and len(metrics.partitions()) == 8
    metrics.log_ends({("cap_tweets", 0): 200, ("cap_tweets", 1): 174, ("cap_users", 0): 31})
    got = scrape(metrics)
    assert got["fanout_job_offsets_behind{partition=0,topic=tweets}"] == 68
    assert got["fanout_job_offsets_behind{partition=1,topic=tweets}"] == 0
    assert got["fanout_job_offsets_behind{partition=0,topic=users}"] == 1
    # The project's Python source reports "topic:partition" keys, as JSON text.
    metrics.progress(progress(2, ends=json.dumps({"cap_tweets:0": 190, "cap_tweets:1": 174})))
    assert scrape(metrics)["fanout_job_offsets_behind{partition=0,topic=tweets}"] == 10
    metrics.log_ends(None)  # Kafka did not answer: unknown, not stale
    assert not any(k.startswith("fanout_job_offsets_behind") for k in scrape(metrics))


def test_freshness_and_rows_out_come_from_the_batch_log_once_each():
    metrics = JobMetrics(KAFKA)
    metrics.batches([logged(2, 30, 400), logged(1, 20, None), logged(0, 10, 2_000)])
    metrics.batches([logged(3, 5, 700), logged(2, 30, 400)])  # 2 is seen already
    got = scrape(metrics)
    assert got["fanout_job_output_rows_total"] == 65
    # Batch 1 applied no event with a time (only offsets): no freshness to say.
    assert got["fanout_job_freshness_seconds_count"] == 3
    assert got["fanout_job_freshness_seconds_sum"] == pytest.approx(3.1)
    assert got["fanout_job_freshness_seconds_bucket{le=0.5}"] == 1
    assert got["fanout_job_freshness_seconds_bucket{le=0.75}"] == 2
    metrics.batches([logged(0, 1, 100)])  # a rebuilt checkpoint starts again at 0
    assert scrape(metrics)["fanout_job_output_rows_total"] == 66
    metrics.dead_letters(4)
    assert scrape(metrics)["fanout_job_dead_letters"] == 4


def test_summary_reads_lag_freshness_and_the_last_batch_back():
    metrics = JobMetrics(KAFKA)
    metrics.progress(progress())
    metrics.log_ends({("cap_tweets", 0): 140, ("cap_follows", 1): 400})
    metrics.batches([logged(i, 1, 300) for i in range(99, 1, -1)]
                    + [logged(1, 1, 20_000), logged(0, 1, 20_000)])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    shown = summary(generate_latest(registry).decode(), now=STARTED + 2.5)
    assert shown["offsets_behind"] == 48
    assert shown["most_behind"] == "follows/1: 40"
    # 98 batches at 0.3 s and 2 at 20 s: exact ranks, not bucket bounds.
    assert (shown["freshness_p50_s"], shown["freshness_p99_s"]) == (0.3, 20.0)
    assert shown["last_batch"] == {"id": 1, "seconds": 1.199, "input_rows": 499, "age_s": 2.5}
    assert summary("", now=0.0) == {"offsets_behind": None, "most_behind": None,
                                    "freshness_p50_s": None, "freshness_p99_s": None,
                                    "last_batch": None}


def test_recent_freshness_forgets_all_but_the_newest_hundred_batches():
    metrics = JobMetrics(KAFKA)
    metrics.batches([logged(i, 1, 20_000) for i in range(49, -1, -1)])  # a replayed history
    assert scrape(metrics)["fanout_job_recent_freshness_seconds{quantile=0.99}"] == 20
    metrics.batches([logged(i, 1, 400) for i in range(149, 49, -1)])
    got = scrape(metrics)
    assert got["fanout_job_recent_freshness_seconds{quantile=0.99}"] == pytest.approx(0.4)
    assert got["fanout_job_freshness_seconds_bucket{le=+Inf}"] == 150  # the histogram keeps all


# -- the exporter, for real but for Spark ----------------------------------------------------

@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    opened = SQLiteStore(tmp_path / "v.sqlite", cap=50).open()
    now = int(time.time() * 1000)
    opened.apply([Delta.source_offset("tweets", 0, 4, now - 700),
                  Delta.dead_letter("tweets", 1, 9, "bad", b"{")], batch_id=0)
    yield opened
    opened.close()


def _produce(kafka: KafkaSettings, partition: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(count):
        producer.produce(kafka.topic("tweets"), value=b"{}", key=str(i).encode(),
                         partition=partition)
    assert producer.flush(30) == 0


def _mocked(query_id: str) -> tuple[MagicMock, MagicMock]:
    spark = MagicMock(spec_set=SparkSession)
    spark.conf.get.return_value = "127.0.0.1"
    query = MagicMock(spec_set=StreamingQuery)
    query.id = query_id
    query.isActive = True
    query.lastProgress = None
    query.recentProgress = []
    return spark, query


def _until(what: str, check: Any, deadline_s: float = 15.0) -> Any:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    pytest.fail(f"{what} within {deadline_s}s")


def _scraped_once(url: str, name: str, value: float) -> dict[str, float]:
    """The endpoint's samples once ``name`` shows ``value``."""
    return _until(f"{name} = {value}", lambda: (
        lambda got: got if got.get(name) == value else None)(
        samples(webclient.get(url, timeout=5).text)))


@pytest.mark.broker
def test_the_exporter_serves_a_query_from_its_progress_log_and_kafka(kafka_settings, store):
    _produce(kafka_settings, 0, 7)
    _produce(kafka_settings, 1, 3)
    spark, query = _mocked(QUERY_ID)
    exporter = export(spark, query, store, kafka_settings, JobMetricsSettings(port=0))
    assert exporter is not None
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    ends = {kafka_settings.topic("tweets"): {"0": 2, "1": 3}}
    ran = [StreamingQueryProgress.fromJson(progress(i, ends=ends, rows=10)) for i in range(3)]
    # Batches 0 and 1 ended before the first poll: they come from recentProgress.
    query.recentProgress, query.lastProgress = ran, ran[-1]
    got = _scraped_once(url, "fanout_job_offsets_behind{partition=0,topic=tweets}", 5)
    assert got["fanout_job_offsets_behind{partition=1,topic=tweets}"] == 0
    assert got["fanout_job_input_rows_total"] == 30
    assert got["fanout_job_batch_duration_seconds_count"] == 3
    assert got["fanout_job_freshness_seconds_count"] == 1
    assert 0.6 < got["fanout_job_freshness_seconds_sum"] < 5
    assert got["fanout_job_dead_letters"] == 1
    query.lastProgress = StreamingQueryProgress.fromJson(idle(3))
    time.sleep(0.6)  # a couple of polls
    query.lastProgress = StreamingQueryProgress.fromJson(progress(3, ends=ends, rows=4))
    got = _scraped_once(url, "fanout_job_input_rows_total", 34)
    assert got["fanout_job_batch_duration_seconds_count"] == 4  # the idle report is no batch
    assert got["fanout_job_last_batch_id"] == 3
    query.isActive = False  # the query stopped: the endpoint goes with it
    _until("the endpoint to close", lambda: _refused(url))


def _refused(url: str) -> bool:
    try:
        webclient.get(url, timeout=1)
    except httpx.TransportError:
        return True
    return False


def test_a_taken_port_costs_the_metrics_not_the_job(store, caplog):
    spark, query = _mocked(QUERY_ID)
    first = export(spark, query, store, KAFKA, JobMetricsSettings(port=0))
    assert first is not None
    try:
        again = export(spark, query, store, KAFKA, JobMetricsSettings(port=first.port))
        assert again is None and "not served" in caplog.text
    finally:
        first.close()


def test_status_shows_the_job_at_a_glance(tmp_path, capsys):
    metrics = JobMetrics(KAFKA)
    metrics.progress(progress())
    metrics.log_ends({("cap_tweets", 0): 140})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        Stack(run_dir=str(tmp_path), bootstrap="", store_url="", api_url="http://127.0.0.1:1",
              pids={"job": os.getpid()}, markers={"job": "python"}, local_kafka=False,
              job_metrics_port=server.server_port).save()
        assert main(["--run-dir", str(tmp_path), "status"]) == 1  # the API is not running
    finally:
        server.shutdown()
        server.server_close()
    shown = json.loads(capsys.readouterr().out)
    assert shown["services"] == {"job": "running", "api": "stopped", "verifier": "stopped"}
    job = shown["view_job"]
    assert job["metrics"] == f"http://127.0.0.1:{server.server_port}/metrics"
    assert (job["offsets_behind"], job["most_behind"]) == (8, "tweets/0: 8")
    assert job["last_batch"]["id"] == 1 and job["freshness_p99_s"] is None
