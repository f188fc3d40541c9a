"""Session fixtures shared by the test suite: the broker, per-test topics, Spark.

Real services start once per session on random loopback ports; each test gets its
own uniquely prefixed topics (STYLE §8). ``KAFKA_BOOTSTRAP`` points the suite at an
existing cluster instead of the embedded broker.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from infra.broker import EmbeddedBroker
from ingest.settings import KafkaSettings
from ingest.topics import create_topics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a broker for the whole session (embedded unless KAFKA_BOOTSTRAP)."""
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    with EmbeddedBroker(tmp_path_factory.mktemp("broker") / "tansu.log") as broker:
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
