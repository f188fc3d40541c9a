"""A run's xdist workers share one session node (tests/plugins/shared.py), which the
controller stops at the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.plugins.shared import Started, joined, stop_recorded
from tests.support.paths import ROOT

#: Each file's test writes down the broker its session got, and the pid listening there.
_TEST = '''
import os
from pathlib import Path

from tests.support.process import listener


def test_{name}(kafka_bootstrap):
    pid = listener(kafka_bootstrap).pid
    Path(os.environ["SHARED_OUT"], "{name}").write_text(f"{{kafka_bootstrap}} {{pid}}")
'''


@pytest.mark.broker
def test_two_workers_use_one_broker_and_the_run_stops_it(tmp_path: Path) -> None:
    tests, out, base = tmp_path / "t", tmp_path / "out", tmp_path / "base"
    for d in (tests, out):
        d.mkdir()
    (tests / "pytest.ini").write_text("[pytest]\n")
    for name in ("a", "b"):
        (tests / f"test_{name}.py").write_text(_TEST.format(name=name))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
         str(tests / "pytest.ini"), "--rootdir", str(tests), "-p", "tests.plugins.shared",
         "-p", "tests.plugins.kafka", "-n", "2", "--dist", "loadfile", "--basetemp", str(base),
         str(tests)], cwd=ROOT, env={**_env(), "SHARED_OUT": str(out)},
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = {(out / name).read_text() for name in ("a", "b")}
    assert len(seen) == 1, seen  # one broker, one pid, for both workers
    pid = int(seen.pop().split()[1])
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert [p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("popen")] == [
        "kafka"]
    assert not list(base.glob("shared-*.json"))


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP"}


def test_a_record_whose_pid_was_reused_is_not_stopped(tmp_path: Path) -> None:
    # A node that died, its pid taken by another process: only the record goes.
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        joined(tmp_path, "node", lambda _: Started("here", sleeper.pid))
        record = tmp_path / "shared-node.json"
        assert joined(tmp_path, "node", lambda _: pytest.fail("started twice")) == "here"
        record.write_text(record.read_text().replace('"create_time": ', '"create_time": 1'))
        assert stop_recorded(tmp_path) == [] and not record.exists()
        assert sleeper.poll() is None
        joined(tmp_path, "node", lambda _: Started("here", sleeper.pid))
        assert stop_recorded(tmp_path) == ["node"]
        assert not psutil.pid_exists(sleeper.pid)  # terminated, and reaped by the wait
    finally:
        sleeper.kill()
        sleeper.wait()
