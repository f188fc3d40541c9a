"""The run's shared nodes (``tests/plugins/nodes.py``): asked for once, started once,
the same address for every worker, stopped with nothing left when the run ends."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.plugins.nodes import NODES_DIR_ENV, Keeper, shared_node


def test_a_process_outside_a_sharing_run_starts_its_own(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(NODES_DIR_ENV, raising=False)
    assert shared_node("kafka") is None


def test_every_worker_gets_the_one_node_and_it_stops_with_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    keeper = Keeper(tmp_path / "nodes")
    keeper.root.mkdir()
    keeper.start()
    monkeypatch.setenv(NODES_DIR_ENV, str(keeper.root))
    try:
        first = shared_node("kafka")
        again = shared_node("kafka")  # another worker, later: the same node
        assert first is not None and again == first
        assert len(keeper.nodes) == 1
        host, port = first.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10):
            pass
    finally:
        keeper.stop()
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=5):
        pass
    assert not keeper.root.exists()


def test_a_node_that_cannot_start_fails_the_tests_that_need_it_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "nodes"
    root.mkdir()
    (root / "cassandra.json").write_text(json.dumps({"error": "the run's cassandra node "
                                                               "did not start: port taken"}))
    monkeypatch.setenv(NODES_DIR_ENV, str(root))
    with pytest.raises(RuntimeError, match="port taken"):
        shared_node("cassandra")
    (root / "kafka.json").write_text(json.dumps({"skip": "no kafka to test against"}))
    with pytest.raises(pytest.skip.Exception, match="no kafka"):
        shared_node("kafka")
