"""One Kafka node and one Cassandra node for all the xdist workers of a run.

Each worker of ``pytest -n N`` is a session of its own, and would start the session's
nodes itself: N Cassandra JVMs and N brokers on a 2-core box, each start 20-40 s of a
core and each node some CPU while idle. Tests already share a node safely (each works
in keyspaces and topics of its own, named at random), so the first worker to need a
node starts it, detached, under an exclusive lock on a file in the directory the run's
workers share (xdist gives each worker a base temporary directory below the
controller's); the others wait on the lock, then find the node's record there and
connect to it. The controller stops every node recorded once all its workers are done
(:func:`pytest_sessionfinish`). A run without workers starts and stops its own nodes,
as a fixture's ``with`` does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import psutil
import pytest

#: How long a node recorded by the workers has to stop on SIGTERM before a SIGKILL.
STOP_S = 60.0


class Started(NamedTuple):
    """A node a worker started: the address its tests use, and its process."""

    address: str
    pid: int


def workers_dir(config: pytest.Config) -> Path | None:
    """The directory the run's xdist workers share; None in a run without workers.

    A worker knows it is one by its ``workerinput``; a pytest that a test runs in a
    subprocess has none, and starts its own nodes.
    """
    if not hasattr(config, "workerinput") or not config.option.basetemp:
        return None
    return Path(config.option.basetemp).resolve().parent


def joined(root: Path, name: str, start: Callable[[Path], Started]) -> str:
    """The address of the run's node ``name``: started now in ``root/name`` (``start``)
    if no worker has yet, else the one that worker recorded."""
    record = root / f"shared-{name}.json"
    with _locked(root / f"shared-{name}.lock"):
        if record.exists():
            return str(json.loads(record.read_text())["address"])
        started = start(root / name)
        create_time = psutil.Process(started.pid).create_time()
        record.write_text(json.dumps({"address": started.address, "pid": started.pid,
                                      "create_time": create_time}))
        return started.address


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def stop_recorded(root: Path) -> list[str]:
    """Stop every node the workers recorded in ``root``; what was stopped."""
    stopped = []
    for record in sorted(root.glob("shared-*.json")):
        node = json.loads(record.read_text())
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(node["pid"])
            if process.create_time() == node["create_time"]:  # not a reused pid
                process.terminate()
                try:
                    process.wait(STOP_S)
                except psutil.TimeoutExpired:
                    process.kill()
                    process.wait(STOP_S)
                stopped.append(record.stem.removeprefix("shared-"))
        record.unlink()
    return stopped


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the controller of a run with workers: stop the nodes they shared."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    factory = getattr(config, "_tmp_path_factory", None)  # xdist's own way to the directory
    if factory is not None:
        stop_recorded(factory.getbasetemp())
