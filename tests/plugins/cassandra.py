"""The session's Cassandra: an existing cluster, or one local node from the jar cache.

Tests work in keyspaces of their own on it, emptied and reused across a process's
tests (``tests/support/cassandra.py``), and dropped before the node stops.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.plugins.nodes import address, local_node, shared_node


@pytest.fixture(scope="session")
def cassandra_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Contact points (``host1,host2[:port]``) of Cassandra for the whole session.

    ``FANOUT_CASSANDRA_HOSTS`` names an existing cluster; otherwise the run's xdist
    workers share one local node (``tests/plugins/nodes.py``), or a process alone starts
    its own from the Maven jar cache (``infra.services.cassandra``), skipped only when
    the jars are not in the cache.
    """
    from tests.support.cassandra import close_pools

    external = os.environ.get("FANOUT_CASSANDRA_HOSTS")
    if external:
        yield external
        close_pools(external)
        return
    shared = shared_node("cassandra")
    if shared:
        yield shared
        close_pools(shared)
        return
    from infra.services.jars import JarError

    try:
        node = local_node("cassandra", tmp_path_factory.mktemp("cassandra"))
    except JarError as exc:
        pytest.skip(f"no Cassandra to test against: {exc}")
    with node:
        yield address(node)
        close_pools(address(node))
