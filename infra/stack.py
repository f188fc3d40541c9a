"""``fanout up`` / ``fanout down``: the one-machine stack in a run directory.

``up`` starts three detached services, each a ``fanout <service>`` process with its
own log: the embedded broker (unless ``KAFKA_BOOTSTRAP`` names a real cluster), the
view job and the API. It waits until each answers, then records in
``<run>/stack.json`` exactly what it started (pids, the command line marker, ports,
bootstrap, store). ``down`` stops exactly those processes — API first, broker last —
and checks each pid still runs a fanout service before signalling it, so a
recycled pid is never killed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from infra.errors import InfraError

log = logging.getLogger(__name__)

STACK_FILE = "stack.json"
#: The API's token secret when ``up`` generated it (mode 600; never in stack.json).
AUTH_SECRET_FILE = "auth.secret"  # noqa: S105 - a file name, not a secret
MARKER = "infra.cli"


class StackError(InfraError):
    """The stack could not be started or stopped as asked."""


@dataclass
class Stack:
    """What ``up`` started; serialized to ``stack.json``."""

    run_dir: str
    bootstrap: str
    store_url: str
    api_url: str
    topic_prefix: str = ""
    partitions: int = 4
    pids: dict[str, int] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)

    def save(self) -> None:
        Path(self.run_dir, STACK_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> Stack | None:
        path = run_dir / STACK_FILE
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))

    def env(self) -> dict[str, str]:
        """The environment that points a fanout command at this stack."""
        env = {"KAFKA_BOOTSTRAP": self.bootstrap, "FANOUT_STORE": self.store_url,
               "FANOUT_TOPIC_PREFIX": self.topic_prefix,
               "FANOUT_PARTITIONS": str(self.partitions), "FANOUT_API_URL": self.api_url}
        secret = Path(self.run_dir, AUTH_SECRET_FILE)
        if secret.exists():
            env["FANOUT_AUTH_SECRET"] = secret.read_text().strip()
        return env


def spawn(run_dir: Path, service: str, args: list[str],
          env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start ``fanout <service>`` detached, logging to ``<run>/logs/<service>.log``."""
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / f"{service}.log").open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", MARKER, service, *args], stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
            start_new_session=True)
    return process


def wait_for_file(path: Path, process: subprocess.Popen[bytes], what: str,
                  timeout: float) -> str:
    """Wait until a service writes ``path`` (its ready marker); return its text."""
    _await(path.exists, process, what, timeout, f"see its log in {path.parent}/logs")
    return path.read_text().strip()


def wait_for_http(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait until ``url`` answers 200 (the API's /healthz)."""

    def answers() -> bool:
        try:
            return httpx.get(url, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    _await(answers, process, f"the API at {url}", timeout, "see its log")


def _await(ready: Callable[[], bool], process: subprocess.Popen[bytes], what: str,
           timeout: float, hint: str) -> None:
    """Poll ``ready`` until true; fail when the process exits or the deadline passes."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            msg = f"{what} exited before it was ready; {hint}"
            raise StackError(msg)
        if time.monotonic() >= deadline:
            msg = f"{what} was not ready after {timeout:.0f}s; {hint}"
            raise StackError(msg)
        time.sleep(0.1)


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: how a foreground service is told to stop."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) fanout service."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return MARKER.encode() in cmdline and state != "Z"


def stop_pid(pid: int, name: str, timeout: float = 30.0) -> None:
    """SIGTERM, wait, then SIGKILL; only if the pid is still one of ours."""
    if not alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            log.warning("%s (pid %d) ignored SIGTERM for %.0fs: SIGKILL", name, pid, timeout)
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def down(run_dir: Path, timeout: float = 30.0) -> Stack | None:
    """Stop what ``up`` started in ``run_dir``; return it (None if nothing was up)."""
    stack = Stack.load(run_dir)
    if stack is None:
        return None
    for name in ("api", "job", "broker"):
        pid = stack.pids.get(name)
        if pid:
            stop_pid(pid, name, timeout)
            log.info("stopped %s (pid %d)", name, pid)
    (run_dir / STACK_FILE).unlink(missing_ok=True)
    return stack
