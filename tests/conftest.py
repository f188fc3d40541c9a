"""Session fixtures shared by the test suite: the broker, per-test topics, Spark.

Real services start once per session on random loopback ports; each test gets its
own uniquely prefixed topics (STYLE §8). ``KAFKA_BOOTSTRAP`` points the suite at an
existing cluster instead of the local Kafka node.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from infra.broker import KafkaBroker
from ingest.settings import KafkaSettings
from ingest.topics import create_topics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a broker for the whole session (a local Kafka unless KAFKA_BOOTSTRAP)."""
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker.bootstrap


@pytest.fixture
def kafka_settings(kafka_bootstrap: str) -> KafkaSettings:
    """Settings naming three fresh, co-partitioned topics (2 partitions each)."""
    settings = KafkaSettings(bootstrap=kafka_bootstrap, partitions=2,
                             topic_prefix=f"t{uuid.uuid4().hex[:12]}_")
    create_topics(settings)
    return settings


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local SparkSession (2 shuffle partitions) with the fanout-kafka source."""
    from infra.spark import build_session  # imports pyspark: only when a test needs it

    session = build_session("fanout-tests", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cassandra_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Contact points (``host1,host2[:port]``) of Cassandra for the whole session.

    ``FANOUT_CASSANDRA_HOSTS`` names an existing cluster; otherwise one local node
    starts from the Maven jar cache (``infra.cassandra``), skipped only when the jars
    are not in the cache.
    """
    external = os.environ.get("FANOUT_CASSANDRA_HOSTS")
    if external:
        yield external
        return
    from infra.cassandra import LocalCassandra
    from infra.jars import CASSANDRA, JarError, classpath

    try:
        classpath(CASSANDRA)
    except JarError as exc:
        pytest.skip(f"no Cassandra to test against: {exc}")
    with LocalCassandra(tmp_path_factory.mktemp("cassandra"), heap_mb=512) as node:
        yield node.hosts


@pytest.fixture
def booted_just_now(monkeypatch: pytest.MonkeyPatch) -> float:
    """``time.monotonic`` as on a host booted a moment ago: it counts from ~0.

    Linux's monotonic clock starts at boot, so code that takes a start value of 0 for
    "never" behaves differently on a fresh CI machine than on one up for days; tests
    that touch such code run under this fixture so the fresh machine's case is the
    one checked, whatever this host's uptime. Returns the offset taken off.
    """
    import time

    real = time.monotonic
    origin = real()
    monkeypatch.setattr(time, "monotonic", lambda: real() - origin)
    return origin
