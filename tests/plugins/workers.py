"""How the suite spreads over two pytest-xdist workers (``make test TEST_WORKERS=2``).

Every test that starts a whole stack, makes hosts or holds a slow link names the one
``xdist_group`` ``stack`` in its module's ``pytestmark``. With ``--dist loadgroup`` that
group is one unit of work: one worker runs all of it, one test after another, and the
other worker runs everything else (the unit tests, each with its own Kafka node,
Cassandra node and SparkSession, on random ports) in the meantime. So no two stacks
ever run at once. On a 2-core machine that is not enough to make it the default: with
the unit tests' own nodes beside a stack (and other work on the box), the rebuild
beside under load and a Cassandra node's SIGKILL test have failed, where one process
passes them.

Under xdist the group is put first (xdist hands it out before any other test, and
``make test`` keeps that order with ``--no-loadscope-reorder``), and within it the
three-node stack of ``tests/stack/nodes/`` comes last: by then the unit tests on the
other worker are done, and the heaviest stack (three brokers, three Cassandra nodes,
the Spark daemons) has both cores to itself. Within the group the tests otherwise keep
their files' order, which some scenarios rely on.

Without xdist (``pytest`` on a file, or ``make test``), the group is a plain marker and
changes nothing.
"""

from __future__ import annotations

import os

import pytest

#: The one group of whole-stack tests, handed out first.
STACK = "stack"
#: Within it, the tests under this directory run last (the three-node stack).
HEAVIEST = os.path.join("tests", "stack", "nodes") + os.sep


def group_of(item: pytest.Item) -> str | None:
    """The ``xdist_group`` a test's module (or the test) names, if any."""
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark is not None and mark.args else None


def _rank(item: pytest.Item) -> tuple[int, int]:
    if group_of(item) != STACK:
        return (1, 0)
    return (0, 1 if HEAVIEST in item.nodeid.replace("/", os.sep) else 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process: the files' order
    items.sort(key=_rank)  # stable: the files' order within each rank
