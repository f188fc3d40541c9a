"""How the suite spreads over pytest-xdist workers (``make test`` runs two, one a core).

With ``--dist loadgroup`` a group's tests run one after another on one worker, and the
tests of no group go to whichever worker is free. Two groups keep what must not run
twice at once, or would cost twice, on one worker each:

- ``stack``: the whole-stack tests (``tests/stack/``, the load generator's stack test
  and the hosts' network namespaces). Each starts services of its own, some kill
  processes or make network namespaces, and two at once would halve the CPU each
  one's timing windows were set for.
- ``spark``: every other test that uses the session's SparkSession, so that one
  worker starts it rather than both.

A worker has its own session fixtures: a worker that runs a test needing the Kafka
node or the Cassandra node starts its own, on random ports, so the two never share
topics or keyspaces they did not make. Without xdist (``pytest`` on a file), the
groups are plain markers and change nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: Test files (relative to the repository) that belong to the ``stack`` group although
#: they are not under ``tests/stack/``.
STACK_FILES = frozenset({"tests/loadgen/test_loadgen_stack.py", "tests/infra/test_hosts.py"})


def group_of(path: str, fixtures: list[str]) -> str | None:
    """The xdist group of a test at ``path`` (repository-relative) using ``fixtures``."""
    if path.startswith("tests/stack/") or path in STACK_FILES:
        return "stack"
    if "spark" in fixtures:
        return "spark"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(config.rootpath)
    for item in items:
        path = Path(item.path).relative_to(root).as_posix()
        group = group_of(path, list(getattr(item, "fixturenames", ())))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
