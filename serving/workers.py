"""Several API processes on one port: forked workers, each with its own SO_REUSEPORT socket.

One Python process serves one core at most; ``fanout up`` starts one worker per core.
The parent binds nothing it accepts on: it reserves the port (resolving port 0),
forks the workers and supervises them. Each worker builds its own app (the app does
no I/O until its lifespan, so nothing is shared across the fork but code) and binds
its own listening socket with ``SO_REUSEPORT``, so the kernel spreads connections
over the workers evenly instead of waking them all for each one.

Stopping: SIGTERM or SIGINT to the parent is passed to every worker, which drains
and exits (uvicorn's graceful shutdown); the parent exits when all have. A worker
that dies on its own takes the others down and the parent exits 1, so whoever
supervises the API (``fanout up``) sees one failed service, not a half-sized one.
Workers also get SIGTERM if the parent is killed outright (``PR_SET_PDEATHSIG``).
The parent reports each worker that exited, however it did, to ``on_exit``: the
workers' metrics are summed from files, and what a dead worker's live gauges said
goes with it (:func:`serving.metrics.worker_exited`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import signal
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def reuseport_socket(host: str, port: int, *, listen: bool) -> socket.socket:
    """A TCP socket bound to ``host:port`` with SO_REUSEPORT (listening if asked)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run(config: Callable[[int], uvicorn.Config], host: str, port: int, workers: int,
        on_exit: Callable[[int], object] | None = None) -> int:
    """Serve ``config(i)``'s app from ``workers`` processes (i = 0..workers-1) on ``host:port``.

    Returns the exit status once every worker has stopped: 0 when asked to stop, 1
    when a worker died on its own. ``on_exit(pid)`` runs in this process as each
    worker is reaped.
    """
    reserved = reuseport_socket(host, port, listen=False)
    port = reserved.getsockname()[1]
    children: dict[int, int] = {}
    for index in range(workers):
        pid = os.fork()
        if pid == 0:
            reserved.close()
            _worker(functools.partial(config, index), host, port)  # never returns
        children[pid] = index
    reserved.close()
    log.info("API: %d worker processes on %s:%d (pids %s)", workers, host, port,
             ", ".join(map(str, children)))
    return _supervise(children, on_exit)


def _worker(config: Callable[[], uvicorn.Config], host: str, port: int) -> None:
    code = 1
    try:
        _die_with_parent()
        server = uvicorn.Server(config())
        server.run(sockets=[reuseport_socket(host, port, listen=True)])
        code = 0
    except BaseException:
        log.exception("API worker %d failed", os.getpid())
    finally:
        logging.shutdown()
        os._exit(code)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's SIGTERM still reaches us
        pass


def _supervise(children: dict[int, int],
               on_exit: Callable[[int], object] | None = None) -> int:
    stopping = False

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            _signal_all(children, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    status = 0
    while children:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            break
        children.pop(pid, None)
        if on_exit is not None:
            on_exit(pid)
        code = os.waitstatus_to_exitcode(raw)
        if not stopping:
            log.error("API worker %d exited (%d): stopping the others", pid, code)
            stopping, status = True, 1
            _signal_all(children, signal.SIGTERM)
    return status


def _signal_all(children: dict[int, int], signum: int) -> None:
    for pid in children:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
