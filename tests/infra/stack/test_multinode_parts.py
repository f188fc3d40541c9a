"""The parts of the multi-node stack that need no JVM: configs, names, the checker's sums.

What each node is told (its ``server.properties``, its ``cassandra.yaml``), how the
stack names and lists its nodes, the topics' durability settings, and the history
checker's arithmetic on hand-made histories. The clusters themselves run in
``tests/stack/nodes/test_nodes.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.checks.checker import History, Op, read_stats, refusal_windows
from infra.services.cassandra import Ports
from infra.services.cassandraring import CassandraRing, RingNode, initial_token, start_groups
from infra.services.kafkacluster import CLUSTER_FILE, KafkaCluster, min_insync
from infra.stack.multinode import NodesError, make_multinode
from infra.stack.stack import Stack
from ingest.topics import durability


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line
                and not line.startswith("#"))


def test_kafka_nodes_share_voters_and_keep_their_own_ports(tmp_path):
    cluster = KafkaCluster(tmp_path / "kafka", tmp_path / "logs", nodes=3)
    cluster._load()
    configs = [_properties(cluster._properties(n)) for n in (1, 2, 3)]
    voters = {c["controller.quorum.voters"] for c in configs}
    assert len(voters) == 1
    assert [v.split("@")[0] for v in voters.pop().split(",")] == ["1", "2", "3"]
    assert [c["node.id"] for c in configs] == ["1", "2", "3"]
    assert len({c["listeners"] for c in configs}) == 3
    for c in configs:
        assert c["default.replication.factor"] == "3"
        assert c["offsets.topic.replication.factor"] == "3"
        assert c["min.insync.replicas"] == "2"
        assert c["transaction.state.log.min.isr"] == "2"
        assert c["log.dirs"].endswith(f"node-{c['node.id']}/log")
    recorded = json.loads((tmp_path / "kafka" / CLUSTER_FILE).read_text())
    again = KafkaCluster(tmp_path / "kafka", tmp_path / "logs", nodes=3)
    assert again.bootstrap == cluster.bootstrap, "a restart must keep every node's ports"
    assert set(recorded["nodes"]) == {"1", "2", "3"}


def test_a_kafka_cluster_keeps_its_size(tmp_path):
    KafkaCluster(tmp_path / "kafka", tmp_path / "logs", nodes=3)._load()
    with pytest.raises(Exception, match="keeps its size"):
        KafkaCluster(tmp_path / "kafka", tmp_path / "logs", nodes=5)._load()


def test_majorities():
    assert [min_insync(n) for n in (1, 2, 3, 5)] == [1, 2, 2, 3]
    assert durability(1) == {}
    assert durability(3) == {"min.insync.replicas": "2"}


def test_cassandra_nodes_have_their_address_token_and_every_seed(tmp_path):
    ports = Ports(9100, 9101, 9102)
    node = RingNode(tmp_path / "n2", tmp_path / "n2.log", node=2, nodes=3, ports=ports)
    node._ports = ports
    text = node.yaml()
    assert "listen_address: 127.0.0.2\n" in text and "rpc_address: 127.0.0.2\n" in text
    assert 'seeds: "127.0.0.1:9101,127.0.0.2:9101,127.0.0.3:9101"' in text
    assert f"initial_token: {initial_token(2, 3)}\n" in text
    assert "auto_bootstrap: false" in text
    tokens = [initial_token(n, 3) for n in (1, 2, 3)]
    assert tokens[0] == -(2**63) and tokens == sorted(tokens) and tokens[2] < 2**63
    assert tokens[1] - tokens[0] == tokens[2] - tokens[1]


def test_a_ring_url_names_every_node_and_its_replication(tmp_path):
    ring = CassandraRing(tmp_path / "c", tmp_path / "logs", nodes=3)
    url = ring.url("fanout", "retry=900")
    port = ring.port
    assert url == f"cassandra://127.0.0.1,127.0.0.2,127.0.0.3:{port}/fanout?rf=3&retry=900"
    assert CassandraRing(tmp_path / "c", tmp_path / "logs", nodes=3).port == port


def test_a_ring_starts_its_first_node_alone_unless_a_node_it_kept_runs():
    assert start_groups([1, 2, 3], seeded=False) == [[1], [2, 3]]
    assert start_groups([2, 3], seeded=False) == [[2], [3]]
    assert start_groups([3], seeded=False) == [[3]]
    # Nodes started again beside a running one (a seed to each) start together.
    assert start_groups([1, 3], seeded=True) == [[1, 3]]


def _stack(tmp_path: Path) -> Stack:
    return Stack(run_dir=str(tmp_path), bootstrap="", store_url="", api_url="http://127.0.0.1:1")


def test_a_multinode_stack_lists_each_node(tmp_path):
    stack = _stack(tmp_path)
    assert stack.members("broker") == ["broker"]
    make_multinode(stack, 3, {})
    assert stack.members("broker") == ["kafka-1", "kafka-2", "kafka-3"]
    assert stack.members("spark-worker") == ["spark-worker-1", "spark-worker-2"]
    assert stack.members("job") == ["job"]
    state = stack.state()
    assert {"kafka-3", "cassandra-2", "spark-master", "spark-worker-2", "job", "api"} <= set(state)
    assert "broker" not in state and "cassandra" not in state
    assert stack.settings["FANOUT_REPLICATION"] == "3"


def test_nodes_refuse_an_external_cluster(tmp_path):
    with pytest.raises(NodesError, match="KAFKA_BOOTSTRAP"):
        make_multinode(_stack(tmp_path), 3, {"KAFKA_BOOTSTRAP": "kafka:9092"})


def _write(n: int, began: float, status: int, took: float = 0.1) -> Op:
    return Op(n, 1, began, took, status, "tok" if status == 202 else "")


def test_refusal_windows_run_from_the_first_refusal_to_the_next_202():
    writes = [_write(0, 0.0, 202), _write(1, 1.0, 503, 5.0), _write(2, 1.5, 0, 1.0),
              _write(3, 7.0, 202), _write(4, 8.0, 503), _write(5, 9.0, 202)]
    assert refusal_windows(writes) == [(1.0, 6.0, 2), (8.0, 8.1, 1)]
    assert refusal_windows([_write(0, 0.0, 202)]) == []


def test_read_stats_count_errors_and_percentiles_in_the_window():
    reads = [Op(-1, 1, float(i), (i + 1) / 1000, 200 if i % 10 else 503) for i in range(100)]
    stats = read_stats(reads, 0.0, 50.0)
    assert stats.count == 50 and stats.errors == 5
    assert stats.p50_ms == pytest.approx(25.0) and stats.p99_ms == pytest.approx(50.0)
    assert read_stats(reads, 1000.0).count == 0


def test_a_history_knows_its_own_texts():
    history, other = History(), History()
    assert history.parse(history.text(7)) == 7
    assert history.parse(other.text(7)) is None
    assert history.parse("hello") is None


def test_a_record_read_twice_is_one_record_and_a_write_at_two_positions_a_duplicate(
        tmp_path, monkeypatch):
    from infra.checks import checker
    from ingest.consistency import encode_token
    from ingest.events import TWEETS, Post, encode
    from views.delta import Delta
    from views.stores.sqlite import SQLiteStore

    history = History()
    for n, tweet in ((0, 70), (1, 71)):
        history.record(Op(history.number(), 5, 0.0, 0.01, 202,
                          encode_token(TWEETS, 0, 10 + n), tweet))
    posts = [Post(70 + n, 5, 1000 + n, history.text(n)) for n in range(2)]
    # Write 0 at offset 10, read twice (a fetch retried); write 1 at offsets 11 and 12.
    log_ = [(0, 10, posts[0]), (0, 10, posts[0]), (0, 11, posts[1]), (0, 12, posts[1])]
    monkeypatch.setattr(checker, "read_log", lambda *_: [(p, o, *encode(e)) for p, o, e in log_])
    with SQLiteStore(tmp_path / "v.sqlite", cap=10) as store:
        store.apply([Delta.tweet(p.tweet_id, 5, p.created_at, p.text) for p in posts])
        report = checker.check(history, "", "tweets", store)
    assert (report.acknowledged, report.lost, report.duplicated) == (2, [], [1])
