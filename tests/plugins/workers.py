"""How the suite spreads over pytest-xdist workers (``make test TEST_WORKERS=2``, one a core).

With ``--dist loadgroup`` the tests of one ``xdist_group`` run one after another on one
worker, and the tests of no group go to whichever worker is free. Each whole-stack test
module names its group in its ``pytestmark``:

- ``nodes``: the three-node stack that ``tests/stack/nodes/`` shares (its node kills,
  then its partitions, on hosts of its own) and ``tests/infra/test_hosts.py``'s hosts.
- ``recovery`` and ``stack``: the other whole-stack tests (``tests/stack/``, the load
  generator's stack test), in two groups of about the same length. Each test starts
  services of its own and some kill processes; one at a time per group keeps the CPU
  each one's timing windows were set for within a factor of two.

Under xdist the groups are put first, in :data:`ORDER`, the longest first, and ``make
test`` keeps that order (``--no-loadscope-reorder``): a group is one unit of work, and one
handed out last would run on after the rest of the suite. Within a group the tests
keep their files' order, which some scenarios rely on.

A worker has its own session fixtures: a worker that runs a test needing the Kafka
node, the Cassandra node or Spark starts its own, on random ports, so the two never
share topics or keyspaces they did not make. Without xdist (``pytest`` on a file), the
groups are plain markers and change nothing.
"""

from __future__ import annotations

import os

import pytest

#: The order groups are handed out in (the longest first); tests of no group last.
ORDER = ("nodes", "recovery", "stack")


def group_of(item: pytest.Item) -> str | None:
    """The ``xdist_group`` a test's module (or the test) names, if any."""
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark is not None and mark.args else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process: the files' order
    rank = {group: i for i, group in enumerate(ORDER)}
    items.sort(key=lambda item: rank.get(group_of(item) or "", len(ORDER)))  # stable
