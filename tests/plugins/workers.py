"""How the suite is split: the tests that start no whole stack, and the stacks.

Every test that starts a whole stack, makes hosts or holds a slow link names the one
``xdist_group`` ``stack`` in its module's ``pytestmark``. ``make test`` runs the suite
in two steps (``--stacks``, below), side by side (:mod:`tests.steps`):

1. ``--stacks only`` in one process: every whole-stack test, one stack at a time, in
   the files' order. Stacks hold timing windows (a rebuild beside under load, a
   Cassandra node's restart) that assume nothing else competes for the cores at an
   equal weight: beside the unit tests' nodes at an equal weight they have failed.
2. ``--stacks without``: the unit tests, with a Kafka node and a Cassandra node of
   their own on random ports (one of each for all the xdist workers,
   :mod:`tests.plugins.nodes`) and a SparkSession a worker, in a CPU control group of
   an eighth of the weight, so that they use what the stacks leave idle.

``--stacks all`` (the default) runs both kinds in the files' order. Under ``-n 2
--dist loadgroup`` the group is one unit of work, so one worker runs every stack while
the other runs the rest at an equal weight: the arrangement whose stacks failed on two
cores. Without xdist the group is a plain marker.
"""

from __future__ import annotations

import pytest

#: The one group of whole-stack tests.
STACK = "stack"
#: The marker of a test module that takes a minute or more of the unit step: those
#: modules go to the workers first, so that the step does not end on one of them with
#: the other worker idle (xdist's own order puts the modules with the most tests first,
#: which left the job's kill tests, one or two tests a module, for the end).
LONG = "long"


def group_of(item: pytest.Item) -> str | None:
    """The ``xdist_group`` a test's module (or the test) names, if any."""
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark is not None and mark.args else None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stacks", choices=("all", "without", "only"), default="all",
        help="run the whole-stack tests (the `stack` group) too (all), not at all "
             "(without) or alone (only); `make test` runs the rest on two workers, then "
             "these in one process")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stacks = config.getoption("--stacks")
    if stacks != "all":
        chosen = {item: (group_of(item) == STACK) == (stacks == "only") for item in items}
        keep = [item for item in items if chosen[item]]
        dropped = [item for item in items if not chosen[item]]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
    if stacks == "without":  # xdist keeps this order under --no-loadscope-reorder
        modules: dict[str, list[pytest.Item]] = {}
        for item in items:
            modules.setdefault(item.nodeid.split("::")[0], []).append(item)
        order = long_first({m: (any(t.get_closest_marker(LONG) for t in tests), len(tests))
                            for m, tests in modules.items()})
        items[:] = [item for module in order for item in modules[module]]


def long_first(modules: dict[str, tuple[bool, int]]) -> list[str]:
    """The modules (each: whether it is marked long, how many tests it has) in the order
    the workers take them: the long ones, then the rest, each by most tests first."""
    return sorted(modules, key=lambda m: (not modules[m][0], -modules[m][1]))
