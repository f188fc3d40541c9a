"""How the suite spreads over pytest-xdist workers (``make test`` runs two, one a core).

With ``--dist loadgroup`` a group's tests run one after another on one worker, and the
tests of no group go to whichever worker is free. Groups keep what must not run twice
at once, or would cost twice, on one worker each:

- ``nodes``: the three-node stacks (``tests/stack/test_nodes.py``, on loopback;
  ``test_partitions.py`` and ``tests/infra/test_hosts.py``, in network namespaces).
- ``recovery`` and ``stack``: the other whole-stack tests (``tests/stack/``, the load
  generator's stack test), in two groups of about the same length. Each test starts
  services of its own and some kill processes; one at a time per group keeps the CPU
  each one's timing windows were set for within a factor of two.
- ``spark``: every other test that uses the session's SparkSession, so that one
  worker starts it rather than both.

The groups go first, the longest first (a group is one unit of work, and one handed
out last would run on after the rest of the suite); within a group the tests keep
their files' order, which some scenarios rely on.

A worker has its own session fixtures: a worker that runs a test needing the Kafka
node or the Cassandra node starts its own, on random ports, so the two never share
topics or keyspaces they did not make. Without xdist (``pytest`` on a file), the
groups are plain markers and change nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: Test files (repository-relative) of the groups other than ``stack`` (the rest of
#: ``tests/stack/``), and those of ``stack`` outside ``tests/stack/``.
NODES_FILES = frozenset({"tests/stack/test_nodes.py", "tests/stack/test_partitions.py",
                         "tests/infra/test_hosts.py"})
RECOVERY_FILES = frozenset({"tests/stack/test_recovery.py", "tests/stack/test_stack_metrics.py",
                            "tests/stack/test_cluster.py"})
STACK_FILES = frozenset({"tests/loadgen/test_loadgen_stack.py"})
#: The order groups are handed out in (the longest first); tests of no group last.
ORDER = ("nodes", "recovery", "stack", "spark")


def group_of(path: str, fixtures: list[str]) -> str | None:
    """The xdist group of a test at ``path`` (repository-relative) using ``fixtures``."""
    if path in NODES_FILES:
        return "nodes"
    if path in RECOVERY_FILES:
        return "recovery"
    if path.startswith("tests/stack/") or path in STACK_FILES:
        return "stack"
    if "spark" in fixtures:
        return "spark"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(config.rootpath)
    groups: dict[pytest.Item, str | None] = {}
    for item in items:
        path = Path(item.path).relative_to(root).as_posix()
        groups[item] = group = group_of(path, list(getattr(item, "fixturenames", ())))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    rank = {group: i for i, group in enumerate(ORDER)}
    items.sort(key=lambda item: rank.get(groups[item] or "", len(ORDER)))  # stable
