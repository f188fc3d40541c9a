"""The package's three-node stack: ``fanout up --nodes 3``, on hosts of its own where it can.

The two modules here drive it one after the other, in the step of ``make test`` that
runs the stacks one at a time (the ``stack`` group of :mod:`tests.plugins.workers`):
``test_nodes.py`` kills a
node of each kind mid-replay and brings it back with ``fanout up``, then
``test_partitions.py`` partitions its hosts. The stack lives as long as the package's
tests (a package-scoped fixture): it is down before the next test outside this
directory starts. Three brokers, three Cassandra nodes and the Spark daemons take
about three minutes to start on two cores, so they start once. With root and ``ip
netns`` each node has a network namespace of its own (``--hosts``), which the
partitions need; without, the stack runs on loopback and those tests are skipped
(:data:`HOSTS_REFUSED` says why).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.stack.stack import Stack
from tests.support.hosts import HOSTS_REFUSED, leftovers, run_id
from tests.support.stack import Run


@pytest.fixture(scope="package")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """A running ``fanout up --nodes 3 [--hosts]`` stack; ``fanout down`` leaves nothing."""
    root = tmp_path_factory.mktemp("three-nodes")
    run = Run(root, root / "history")
    hosts = [] if HOSTS_REFUSED else ["--hosts"]
    began = time.monotonic()
    made = ""
    try:
        run.fanout("up", "--nodes", "3", *hosts, "--timeout", "600", timeout=900)
        made = run_id(run.run_dir) if hosts else ""
        stack = Stack.load(run.run_dir)
        assert stack is not None and bool(stack.hosts) == bool(hosts)
        print(f"\n3-node stack{' on hosts' if hosts else ''} up in "
              f"{time.monotonic() - began:.0f}s: {stack.bootstrap}; {stack.store_url}; "
              f"{stack.spark_master}")
        yield run
    finally:
        run.down_leaving_nothing()
        made = made or (_recorded_id(run.run_dir) if hosts else "")
        if made:
            assert leftovers(made) == [], "`fanout down` left hosts behind"


def _recorded_id(run_dir: Path) -> str:
    try:
        return run_id(run_dir)
    except (OSError, ValueError, KeyError):
        return ""
