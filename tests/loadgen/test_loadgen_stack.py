"""The load generator for real: ``fanout load --compare`` and plain ``locust`` on a live stack.

One stack (Kafka, Spark view job, API with auth off) is started for the
module in a temporary run directory and filled with a tiny synthetic history; both
load runs are subprocesses, as a user would run them, bounded in time, loopback only.
The runs that drive every action of the social mix (account deletions included) come
last, since they change the data the others read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.errors import LoadRunError
from infra.load.prep import STARTED, History, api_for, seed, target
from infra.load.run import api_processes
from infra.stack.launch import up
from infra.stack.stack import Stack, down
from loadgen.action import ACTION_NAMES, HOME, HOME_NEXT, REPLY, REPOST, TWEETS
from loadgen.recording import Recorder
from loadgen.streamer import STREAM
from loadgen.summary import PERCENTILES, label
from tests.support.paths import ROOT

pytestmark = [pytest.mark.xdist_group("stack"),
              pytest.mark.e2e, pytest.mark.spark, pytest.mark.broker, pytest.mark.timeout(420)]

RATE, DURATION, WARMUP = 40, 8, 2
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
    run_dir = tmp_path_factory.mktemp("load-stack")
    env = {"FANOUT_AUTH": "off", "FANOUT_API_ACCESS_LOG": "false",
           "FANOUT_CELEBRITY_THRESHOLD": "40"}
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
        assert 0 < row["api cores"] <= (os.cpu_count() or 1), row
    assert "fan-out-on-write vs fan-out-on-read" in done.stdout


def test_the_read_mode_baseline_is_served_by_as_many_processes_as_the_stack(
        stack: Stack, tmp_path: Path):
    # --compare puts the same load on both modes: a baseline with fewer API processes
    # would queue sooner, and the comparison would flatter fan-out on write.
    with target(Path(stack.run_dir), url=None, start=False, history=History(),
                allow_remote=False, auth="off", keep=False) as load, \
            api_for("read", load, auth=False, logs=tmp_path) as read_api:
        served = {url: api_processes(url) for url in (stack.api_url, read_api)}
    assert len(served[read_api]) == len(served[stack.api_url]) == (os.cpu_count() or 1), served


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
    assert server["processes"] == (os.cpu_count() or 1) and server["cpu_s"] > 0, server


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
