"""One stack for real: its metrics, then ``fanout load --compare`` and plain ``locust`` on it.

One stack (Kafka, the Spark view job in local mode, the API with auth off and
:data:`API_WORKERS` workers) is started for the module in a temporary run directory
and filled with a tiny synthetic history. First its metrics are read, before any load
changes the counts: once the job has caught up, ``fanout status`` shows it 0 offsets
behind with a last batch and a freshness; the job's endpoint counts every record of
the topics read and a live post's batch as fresh; every scrape of the API, whichever
worker answers, counts every read; and each series the Grafana dashboard asks for is
in those two scrapes (or is the live verifier's). Then the load runs, as
subprocesses a user would type, bounded in time, loopback only. The runs that drive
every action of the social mix (account deletions included) come last, since they
change the data the others read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import webclient
from infra.errors import LoadRunError
from infra.load.prep import STARTED, History, api_for, seed, target
from infra.load.run import api_processes
from infra.stack.launch import up
from infra.stack.stack import Stack, down
from loadgen.action import ACTION_NAMES, HOME, HOME_NEXT, REPLY, REPOST, TWEETS
from loadgen.recording import Recorder
from loadgen.streamer import STREAM
from loadgen.summary import PERCENTILES, label
from tests.support.dashboard import DASHBOARD, FROM_THE_VERIFIER, metric_names, walk_panels
from tests.support.job_metrics import samples
from tests.support.paths import ROOT
from tests.support.process import wait_for
from tests.support.stack import Run, job_status
from views.kafka_offsets import EndOffsets

pytestmark = [pytest.mark.xdist_group("stack"),
              pytest.mark.e2e, pytest.mark.spark, pytest.mark.broker, pytest.mark.timeout(420)]

RATE, DURATION, WARMUP = 40, 8, 2
#: The API's processes: two at least, so that scrapes reach more than one worker.
API_WORKERS = max(2, os.cpu_count() or 1)
#: Reads made before the API's scrapes are compared.
READS = 20
#: Every action of the social mix, often enough to show in a short run (its real
#: weights give a block or an account deletion every few thousand actions).
EVERY_ACTION = ("social:home=6,tweets=2,post=2,reply=3,repost=3,unrepost=2,delete=1,follow=1,"
                "unfollow=1,block=1,unblock=1,mute=1,unmute=1,delete_account=1")
#: The non-2xx answers each request may get by design (loadgen.action): a deleted
#: account's timeline, a reply to or repost of a tweet deleted meanwhile, a repost of
#: one reposted already from the other process.
EXPECTED = {HOME: {"404"}, HOME_NEXT: {"404"}, TWEETS: {"404"}, REPLY: {"404"},
            REPOST: {"404", "409"}, STREAM: {"404"}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = Run(tmp_path_factory.mktemp("load-stack"), Path()).run_dir
    env = {"FANOUT_AUTH": "off", "FANOUT_API_ACCESS_LOG": "false",
           "FANOUT_CELEBRITY_THRESHOLD": "40", "FANOUT_API_WORKERS": str(API_WORKERS)}
    running = up(run_dir, extra_env=env)
    try:
        seed(running, History(users=300, follows=3000, tweets=1500, celebrity_threshold=40,
                              seed=3), run_dir / "history")
        yield running
    finally:
        down(run_dir)


def _env() -> dict[str, str]:
    """The test process's environment minus anything pointing at another stack."""
    drop = ("KAFKA_BOOTSTRAP", "FANOUT_STORE", "FANOUT_API_URL", "FANOUT_TOPIC_PREFIX")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("LOCUST_")}


@pytest.mark.timeout(900)  # includes starting the module's stack
def test_status_the_job_endpoint_and_every_api_scrape_show_the_stack(stack: Stack):
    run = Run(Path(stack.run_dir).parent, Path(stack.run_dir).parent / "history")
    api = stack.api_url
    posted = webclient.post(f"{api}/v1/tweets", json={"text": "fresh"},
                        headers={"X-User-Id": "1"}, timeout=30)
    assert posted.status_code == 202, posted.text
    job = wait_for(lambda: job_status(run), 300, "`fanout status` to show the job caught up",
                   every=1.0)
    assert job["metrics"] == f"http://127.0.0.1:{run.stack()['job_metrics_port']}/metrics"
    shown = json.loads(run.fanout("status").stdout)["view_job"]  # the command itself
    assert shown["metrics"] == job["metrics"] and shown["offsets_behind"] >= 0, shown
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
    names = {n.split("{")[0] for n in scraped} | api_names | FROM_THE_VERIFIER
    for expr in (t["expr"] for p in walk_panels(json.loads(DASHBOARD.read_text())["panels"])
                 for t in p.get("targets", [])):
        assert metric_names(expr) <= names, (expr, sorted(metric_names(expr) - names))


def _log_end_total(run: Run) -> int:
    kafka = run.kafka()
    ends = EndOffsets(kafka.bootstrap)
    return sum(ends.ends(ends.topic_partitions(kafka.physical_topics())).values())


def _fresh_scrape(url: str) -> dict[str, float] | None:
    """A scrape of the job that counts a batch fresher than 30 s, else None."""
    scraped = samples(webclient.get(url, timeout=10).text)
    return scraped if scraped.get("fanout_job_freshness_seconds_bucket{le=30.0}", 0) >= 1 else None


def _every_scrape_counts_every_read(api: str) -> set[str]:
    for user in range(READS):  # a new connection each: either worker answers
        assert webclient.get(f"{api}/v1/users/{user + 1}/tweets", timeout=10).status_code == 200
    key = ("fanout_http_request_duration_seconds_count{method=GET,"
           "route=/v1/users/{user_id}/tweets,status=200}")
    # A worker counts a request once its answer is sent: the last may be counted a moment
    # after the client has it. Counts only rise, so once one scrape shows them all,
    # every later one must.
    wait_for(lambda: samples(webclient.get(f"{api}/metrics", timeout=10).text).get(key) == READS,
             10, f"a scrape counting all {READS} reads")
    counts = {samples(webclient.get(f"{api}/metrics", timeout=10).text)[key] for _ in range(6)}
    assert counts == {READS}, counts
    return {n.split("{")[0] for n in samples(webclient.get(f"{api}/metrics", timeout=10).text)}


def test_fanout_load_compare_writes_a_consistent_report(stack: Stack, tmp_path: Path):
    cmd = [sys.executable, "-m", "infra.cli", "--run-dir", stack.run_dir, "load", "--compare",
           "--rate", str(RATE), "--duration", str(DURATION), "--warmup", str(WARMUP),
           "--users", "8", "--probe-interval", "0.5", "--probe-authors", "3",
           "--reports", str(tmp_path), "--name", "t"]
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "t"
    for name in ("summary.json", "report.html", "latency-percentiles.png",
                 "over-time-fanout.png", "over-time-read.png", "fanout-lag-fanout.png"):
        assert (out / name).stat().st_size > 1000, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["auth"] == "off" and summary["run"]["modes"] == ["fanout", "read"]
    for mode, figures in summary["modes"].items():
        _check_mode(mode, figures, out)
    assert [row["mode"] for row in summary["compare"]] == ["fanout", "read"]
    assert all(isinstance(row["read p99.9"], float) for row in summary["compare"])
    # The API processes' CPU over each run, from the processes listening on its port.
    for row in summary["compare"]:
        assert 0 < row["api cores"] <= API_WORKERS, row
    assert "fan-out-on-write vs fan-out-on-read" in done.stdout


def test_the_read_mode_baseline_is_served_by_as_many_processes_as_the_stack(
        stack: Stack, tmp_path: Path):
    # --compare puts the same load on both modes: a baseline with fewer API processes
    # would queue sooner, and the comparison would flatter fan-out on write.
    with target(Path(stack.run_dir), url=None, start=False, history=History(),
                allow_remote=False, auth="off", keep=False) as load, \
            api_for("read", load, auth=False, logs=tmp_path) as read_api:
        served = {url: api_processes(url) for url in (stack.api_url, read_api)}
    assert len(served[read_api]) == len(served[stack.api_url]) == API_WORKERS, served


def test_a_run_dir_without_a_stack_names_the_one_start_keep_left_below_it(
        stack: Stack, tmp_path: Path):
    # `fanout load --start --keep` leaves its stack in <run-dir>/load: a later run
    # given <run-dir> is told where it is instead of only that none is up.
    (tmp_path / STARTED).symlink_to(stack.run_dir, target_is_directory=True)
    with pytest.raises(LoadRunError, match=f"pass --run-dir {tmp_path / STARTED}$"), \
            target(tmp_path, url=None, start=False, history=History(), allow_remote=False,
                   auth="off", keep=False):
        pass
    with pytest.raises(LoadRunError, match="--start to start one"), \
            target(tmp_path / "empty", url=None, start=False, history=History(),
                   allow_remote=False, auth="off", keep=False):
        pass


def _check_mode(mode: str, figures: dict, out: Path) -> None:
    assert figures["problems"] == [], (mode, figures["problems"])
    endpoints = figures["endpoints"]
    assert sum(e["count"] for e in endpoints.values()) == figures["all"]["count"]
    assert figures["reads"]["count"] + figures["writes"]["count"] == figures["all"]["count"]
    assert figures["all"]["errors"] == 0, endpoints
    # Open loop: first pages and writes follow the schedule; next pages come on top.
    actions = figures["all"]["count"] - endpoints.get("GET home (next page)", {}).get("count", 0)
    assert 0.8 * RATE * DURATION <= actions <= 1.2 * RATE * DURATION + 5, actions
    assert {"GET home", "POST tweet"} <= set(endpoints)
    for s in endpoints.values():
        values = [s[label(p)] for p in PERCENTILES] + [s["max"]]
        assert values == sorted(values) and 0 < values[0] < 5_000
    results = json.loads((out / mode / "hdr.json").read_text())
    assert Recorder.from_dict(results["recording"]).count() == figures["all"]["count"]
    fan = figures["fanout_latency"]
    assert fan["normal"]["count"] >= 3 and fan["normal"]["timeouts"] == 0
    assert fan["celebrity"]["count"] >= 3, "the tiny history should have celebrities"
    assert 0 < fan["normal"]["p50"] <= fan["normal"]["p99"] <= fan["normal"]["max"] < 30_000
    _check_repost_probe(fan)
    assert figures["view_lag"]["batches"] > 0
    server = figures["server"]
    assert server["processes"] == API_WORKERS and server["cpu_s"] > 0, server


def _check_repost_probe(fan: dict) -> None:
    """Reposts reached a follower, and every author read their own post back at once."""
    repost, own = fan["repost"], fan["read_your_writes"]
    assert repost["count"] >= 2 and repost["timeouts"] == repost["errors"] == 0, repost
    assert 0 < repost["p50"] <= repost["max"] < 30_000
    assert own["count"] >= repost["count"] and own["misses"] == 0, own


def _check_actions(endpoints: dict) -> None:
    """Every action of the mix was made; the only non-2xx answers are the expected ones."""
    for action, name in ACTION_NAMES.items():
        assert endpoints.get(name, {}).get("count", 0) > 0, (action, name, sorted(endpoints))
    for name, s in endpoints.items():
        assert s["errors"] == 0, (name, s)
        assert set(s["expected_status"]) <= EXPECTED.get(name, set()), (name, s)
        assert s["expected"] < s["count"], (name, s)  # some answered 2xx


def test_plain_locust_headless_run_exits_zero(stack: Stack, tmp_path: Path):
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadgen" / "locustfile.py"),
           "--headless", "-u", "5", "-r", "5", "-t", "10s", "--host", stack.api_url,
           "--fanout-users", "1-300", "--fanout-out", str(tmp_path), "--only-summary"]
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=90, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "hdr.json").read_text())
    recorder = Recorder.from_dict(results["recording"])
    assert recorder.count() > 50 and not recorder.errors
    assert "HdrHistogram latencies" in done.stderr


def test_fanout_load_drives_every_action_of_the_social_mix_in_two_processes(
        stack: Stack, tmp_path: Path):
    cmd = [sys.executable, "-m", "infra.cli", "--run-dir", stack.run_dir, "load",
           "--profile", EVERY_ACTION, "--rate", str(RATE), "--duration", str(DURATION),
           "--warmup", str(WARMUP), "--users", "8", "--processes", "2",
           "--probe-interval", "0.5", "--probe-authors", "3", "--reports", str(tmp_path),
           "--name", "every"]
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "every" / "summary.json").read_text())
    assert summary["run"]["processes"] == 2
    figures = summary["modes"]["fanout"]
    assert figures["problems"] == [], figures["problems"]
    assert figures["all"]["errors"] == 0
    _check_actions(figures["endpoints"])
    # Each process deleted accounts; the other learnt of them from a 404 (expected).
    assert figures["endpoints"]["DELETE account"]["count"] >= 2
    _check_repost_probe(figures["fanout_latency"])
    assert "expected" in done.stdout and "read-your-writes" in done.stdout
    # One of the 8 users holds a stream (social's share); the report splits its push
    # latency with the store's celebrities.
    streams, push = figures["streams"], figures["push_latency"]
    assert streams["connects"] >= 1 and streams["errors"] == streams["failed_connects"] == 0
    assert push["celebrities_known"] and push["accepted"] > 0, push
    assert "live streams:" in done.stdout


def test_plain_locust_drives_every_action_in_two_processes(stack: Stack, tmp_path: Path):
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadgen" / "locustfile.py"),
           "--headless", "-u", "6", "-r", "6", "-t", "12s", "--host", stack.api_url,
           "--processes", "2", "--fanout-users", "1-300", "--fanout-profile", EVERY_ACTION,
           "--fanout-rate", str(RATE), "--fanout-out", str(tmp_path), "--only-summary",
           "--fanout-streams", "2", "--fanout-stream-hold", "2", "--fanout-stream-away", "0.5"]
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "hdr.json").read_text())
    recorder = Recorder.from_dict(results["recording"])
    assert not recorder.errors, recorder.errors
    endpoints = {n: {"count": h.get_total_count(), "errors": 0,
                     "expected_status": results["expected"].get(n, {}),
                     "expected": sum(results["expected"].get(n, {}).values())}
                 for n, h in recorder.latency.items()}
    _check_actions(endpoints)
    # Two of the six users held streams, leaving and resuming; every post's accept
    # reached the process that joins them, with any push it made.
    streams, push = results["streams"], results["push"]
    assert streams["counts"]["connects"] >= 4 and streams["counts"]["resumes"] >= 2, streams
    assert streams["events"]["add"] > 0 and not streams["counts"].get("error"), streams
    assert push["accepted"] >= endpoints["POST tweet"]["count"] * 0.8, push
    assert all(0 <= latency < 30 for _, _, latency in push["samples"]), push["samples"]
