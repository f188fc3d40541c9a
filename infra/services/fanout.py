"""The ``fanout`` commands that run as services: the view job, the API, the verifier, a job beside.

Each is ``python -m infra.cli <command>`` detached in a session of its own, its output
in ``<run>/logs/<name>.log``. :class:`FanoutProcess` is one of them behind the
:class:`~infra.services.service.Service` interface; :func:`alive` and :func:`stop_pid`
find and stop one again from its recorded pid alone (a later ``fanout down``), and
never touch a pid that has since been given to another program.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import httpx

from infra import webclient
from infra.errors import InfraError
from infra.services import procs
from infra.services.process import Heartbeat
from ingest.settings import BOOTSTRAP_ENV

log = logging.getLogger(__name__)

#: In the command line of every ``fanout`` service (``python -m infra.cli ...``).
MARKER: Final = "infra.cli"
#: How long a stopped service's children may take to exit on their own (seconds).
STRAGGLER_S: Final = 15.0


class ServiceError(InfraError):
    """A ``fanout`` service exited or was not ready in time; the message names its log."""


class FanoutProcess:
    """One ``fanout <command>`` service, ready when it says so.

    It is ready when it has written ``ready_file`` (the job and the verifier take
    ``--ready-file``), or when ``health`` answers 200 (the API's ``/healthz``).
    ``watch`` says what else died while it started (a service it needs), or None: the
    start gives up at once with that reason. Its log is ``<run>/logs/<log_name>.log``
    (default: the command's name).
    """

    marker: Final = MARKER

    def __init__(self, run_dir: Path, command: str, env: dict[str, str], *,
                 ready_file: Path | None = None, health: str | None = None,
                 args: Sequence[str] = (), log_name: str | None = None,
                 what: str | None = None,
                 timeout: float = 60.0, stop_timeout: float = 30.0,
                 watch: Callable[[], str | None] | None = None) -> None:
        if (ready_file is None) == (health is None):
            msg = "a fanout service is ready by a ready file or by a health URL: give one"
            raise ValueError(msg)
        self.run_dir, self.command, self.env = run_dir, command, env
        self.ready_file, self.health = ready_file, health
        self.log_name = log_name or command
        self.what = what or f"the {self.log_name}"
        self.timeout, self.stop_timeout, self.watch = timeout, stop_timeout, watch
        self.args = [*args, *(["--ready-file", str(ready_file)] if ready_file else [])]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            msg = f"{self.what} is not started: call start() first"
            raise ServiceError(msg)
        return self.process.pid

    @property
    def log_path(self) -> Path:
        return self.run_dir / "logs" / f"{self.log_name}.log"

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the process and return at once (:meth:`start` waits until it is ready)."""
        if self.ready_file is not None:
            self.ready_file.unlink(missing_ok=True)
        self.process = spawn(self.run_dir, self.command, self.args, self.env, self.log_name)
        return self.process

    def start(self) -> FanoutProcess:
        self.spawn()
        return self.await_ready()

    def await_ready(self) -> FanoutProcess:
        """Wait until the spawned process is ready (:meth:`start`'s second half).

        Between :meth:`spawn` and this the caller may start other services, so that
        they come up together; on failure the process is stopped and the error raised.
        """
        try:
            self._await()
        except BaseException:
            self.stop()
            raise
        return self

    def ready(self) -> bool:
        if self.ready_file is not None:
            return self.ready_file.exists()
        assert self.health is not None
        try:
            return webclient.get(self.health, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            stop_pid(self.process.pid, self.what, self.stop_timeout)

    def _await(self) -> None:
        """Poll :meth:`ready`; fail when the process exits, ``watch`` objects, or time runs out."""
        assert self.process is not None
        deadline = time.monotonic() + self.timeout
        beat = Heartbeat(f"waiting for {self.what}")
        hint = f"see its log {self.log_path}"
        while not self.ready():
            beat()
            if self.process.poll() is not None:
                msg = f"{self.what} exited before it was ready; {hint}"
                raise ServiceError(msg)
            died = self.watch() if self.watch is not None else None
            if died:
                msg = f"{died} while waiting for {self.what}"
                raise ServiceError(msg)
            if time.monotonic() >= deadline:
                msg = f"{self.what} was not ready after {self.timeout:.0f}s; {hint}"
                raise ServiceError(msg)
            time.sleep(0.1)
        log.info("%s: ready after %.1f s", self.what, time.monotonic() - beat.began)


def spawn(run_dir: Path, command: str, args: Sequence[str], env: dict[str, str],
          log_name: str | None = None) -> subprocess.Popen[bytes]:
    """Start ``fanout <command>`` detached, logging to ``<run>/logs/<log_name or command>.log``.

    Its fanout settings are ``env`` alone: the caller's own ``FANOUT_*`` and
    ``KAFKA_BOOTSTRAP`` are not inherited, so a service restarted from another shell
    runs exactly as the stack's first one did.
    """
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    inherited = {k: v for k, v in os.environ.items()
                 if not k.startswith("FANOUT_") and k != BOOTSTRAP_ENV}
    with (logs / f"{log_name or command}.log").open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", MARKER, command, *args], stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, env={**inherited, **env},
            start_new_session=True)
    return process


def alive(pid: int, marker: str = MARKER) -> bool:
    """Whether ``pid`` runs (not a zombie) with ``marker`` in its command line."""
    return procs.running(pid, marker)


def stop_pid(pid: int, name: str, timeout: float = 30.0, marker: str = MARKER) -> None:
    """SIGTERM, wait, then SIGKILL; only if the pid is still one of ours.

    Every service leads a session of its own (:func:`spawn`), and what it started —
    the job's JVM, PySpark's daemon and workers — is in that session: whatever of it
    outlives the leader for :data:`STRAGGLER_S` is killed too, so nothing is orphaned.
    """
    if not alive(pid, marker):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid, marker):
        if time.monotonic() >= deadline:
            log.warning("%s (pid %d) ignored SIGTERM for %.0fs: SIGKILL", name, pid, timeout)
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    _reap(pid)
    _end_session(pid, name)


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid``."""
    return [pid for pid, _ in procs.session_members(sid)]


def _end_session(sid: int, name: str) -> None:
    """Wait for the rest of session ``sid`` to exit; SIGKILL what is left after a while."""
    deadline = time.monotonic() + STRAGGLER_S
    while members := session_members(sid):
        if time.monotonic() >= deadline:
            log.warning("%s: processes %s outlived it for %.0fs: SIGKILL", name, members,
                        STRAGGLER_S)
            for member in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGKILL)
            return
        time.sleep(0.1)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
