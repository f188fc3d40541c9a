"""Helpers of the fault tests: services run as real processes and killed the hard way.

A :class:`Service` is one ``python -m infra.cli <service>`` process, started as
``fanout up`` starts it (own session, log file) and tagged with a unique
``FANOUT_FAULT_TAG`` environment variable that every descendant inherits: the JVM,
and the PySpark daemon with its Python workers — which put themselves in a process
group of their own, so ``killpg`` alone would miss them. :meth:`Service.kill`
SIGKILLs the process group, then every live process carrying the tag, and waits
(bounded) until none is left; :func:`tagged` is how a test asserts no orphan
survived.

:class:`WriteLockProbe` tells, from outside and with no product hook, whether some
connection holds the SQLite write lock right now: ``BEGIN IMMEDIATE`` with a zero
busy timeout fails with "database is locked" exactly then. :func:`wait_for` is the
bounded poll every test that waits on a process uses (docs/style.md §9).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO

from tests.support.paths import ROOT

TAG = "FANOUT_FAULT_TAG"


def wait_for(condition: Callable[[], object], timeout: float, what: str,
             every: float = 0.1) -> object:
    """Poll ``condition`` until it returns something truthy; fail saying ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            msg = f"timed out after {timeout:.0f}s waiting for {what}"
            raise AssertionError(msg)
        time.sleep(every)


def tagged(tag: str) -> list[int]:
    """Pids of live (not zombie) processes whose environment carries ``TAG=tag``."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


class Service:
    """One ``fanout <service>`` process tree; see the module docstring."""

    def __init__(self, service: str, args: list[str], env: dict[str, str],
                 run_dir: Path) -> None:
        self.service, self.args, self.run_dir = service, args, run_dir
        self.tag = uuid.uuid4().hex
        self.env = {**os.environ, **env, TAG: self.tag}
        self.log_path = run_dir / "logs" / f"{service}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0

    def start(self) -> Service:
        assert not self.alive(), f"{self.service} is already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"\n=== start {self.starts} ===\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "--run-dir", str(self.run_dir), self.service,
             *self.args],
            cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def kill(self, timeout: float = 30.0) -> None:
        """SIGKILL the whole tree and wait until no process of it is left."""
        if self.process is not None and self._group_alive():
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while pids := tagged(self.tag):
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() >= deadline:
                msg = f"{self.service}: processes {pids} survived SIGKILL for {timeout:.0f}s"
                raise AssertionError(msg)
            time.sleep(0.05)
        self._reap(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a clean stop), then :meth:`kill` whatever is left."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def log_text(self) -> str:
        if self._log is not None:
            self._log.flush()
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _group_alive(self) -> bool:
        """Whether the process group still has a member of ours (so its id is not reused)."""
        assert self.process is not None
        if self.process.poll() is None:
            return True
        pgid = self.process.pid
        for pid in tagged(self.tag):
            try:
                if os.getpgid(pid) == pgid:
                    return True
            except ProcessLookupError:
                continue
        return False

    def _reap(self, timeout: float) -> None:
        if self.process is not None:
            self.process.wait(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None


class WriteLockProbe:
    """Whether another connection holds the write lock of a SQLite file right now."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, timeout=0, isolation_level=None)

    def locked(self) -> bool:
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return True
            raise
        self.conn.execute("ROLLBACK")
        return False

    def close(self) -> None:
        self.conn.close()
