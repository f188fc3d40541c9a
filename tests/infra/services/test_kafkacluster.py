"""A node of a Kafka cluster behind the local service interface, on a real KRaft node."""

from __future__ import annotations

import socket
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


def test_a_new_clusters_port_taken_before_the_node_binds_it_is_chosen_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A port found free and taken by another process before the JVM binds it (as in CI):
    the new cluster starts on other ports; the squatter keeps its port."""
    cluster = KafkaCluster(tmp_path / "kafka", tmp_path / "logs", nodes=1, heap_mb=256)
    spawn, squatters = cluster._spawn, []  # noqa: SLF001

    def squat_then_spawn(node: int, jars: list[Path]) -> None:
        if not squatters:  # the first start only: a listener on the client port, first
            squatter = socket.socket()
            squatter.bind(("127.0.0.1", cluster._ports[node].port))  # noqa: SLF001
            squatter.listen()
            squatters.append(squatter)
        spawn(node, jars)

    monkeypatch.setattr(cluster, "_spawn", squat_then_spawn)
    try:
        taken = None
        cluster.start()
        taken = squatters[0].getsockname()[1]
        assert cluster.node_bootstrap(1) != f"127.0.0.1:{taken}"
        assert "Address already in use" in cluster.log_path(1).read_text()
    finally:
        cluster.stop()
        for squatter in squatters:
            squatter.close()
    assert taken is not None
