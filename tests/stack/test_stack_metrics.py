"""The stack's metrics for real: ``fanout up``, a replay and a live post, then scrapes.

One stack (Kafka, the view job in local mode, the API with two workers) in a run
directory, driven with the ``fanout`` commands as in ``tests/stack/test_recovery.py``. Once
the job has caught up, ``fanout status`` shows it 0 offsets behind with a last batch
and a freshness; the job's endpoint counts every record of the topics read and the
live post's batch as fresh; every scrape of the API, whichever worker answers, counts
every read; and each series the Grafana dashboard asks for is in those two scrapes
(or is the live verifier's).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.support.dashboard import DASHBOARD, FROM_THE_VERIFIER, metric_names, walk_panels
from tests.support.job_metrics import samples
from tests.support.process import wait_for
from tests.support.stack import Run, job_status
from views.kafka_offsets import EndOffsets

pytestmark = [pytest.mark.xdist_group("stack"),
              pytest.mark.e2e, pytest.mark.spark, pytest.mark.timeout(900)]
READS = 20


class _Run(Run):
    def env(self) -> dict[str, str]:
        return {**super().env(), "FANOUT_API_WORKERS": "2"}


def _log_end_total(run: Run) -> int:
    kafka = run.kafka()
    ends = EndOffsets(kafka.bootstrap)
    return sum(ends.ends(ends.topic_partitions(kafka.physical_topics())).values())


def test_status_the_job_endpoint_and_every_api_scrape_show_the_stack(tmp_path: Path):
    run = _Run(tmp_path, tmp_path / "history")
    run.fanout("generate", "--out", str(run.history), "--users", "150", "--follows", "1500",
               "--tweets", "800", "--seed", "5")
    try:
        run.fanout("up")
        run.fanout("replay", "--no-progress", str(run.history))
        stack = run.stack()
        api = stack["api_url"]
        posted = httpx.post(f"{api}/v1/tweets", json={"text": "fresh"},
                            headers={"X-User-Id": "1"}, timeout=30)
        assert posted.status_code == 202, posted.text
        job = wait_for(lambda: job_status(run), 300, "`fanout status` to show the job caught up",
                       every=1.0)
        assert job["metrics"] == f"http://127.0.0.1:{stack['job_metrics_port']}/metrics"
        assert job["last_batch"]["id"] >= 0 and job["last_batch"]["age_s"] < 600
        # `status` follows the query's progress (read every 0.25 s); the freshness comes
        # from the store's batch log (read every 1 s), so the post's batch may be in the
        # one and not yet in the other: its freshness must show within a few reads.
        scraped = wait_for(lambda: _fresh_scrape(job["metrics"]), 30,
                           "the job's endpoint to count the live post's batch as fresh")
        assert scraped["fanout_job_input_rows_total"] == _log_end_total(run)
        assert scraped["fanout_job_freshness_seconds_bucket{le=30.0}"] >= 1  # the live post
        assert scraped["fanout_job_batch_duration_seconds_count"] >= 1
        api_names = _every_scrape_counts_every_read(api)
    finally:
        run.down_leaving_nothing()
    names = {n.split("{")[0] for n in scraped} | api_names | FROM_THE_VERIFIER
    for expr in (t["expr"] for p in walk_panels(json.loads(DASHBOARD.read_text())["panels"])
                 for t in p.get("targets", [])):
        assert metric_names(expr) <= names, (expr, sorted(metric_names(expr) - names))


def _fresh_scrape(url: str) -> dict[str, float] | None:
    """A scrape of the job that counts a batch fresher than 30 s, else None."""
    scraped = samples(httpx.get(url, timeout=10).text)
    return scraped if scraped.get("fanout_job_freshness_seconds_bucket{le=30.0}", 0) >= 1 else None


def _every_scrape_counts_every_read(api: str) -> set[str]:
    for user in range(READS):  # a new connection each: either worker answers
        assert httpx.get(f"{api}/v1/users/{user + 1}/tweets", timeout=10).status_code == 200
    key = ("fanout_http_request_duration_seconds_count{method=GET,"
           "route=/v1/users/{user_id}/tweets,status=200}")
    counts = {samples(httpx.get(f"{api}/metrics", timeout=10).text)[key] for _ in range(6)}
    assert counts == {READS}, counts
    return {n.split("{")[0] for n in samples(httpx.get(f"{api}/metrics", timeout=10).text)}
