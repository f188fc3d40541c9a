"""What every local service (Kafka, Cassandra, Spark's daemons) needs of its process.

Free loopback ports, the tail of a service's log for an error message, a stop that
asks first (SIGTERM: Kafka shuts down in a controlled way, Cassandra drains its
memtables) and kills after a timeout, how a service in the foreground is told to stop
(:func:`stop_on_signals`), the JIT setting of the JVMs that share one machine with
the job, and a line now and then while something slow is awaited (:class:`Heartbeat`,
:func:`run_saying`): no step of an install or a start goes quiet for long.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Final

log = logging.getLogger(__name__)

LOOPBACK: Final = "127.0.0.1"

#: The JIT of Spark's JVMs and of the local Kafka node stops at C1. C2's optimised code
#: buys them little (Spark's JVM mostly moves packed rows between Python workers, Kafka
#: and RocksDB; the broker mostly copies log segments to sockets), while C2 compiling
#: their hot code takes CPU from the job on a machine they share: ~25 CPU-seconds of
#: Spark's first minute on this 2-core box (a cold 396k-event backlog, 43 s against
#: 49 s), and 1.3-1.5 of the broker's 2.4-2.9 CPU-seconds while a cold job read that
#: backlog from it (13.0-13.3 s against 14.2-15.0 s; benchmarks/RESULTS.md). Without
#: tiers the JVM reserves only 48 MB for compiled code, and a job that runs on fills
#: it (Spark compiles new classes as it goes): at 1M users it was full after ~5
#: minutes of bulk replay and the JVM disabled its compiler for good, leaving later
#: code interpreted. 240 MB is the JVM's own default with tiers.
JIT_OPTIONS: Final = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"

#: Longest a slow step (a JVM starting, a Maven fetch, the class archive's training run)
#: goes without saying that it goes on, in seconds.
HEARTBEAT_S: Final = 5.0

_PR_SET_TIMERSLACK: Final = 29
_PR_GET_TIMERSLACK: Final = 30


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether ``port`` can be listened on at ``host`` now (TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def logged_since(path: Path, since: int = 0) -> str:
    """What a service logged after byte ``since`` (raises ``OSError`` if unreadable)."""
    with path.open("rb") as f:
        f.seek(since)
        return f.read().decode("utf-8", "replace")


def log_tail(path: Path, lines: int = 15, since: int = 0) -> str:
    """The last ``lines`` a service logged (after byte ``since``), for an error message."""
    try:
        text = logged_since(path, since)
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(its log is empty)"


def terminate(process: subprocess.Popen[bytes], timeout: float, name: str) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("%s pid %d ignored SIGTERM for %.0f s; killing it", name, process.pid,
                    timeout)
        process.kill()
        process.wait(timeout)


class Heartbeat:
    """Logs, at most every ``every`` seconds, that the wait for ``what`` goes on.

    Call it from a polling loop; the first line comes ``every`` seconds after creation.
    """

    def __init__(self, what: str, every: float = HEARTBEAT_S) -> None:
        self.what, self.every = what, every
        self.began = self._said = time.monotonic()

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self._said >= self.every:
            self._said = now
            log.info("%s: %.0f s so far", self.what, now - self.began)


def run_saying(argv: list[str], what: str, *, timeout: float, capture: bool = False,
               stdout: IO[bytes] | None = None, cwd: Path | None = None,
               env: dict[str, str] | None = None,
               every: float = HEARTBEAT_S) -> subprocess.CompletedProcess[str]:
    """:func:`subprocess.run` of a slow command, with a :class:`Heartbeat` every ``every`` s.

    ``capture``: its output and errors as text in the result; else its output goes to
    ``stdout`` (errors with it). Past ``timeout`` seconds it is killed and
    :class:`subprocess.TimeoutExpired` raised, as ``run`` does.
    """
    beat = Heartbeat(what, every)
    deadline = time.monotonic() + timeout
    pipe = subprocess.PIPE if capture else stdout
    with subprocess.Popen(argv, stdout=pipe, stderr=subprocess.PIPE if capture else
                          subprocess.STDOUT, text=capture, cwd=cwd, env=env) as child:
        while True:
            try:
                out, err = child.communicate(timeout=min(1.0, beat.every))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    child.kill()
                    child.communicate()
                    raise subprocess.TimeoutExpired(argv, timeout) from None
                beat()
    return subprocess.CompletedProcess(argv, child.returncode, out, err)


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: how a foreground service is told to stop."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


@contextlib.contextmanager
def interrupted_by_signals() -> Iterator[None]:
    """Inside, SIGINT and SIGTERM raise :class:`KeyboardInterrupt`.

    That is how a command that started children of its own (Locust, an API) unwinds
    through its ``finally`` blocks and stops them: on Ctrl-C, on ``kill``, and where
    SIGINT came ignored (a job started with ``&`` from a script inherits it ignored).
    """

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def timer_slack(ns: int) -> Iterator[None]:
    """Processes started inside (by this thread) run with a timer slack of ``ns``.

    Linux lets the kernel wake a sleeping thread up to its *timer slack* late (50 µs by
    default), so that wake-ups coalesce; a thread's slack passes to the threads and
    processes it starts. A JVM whose idle workers poll in very short sleeps (Cassandra's
    shared request pool parks for ~10 µs at a time for ~10 ms after each burst of
    requests) wakes far less often with a larger slack. Elsewhere than Linux, or if the
    call fails: no change.
    """
    libc = _libc()
    if libc is None or ns <= 0:
        yield
        return
    previous = libc.prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
    changed = previous > 0 and libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0) == 0
    try:
        yield
    finally:
        if changed:
            libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(previous), 0, 0, 0)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
