"""The Cassandra store's driver settings for a node that stops answering.

A node cut off by dropped packets fails no request: each one sent to it waits out the
request timeout (DESIGN §10). Reads get past it by speculative executions, which the
driver runs only for statements marked idempotent, and connections to it are closed
by heartbeats. The URL options are checked as parsed; the wiring on the session's real
Cassandra node (``cassandra_hosts`` in ``tests/plugins/cassandra.py``), through the
store's own driver objects: its cluster, its profiles and its prepared statements.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.policies import ConstantSpeculativeExecutionPolicy, NoSpeculativeExecutionPlan

from tests.support.cassandra import fresh_keyspace
from views.stores import store_from_url
from views.stores.cassandra import statements as cql
from views.stores.cassandra.config import (
    RECONNECT_MAX_S,
    SPECULATIVE_ATTEMPTS,
    WRITE_PROFILE,
    ConfigError,
    cluster_options,
    parse_url,
)
from views.stores.cassandra.store import CassandraStore

#: A conditional statement (LWT) or a counter update: never safe to send twice.
_NOT_SAFE_TWICE = re.compile(r"\bIF\b|\b(\w+)\s*=\s*\1\s*[+-]", re.IGNORECASE)


def test_the_defaults_speculate_reads_and_heartbeat_every_two_seconds() -> None:
    config = parse_url("cassandra://c1/ks")
    assert (config.speculate_s, config.heartbeat_s, config.heartbeat_timeout_s) == (
        0.2, 2.0, 4.0)
    options = cluster_options(config)
    assert (options["idle_heartbeat_interval"], options["idle_heartbeat_timeout"]) == (2, 4)
    assert options["control_connection_timeout"] == config.timeout == 10
    read = options["execution_profiles"][EXEC_PROFILE_DEFAULT]
    write = options["execution_profiles"][WRITE_PROFILE]
    assert isinstance(read.speculative_execution_policy, ConstantSpeculativeExecutionPolicy)
    assert (read.speculative_execution_policy.delay,
            read.speculative_execution_policy.max_attempts) == (0.2, SPECULATIVE_ATTEMPTS)
    assert not isinstance(write.speculative_execution_policy,
                          ConstantSpeculativeExecutionPolicy)


def test_a_node_that_was_down_is_tried_every_ten_seconds_at_most_and_never_given_up() -> None:
    """The driver's default waits up to 600 s between tries and stops after 64."""
    policy = cluster_options(parse_url("cassandra://c1/ks"))["reconnection_policy"]
    waits = list(itertools.islice(policy.new_schedule(), 1000))
    assert len(waits) == 1000 and max(waits) == RECONNECT_MAX_S == 10 and waits[0] <= 1.15


def test_the_url_tunes_speculation_and_heartbeats() -> None:
    options = cluster_options(parse_url(
        "cassandra://c1/ks?speculate_ms=50&heartbeat=7&heartbeat_timeout=1.5"))
    assert (options["idle_heartbeat_interval"], options["idle_heartbeat_timeout"]) == (7, 1.5)
    policy = options["execution_profiles"][EXEC_PROFILE_DEFAULT].speculative_execution_policy
    assert policy.delay == 0.05
    off = cluster_options(parse_url("cassandra://c1/ks?speculate_ms=0&heartbeat=0"))
    assert off["idle_heartbeat_interval"] == 0
    assert not isinstance(off["execution_profiles"][EXEC_PROFILE_DEFAULT]
                          .speculative_execution_policy, ConstantSpeculativeExecutionPolicy)


@pytest.mark.parametrize(("query", "says"), [
    ("speculate_ms=-1", "whole number"), ("speculate_ms=0.5", "whole number"),
    ("heartbeat=x", "whole number"), ("heartbeat_timeout=0", "heartbeat_timeout"),
])
def test_bad_speculation_or_heartbeat_options_are_refused(query: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_url(f"cassandra://c1/ks?{query}")


@pytest.fixture(scope="module")
def store(cassandra_hosts: str) -> Iterator[CassandraStore]:
    """The store, open, on a fresh keyspace with URL settings of its own."""
    with fresh_keyspace(cassandra_hosts, "speculate_ms=150&heartbeat=3") as url:
        opened = store_from_url(url).open()
        assert isinstance(opened, CassandraStore)
        try:
            yield opened
        finally:
            opened.close()


def test_every_statement_is_idempotent_and_none_is_conditional(store: CassandraStore) -> None:
    """Marked idempotent, a statement may be sent twice (speculation, retries): so none
    may be a conditional write or a counter update."""
    prepared: dict[str, Any] = store._statements  # noqa: SLF001
    assert set(prepared) == set(cql.STATEMENTS)
    assert [n for n in sorted(prepared) if not prepared[n].is_idempotent] == []
    assert [n for n, s in sorted(prepared.items()) if _NOT_SAFE_TWICE.search(s.query_string)
            ] == []
    assert _NOT_SAFE_TWICE.search("INSERT INTO t (k) VALUES (?) IF NOT EXISTS")
    assert _NOT_SAFE_TWICE.search("UPDATE t SET n = n + 1 WHERE k = ?")


def test_a_read_speculates_and_a_write_does_not(store: CassandraStore) -> None:
    cluster, session = store._cluster, store._session  # noqa: SLF001
    assert (cluster.idle_heartbeat_interval, cluster.idle_heartbeat_timeout) == (3, 4)
    read = session.execute_async(store._statements["horizon_get"], (1,))  # noqa: SLF001
    read.result()
    plan = read._spec_execution_plan  # noqa: SLF001  (the driver's plan for this request)
    assert isinstance(plan, ConstantSpeculativeExecutionPolicy.ConstantSpeculativeExecutionPlan)
    assert plan.delay == 0.15
    write = session.execute_async(store._statements["clock_get"], (),  # noqa: SLF001
                                  execution_profile=WRITE_PROFILE)
    write.result()
    assert isinstance(write._spec_execution_plan, NoSpeculativeExecutionPlan)  # noqa: SLF001
