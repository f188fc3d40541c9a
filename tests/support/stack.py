"""The local stack as a user drives it: ``fanout`` commands as subprocesses in a run directory.

A :class:`Run` is one stack's run directory, the history it replays and the tag its
processes carry (``FANOUT_FAULT_TAG``, see :mod:`tests.support.process`), driven
through ``fanout up``/``down``/``replay``/``verify``/``status`` as the README types
them; the functions below pace a replay, find and kill process trees and read
``fanout status``. Used by the whole-stack tests in ``tests/stack/``
(``test_recovery.py`` first).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.cli import job_at_a_glance
from infra.stack.stack import Stack
from ingest.history import iter_events
from ingest.settings import KafkaSettings
from tests.support.paths import ROOT
from tests.support.process import TAG, tagged

CAP, CELEBRITY = 60, 40
#: How long a paced replay of the history lasts (seconds): long enough to act mid-way.
REPLAY_S = 20.0


@dataclass
class Run:
    """The stack's run directory, its history and the tag its processes carry."""

    root: Path
    history: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    def env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items()
                if not k.startswith("FANOUT_") and k != "KAFKA_BOOTSTRAP"}
        return {**keep, TAG: self.tag, "FANOUT_AUTH": "off", "FANOUT_TIMELINE_CAP": str(CAP),
                "FANOUT_CELEBRITY_THRESHOLD": str(CELEBRITY), "FANOUT_API_ACCESS_LOG": "false"}

    def fanout(self, *args: str, timeout: float = 420, check: bool = True,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``fanout --run-dir RUN ARGS`` as a user types it; its output on failure.

        ``env`` adds variables for this command alone (a first ``up``'s store, say).
        """
        result = subprocess.run(
            [sys.executable, "-m", "infra.cli", "--run-dir", str(self.run_dir), *args],
            cwd=ROOT, env={**self.env(), **(env or {})}, capture_output=True, text=True,
            timeout=timeout, check=False)
        if check and result.returncode != 0:
            msg = (f"`fanout {' '.join(args)}` exited {result.returncode}:\n"
                   f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
            raise AssertionError(msg)
        return result

    def replay(self, speedup: float | None) -> subprocess.Popen[str]:
        """``fanout replay HISTORY`` in the background (paced when ``speedup`` is set)."""
        pace = ["--speedup", str(speedup)] if speedup else []
        return subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "--run-dir", str(self.run_dir), "replay",
             "--no-progress", *pace, str(self.history)],
            cwd=ROOT, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)

    def stack(self) -> dict:
        return json.loads((self.run_dir / "stack.json").read_text())

    def verify(self) -> str:
        result = self.fanout("verify", "--wait", "300", check=False, timeout=600)
        assert result.returncode == 0, f"verify failed:\n{result.stdout}\n{result.stderr[-3000:]}"
        assert "0 divergent" in result.stdout, result.stdout
        assert users_checked(result.stdout) > 0, result.stdout
        return result.stdout

    def kafka(self) -> KafkaSettings:
        return KafkaSettings(bootstrap=self.stack()["bootstrap"], partitions=4)

    def down_leaving_nothing(self) -> None:
        """``fanout down``, then check that no process of the stack is left."""
        self.fanout("down", check=False, timeout=240)
        leftover = tagged(self.tag)  # `down` waits for every process of each service
        kill(leftover)
        assert not leftover, f"processes left after `fanout down`: {leftover}"


def users_checked(verified: str) -> int:
    """How many users ``fanout verify``'s output says it compared: a verify of none
    holds nothing to the SQL, whatever it says of divergence."""
    found = re.search(r"verify: (\d+) users checked", verified)
    assert found, f"no `verify: N users checked` line in:\n{verified[-3000:]}"
    return int(found.group(1))


def finish(replay: subprocess.Popen[str], timeout: float = 400) -> str:
    out, _ = replay.communicate(timeout=timeout)
    assert replay.returncode == 0, f"the replay failed:\n{out[-3000:]}"
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants now (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def speedup_of(history: Path) -> float:
    """The pace that replays ``history`` in about :data:`REPLAY_S` seconds."""
    times = [e.created_at for e in iter_events(history)]
    return (max(times) - min(times)) / (REPLAY_S * 1000)


def job_status(run: Run) -> dict[str, Any] | None:
    """``fanout status``'s view of the job once it has caught up and logged a batch.

    Built in this process by the function ``fanout status`` shows it with: the command
    itself cost ~0.6 CPU-s a poll, on a box the suite keeps busy.
    """
    stack = Stack.load(run.run_dir)
    if stack is None or not stack.running("job"):
        return None
    job = job_at_a_glance(stack.job_metrics_url())
    ready = job.get("offsets_behind") == 0 and job.get("last_batch") and job.get(
        "freshness_p99_s") is not None
    return job if ready else None
