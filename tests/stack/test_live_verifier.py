"""The live verifier on a real stack: no false divergence across a job SIGKILL, and
divergence found in a store that was tampered with.

One stack (Kafka, the view job in local mode, the API with auth on, and the live
verifier, each started by ``fanout up``) in a run directory, driven with the
``fanout`` commands as in ``tests/stack/test_recovery.py``. A generated history is
replayed at a pace; the job is SIGKILLed (with its JVM and Python workers) once it
has applied its first batch, with the view part way through the history, and brought
back with ``fanout up``. The verifier, running all along, must then compare users —
checked grows once the view has caught up and the users the last batches touched
have waited out the API's celebrity cache — and never count one divergent, nor a
transient mismatch (SQLite commits a batch's rows with its offsets); both of its
samplers report every check correct within 60 s (its nines, DESIGN §8). Then rows are
deleted from the SQLite store behind the job's back: the verifier must count
divergence and log it with its first difference. The other tests are the parts:
the monitor header, the log tail, the first difference and the exported names.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from prometheus_client import generate_latest, start_http_server

from infra import webclient
from infra.checks.logtail import LogTail
from infra.checks.verifier import VerifierMetrics, first_difference, summary
from infra.cli import main
from infra.stack.stack import Stack
from ingest.events import TWEETS, Activity, Post, encode_key
from ingest.producer import ChangelogProducer
from tests.support.api import activity_records, bearer, open_store, serve, settings
from tests.support.process import wait_for
from tests.support.stack import Run, finish, job_status, kill, speedup_of, tree
from views.kafka_offsets import EndOffsets
from views.reference import HomeRow

pytestmark = [pytest.mark.xdist_group("stack")]  # its worker group: tests/plugins/workers.py

class _Run(Run):
    def env(self) -> dict[str, str]:
        # Batches of at most 1,500 records: the kill lands with the view part way through
        # the history (~7,600 records) however slowly the job starts.
        # A celebrity's records stay recent (not compared) for the API's full reload of
        # its celebrity cache; 10 s here, so that the test waits it out in seconds.
        env = {**super().env(), "FANOUT_VERIFIER_RATE": "10",
               "FANOUT_MAX_RECORDS_PER_BATCH": "1500", "FANOUT_CELEBRITY_FULL_RELOAD_S": "10"}
        del env["FANOUT_AUTH"]  # auth on: the verifier reads with tokens it mints
        return env


def _applied(run: Run) -> dict[str, Any]:
    """The offsets the view has applied, as the API's /healthz says."""
    return webclient.get(f"{run.stack()['api_url']}/healthz", timeout=10).json()["applied_offsets"]


def _behind(run: Run) -> int:
    """Records of the log the view has not applied yet."""
    applied = {(t, int(p)): o for t, parts in _applied(run).items() for p, o in parts.items()}
    kafka = run.kafka()
    ends = EndOffsets(kafka.bootstrap)
    return sum(end - 1 - applied.get((kafka.logical(t), p), -1)
               for (t, p), end in ends.ends(ends.topic_partitions(kafka.physical_topics())).items())


def _verifier(run: Run) -> dict[str, Any]:
    url = run.stack()["verifier_port"]
    text = webclient.get(f"http://127.0.0.1:{url}/metrics", timeout=10).text
    return summary(text)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Run]:
    root = tmp_path_factory.mktemp("live-verifier")
    state = _Run(root, root / "history")
    state.fanout("generate", "--out", str(state.history), "--users", "200", "--follows",
                 "2500", "--tweets", "2500", "--seed", "17")
    try:
        yield state
    finally:
        state.down_leaving_nothing()


@pytest.mark.e2e
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_no_false_divergence_across_a_job_sigkill(run: _Run) -> None:
    up = run.fanout("up")
    assert "verifier: started" in up.stdout, up.stdout
    # A paced replay of ~20 s (REPLAY_S). The job's first batch lands 8-37 s after `up`
    # on two cores, with the replay running or done: its batches of at most 1,500
    # records leave the view part way through the history's ~7,600 at the kill.
    replay = run.replay(speedup_of(run.history))
    wait_for(lambda: _applied(run), 300, "the view job's first batch", every=0.5)
    time.sleep(2)
    behind = _behind(run)
    kill(tree(run.stack()["pids"]["job"]))  # the job, its JVM and Python workers
    assert replay.poll() is None or behind, "the view had applied the whole replay"
    before_restart = _verifier(run)
    finish(replay)
    up = run.fanout("up")
    assert "job: started" in up.stdout and "verifier: was running" in up.stdout, up.stdout
    wait_for(lambda: job_status(run), 300, "the job to catch up with the log", every=1.0)
    caught_up = _verifier(run)
    # Users the last batches touched wait out the API's celebrity cache (its full reload).
    wait_for(lambda: _verifier(run)["checked"] >= caught_up["checked"] + 30, 180,
             "the verifier to compare 30 more users after the catch-up", every=1.0)
    seen = _verifier(run)
    print(f"the verifier at the kill: {before_restart}; after the catch-up: {seen}")
    assert seen["divergent"] == 0 and seen["transient"] == 0, (before_restart, seen)
    # Every check of both samplers, across the kill, was right within 60 s (SQLite).
    nines = seen["consistent_within"]
    for span in ("recent", "total"):
        for sampler in "ab":
            assert nines[span][sampler]["checks"] > 0, nines
            assert nines[span][sampler]["60s"] == 1.0, nines
    status = run.fanout("status")
    assert '"verifier": {' in status.stdout and '"divergent": 0' in status.stdout, status.stdout
    assert '"consistent_within": {' in status.stdout, status.stdout


@pytest.mark.e2e
@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_tampered_store_is_reported_divergent(run: _Run) -> None:
    run.fanout("up")  # already up after the test above; this test also runs alone
    if not _applied(run):
        run.fanout("replay", "--no-progress", str(run.history))
    wait_for(lambda: job_status(run), 300, "the job to catch up with the log", every=1.0)
    assert _verifier(run)["divergent"] == 0
    store = Path(run.stack()["store_url"].removeprefix("sqlite:///"))
    with sqlite3.connect(store, timeout=30) as db:  # each user's newest cached entries go
        gone = db.execute(
            "DELETE FROM home_timeline WHERE (user_id, created_at) IN "
            "(SELECT user_id, max(created_at) FROM home_timeline GROUP BY user_id)").rowcount
        db.execute("UPDATE page_version SET version = version + 1")  # no cached page survives
    assert gone > 50
    wait_for(lambda: _verifier(run)["divergent"] >= 3, 120,
             "the verifier to report the tampered timelines divergent", every=1.0)
    logged = (run.run_dir / "logs" / "verifier.log").read_text()
    assert "DIVERGENT: user" in logged and "expected (entry_id=" in logged, logged[-3000:]


def test_a_monitor_read_is_served_but_is_not_activity(tmp_path: Path, kafka_settings) -> None:
    """The verifier's reads (X-Fanout-Monitor) must not keep sampled users active."""
    store = open_store(tmp_path)
    try:
        with serve(settings(store), store, kafka_settings) as client:
            monitor = {"X-Fanout-Monitor": "1"}
            fast = client.get("/v1/users/5/home", headers={**bearer(5), **monitor})
            # A body header sends the read past the fast path, to the route.
            routed = client.get("/v1/users/6/home",
                                headers={**bearer(6), **monitor, "Content-Length": "0"})
            plain = client.get("/v1/users/7/home", headers=bearer(7))
            assert [r.status_code for r in (fast, routed, plain)] == [200, 200, 200]
            assert fast.json()["entries"] == [] and routed.json()["user_id"] == "6"
            records = activity_records(kafka_settings, want=1)
    finally:
        store.close()
    assert [r.user_id for r in records] == [7]


def test_the_first_difference_names_the_entry_and_its_fields() -> None:
    a, b, c = (HomeRow(i, 1000 + i, 7, i, 7) for i in (3, 2, 1))
    assert first_difference([a, b], [a, c]) == (
        "entry 1: expected (entry_id=2, created_at=1002, actor_id=7, original_tweet_id=2, "
        "original_author_id=7), served (entry_id=1, created_at=1001, actor_id=7, "
        "original_tweet_id=1, original_author_id=7)")
    assert first_difference([a, b], [a]).startswith("entry 1: expected (entry_id=2")
    assert first_difference([a], [a, b]).startswith("entry 1: expected nothing more, served")
    assert first_difference([a], "not served (404: gone)") == (
        "expected 1 entries, not served (404: gone)")


def test_the_exported_names_are_the_dashboards() -> None:
    metrics = VerifierMetrics()
    metrics.checked.inc(3)
    metrics.divergent.inc()
    metrics.skipped.labels("moved").inc(2)
    text = generate_latest(metrics.registry).decode()
    assert "fanout_verify_checked 3.0" in text and "fanout_verify_divergent 1.0" in text
    shown = summary(text)
    assert shown["checked"] == 3 and shown["divergent"] == 1 and shown["transient"] == 0
    assert shown["skipped"] == {"moved": 2, "touched": 0, "unavailable": 0}


def test_the_tail_holds_records_until_released_up_to_an_offset(kafka_settings) -> None:
    """Records past the released offsets wait; an invalid one and activity are no events."""
    kafka = kafka_settings
    posts = [Post(100 + i, 7, 1_700_000_000_000 + i, f"post {i}") for i in range(6)]
    with ChangelogProducer(kafka) as producer:
        where = [producer.send_sync(p) for p in posts[:3]]
        producer.send_sync(Activity(7, 1_700_000_000_000))
        where += [producer.send_sync(p) for p in posts[3:]]
    bad = Producer({"bootstrap.servers": kafka.bootstrap, "partitioner": "murmur2_random"})
    bad.produce(kafka.topic(TWEETS), key=encode_key(7), value=b"{not json")
    assert bad.flush(30) == 0
    tail = LogTail(kafka).start()
    try:
        assert {w.partition for w in where} == {where[0].partition}  # one author's partition
        part = where[0].partition
        end = {(TWEETS, part): where[-1].offset + 1}  # the invalid record
        wait_for(lambda: tail.poll(0.2) >= 0 and tail.reached(end), 30, "the tail to read")
        assert tail.pending() == 7
        first = tail.release({(TWEETS, part): where[2].offset})
        assert first == posts[:3]
        assert list(tail.held({(TWEETS, part): where[4].offset})) == posts[3:5]
        assert tail.release(end) == posts[3:]
        assert tail.pending() == 0 and tail.release(end) == []
    finally:
        tail.close()


def test_status_shows_the_verifier_and_off_means_not_part_of_the_stack(tmp_path, capsys):
    metrics = VerifierMetrics()
    metrics.checked.inc(12)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    try:
        stack = Stack(run_dir=str(tmp_path), bootstrap="", store_url="",
                      api_url="http://127.0.0.1:1", pids={"verifier": os.getpid()},
                      markers={"verifier": "python"}, local_kafka=False,
                      verifier_port=server.server_port)
        stack.save()
        assert main(["--run-dir", str(tmp_path), "status"]) == 1  # job and API stopped
    finally:
        server.shutdown()
        server.server_close()
    shown = json.loads(capsys.readouterr().out)
    assert shown["services"] == {"job": "stopped", "api": "stopped", "verifier": "running"}
    assert shown["verifier"]["checked"] == 12 and shown["verifier"]["divergent"] == 0
    assert shown["verifier"]["consistent_within"]["total"]["b"]["checks"] == 0
    stack.settings["FANOUT_VERIFIER"] = "off"
    assert "verifier" not in stack.state()
