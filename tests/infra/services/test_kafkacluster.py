"""A node of a Kafka cluster behind the local service interface, on a real KRaft node."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.services.kafkacluster import KafkaCluster
from infra.services.procs import running

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]


def test_a_node_is_ready_found_by_its_marker_and_stopped_alone(tmp_path: Path) -> None:
    cluster = KafkaCluster(tmp_path / "kafka", tmp_path / "logs", nodes=1, heap_mb=256)
    node = cluster.member(1).start()
    pid = node.pid
    try:
        assert node.ready() and running(pid, node.marker)
        assert node.log_path == tmp_path.resolve() / "logs" / "kafka-1.log"
        assert node.log_path.stat().st_size > 0
    finally:
        node.stop()
    assert not running(pid, node.marker) and not node.ready()
    assert cluster.started == {}
