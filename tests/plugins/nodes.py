"""One Kafka node and one Cassandra node for all the xdist workers of a run.

Under ``-n N`` (``make test``'s unit step runs two workers), the controller starts the
session's Kafka node and Cassandra node once, each when a worker first asks for it,
and every worker's ``kafka_bootstrap`` and ``cassandra_hosts`` use them: one JVM of
each for the step instead of one a worker. A Cassandra node costs about 10 CPU-seconds
to start and a Kafka node 3.5, and idle each takes 1-2 % of a core
(``benchmarks/bench_idle_nodes.py``), on a box the suite keeps busy. The tests already
work in topics and keyspaces of their own, named at random, so two workers on one node
are two more tests on it. :func:`local_node` makes the node, here and for a process
that starts its own.

The workers find the controller's directory in :data:`NODES_DIR_ENV`, which they
inherit (it is set before they start). A worker asks for a node with a file
``want-KIND``; the controller answers with ``KIND.json``: the node's address, or why
the node cannot start (``skip`` when its jars are not cached, as a worker's own node
would skip; ``error`` otherwise). The controller stops the nodes after the workers are
done (``pytest_unconfigure``). A process that is no xdist worker starts its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Final

import pytest

from tests.support.process import wait_for

#: The controller's directory of requests and answers; only workers of one run see it.
NODES_DIR_ENV: Final = "PYTEST_FANOUT_NODES_DIR"
#: How long a worker waits for the node it asked for (a Cassandra start on a busy box
#: takes up to a few minutes).
WAIT_S: Final = 600.0
#: How often the controller looks for requests, and a worker for its answer.
POLL_S: Final = 0.2
KINDS: Final = ("kafka", "cassandra")


class Keeper:
    """The controller's side: starts a node when a worker asks, stops them all at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: list[Any] = []
        self._done = threading.Event()
        self._starting: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._loop = threading.Thread(target=self._watch, name="test-nodes", daemon=True)

    def start(self) -> Keeper:
        self._loop.start()
        return self

    def _watch(self) -> None:
        while not self._done.wait(POLL_S):
            for kind in KINDS:
                if kind not in self._starting and (self.root / f"want-{kind}").exists():
                    thread = threading.Thread(target=self._answer, args=(kind,), daemon=True)
                    self._starting[kind] = thread
                    thread.start()

    def _answer(self, kind: str) -> None:
        from infra.services.jars import JarError

        try:
            answer = {"address": self._start(kind)}
        except JarError as exc:
            answer = {"skip": f"no {kind} to test against: {exc}"}
        except Exception as exc:  # noqa: BLE001 (the worker's tests report it)
            answer = {"error": f"the run's {kind} node did not start: {exc}"}
        draft = self.root / f"{kind}.json.draft"
        draft.write_text(json.dumps(answer))
        draft.replace(self.root / f"{kind}.json")

    def _start(self, kind: str) -> str:
        node = local_node(kind, self.root / kind)
        with self._lock:
            self.nodes.append(node)
        return address(node.start())

    def stop(self) -> None:
        """Stop watching, wait for a node still starting, then stop every node."""
        self._done.set()
        self._loop.join()
        for thread in self._starting.values():
            thread.join()
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def local_node(kind: str, data_dir: Path) -> Any:
    """A local ``kind`` node (not started) as the suite runs one: a Kafka node, or a
    Cassandra node at a 512 MiB heap; JarError when Cassandra's jars are not cached."""
    if kind == "kafka":
        from infra.services.broker import KafkaBroker

        return KafkaBroker(data_dir)
    from infra.services.cassandra import LocalCassandra
    from infra.services.jars import CASSANDRA, classpath

    classpath(CASSANDRA)
    return LocalCassandra(data_dir, heap_mb=512)


def address(node: Any) -> str:
    """Where clients reach a started :func:`local_node`."""
    return str(node.bootstrap if hasattr(node, "bootstrap") else node.hosts)


def shared_node(kind: str) -> str | None:
    """The address of the run's ``kind`` node (asked for, waited for), or None when this
    process is not an xdist worker of a run that shares them."""
    root = os.environ.get(NODES_DIR_ENV)
    if not root:
        return None
    answer_path = Path(root) / f"{kind}.json"
    (Path(root) / f"want-{kind}").touch()
    wait_for(answer_path.exists, WAIT_S, f"the run's {kind} node ({root})", every=POLL_S)
    answer = json.loads(answer_path.read_text())
    if "skip" in answer:
        pytest.skip(answer["skip"])
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return str(answer["address"])


_KEEPER: Final = pytest.StashKey[Keeper]()


def _shares(config: pytest.Config) -> bool:
    """Whether this process is the controller of two or more xdist workers."""
    if hasattr(config, "workerinput"):
        return False
    workers = getattr(config.option, "numprocesses", None)
    return isinstance(workers, int) and workers >= 2


def pytest_configure(config: pytest.Config) -> None:
    if _shares(config) and NODES_DIR_ENV not in os.environ:
        keeper = Keeper(Path(tempfile.mkdtemp(prefix="fanout-test-nodes-"))).start()
        os.environ[NODES_DIR_ENV] = str(keeper.root)
        config.stash[_KEEPER] = keeper


def pytest_unconfigure(config: pytest.Config) -> None:
    keeper = config.stash.get(_KEEPER, None)
    if keeper is not None:
        os.environ.pop(NODES_DIR_ENV, None)
        keeper.stop()
