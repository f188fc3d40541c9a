"""The session's Kafka node and each test's own topics.

The broker starts once per session on random loopback ports; each test gets its own
uniquely prefixed topics (docs/style.md §8). ``KAFKA_BOOTSTRAP`` points the suite at an
existing cluster instead of the local Kafka node.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.services.broker import KafkaBroker
from ingest.settings import KafkaSettings
from ingest.topics import create_topics
from tests.plugins.shared import Started, joined, workers_dir


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory,
                    pytestconfig: pytest.Config) -> Iterator[str]:
    """host:port of a broker for the whole session (a local Kafka unless KAFKA_BOOTSTRAP):
    one for all of a run's xdist workers (``tests/plugins/shared.py``)."""
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    shared = workers_dir(pytestconfig)
    if shared is not None:
        def start(data: Path) -> Started:
            broker = KafkaBroker(data).start()
            return Started(broker.bootstrap, broker.pid)

        yield joined(shared, "kafka", start)
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
