"""The session's Kafka node and each test's own topics.

The broker starts once per session on random loopback ports; each test gets its own
uniquely prefixed topics (docs/style.md §8). ``KAFKA_BOOTSTRAP`` points the suite at an
existing cluster instead of the local Kafka node.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from ingest.settings import KafkaSettings
from ingest.topics import create_topics
from tests.plugins.nodes import address, local_node, shared_node


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a broker for the whole session: KAFKA_BOOTSTRAP's, else the node the
    run's xdist workers share (``tests/plugins/nodes.py``), else a local one of its own."""
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    shared = shared_node("kafka")
    if shared:
        yield shared
        return
    with local_node("kafka", tmp_path_factory.mktemp("kafka")) as broker:
        yield address(broker)


@pytest.fixture
def kafka_settings(kafka_bootstrap: str) -> KafkaSettings:
    """Settings naming three fresh, co-partitioned topics (2 partitions each)."""
    settings = KafkaSettings(bootstrap=kafka_bootstrap, partitions=2,
                             topic_prefix=f"t{uuid.uuid4().hex[:12]}_")
    create_topics(settings)
    return settings
