"""The heartbeat of slow steps (infra.services.process): a line while a command runs, and its result."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra.services import process
from infra.services.process import Heartbeat, run_saying
from tests.support.paths import ROOT


class _Gate(logging.Handler):
    """Makes ``path`` once ``what`` has been said ``times`` times: the command it gates
    ends only then, however slowly the test's process runs."""

    def __init__(self, path: Path, what: str, times: int) -> None:
        super().__init__()
        self.path, self.what, self.left = path, what, times

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.what):
            self.left -= 1
            if self.left == 0:
                self.path.touch()


def test_a_slow_command_is_said_to_go_on_and_gives_its_output_and_status(caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="infra.services.process")
    gate = _Gate(tmp_path / "said twice", "napping: ", 2)
    logging.getLogger("infra.services.process").addHandler(gate)
    try:
        done = run_saying(["sh", "-c", f"while [ ! -e '{gate.path}' ]; do sleep 0.05; done; "
                           "echo out; echo err >&2; exit 3"], "napping",
                          timeout=30, capture=True, every=0.2)
    finally:
        logging.getLogger("infra.services.process").removeHandler(gate)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("napping: ")]
    assert len(lines) >= 2
    assert lines[-1].endswith("s so far")


def test_a_quick_command_says_nothing(caplog):
    caplog.set_level(logging.INFO, logger="infra.services.process")
    assert run_saying(["true"], "quick", timeout=30, every=5.0).returncode == 0
    assert not [r for r in caplog.records if r.getMessage().startswith("quick")]


def test_output_goes_to_the_file_given(tmp_path):
    with (tmp_path / "out.log").open("wb") as sink:
        run_saying(["sh", "-c", "echo a; echo b >&2"], "two lines", timeout=30, stdout=sink)
    assert sorted((tmp_path / "out.log").read_text().split()) == ["a", "b"]


def test_a_command_past_its_timeout_is_killed():
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_saying(["sleep", "30"], "sleeping", timeout=0.5)
    assert time.monotonic() - began < 5


def test_a_heartbeat_speaks_at_most_once_per_interval(caplog, monkeypatch):
    """Called every 10 ms for 0.7 s of a clock the test moves (the box's may stall)."""
    caplog.set_level(logging.INFO, logger="infra.services.process")
    now = [1000.0]
    monkeypatch.setattr(process, "time", SimpleNamespace(monotonic=lambda: now[0]))
    beat = Heartbeat("waiting", every=0.2)
    for _ in range(70):
        now[0] += 0.01
        beat()
    said = [r for r in caplog.records if r.getMessage().startswith("waiting: ")]
    assert 2 <= len(said) <= 3


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_unwinds_through_finally_even_with_sigint_inherited_ignored(tmp_path, sig):
    # A command's `finally` stops what it started (fanout load: its Locust). The child is
    # started with SIGINT ignored, as `cmd &` in a script starts it.
    done = tmp_path / "unwound"
    script = textwrap.dedent(f"""
        import time
        from infra.services.process import interrupted_by_signals
        try:
            with interrupted_by_signals():
                print("ready", flush=True)
                time.sleep(60)
        except KeyboardInterrupt as exc:
            open({str(done)!r}, "w").write(exc.args[0])
    """)
    child = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                         signal.SIG_IGN))
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.send_signal(sig)
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
        child.wait()
    assert done.read_text() == sig.name
