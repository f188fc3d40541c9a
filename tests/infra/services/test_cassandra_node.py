"""The local Cassandra node's lifecycle (``infra.services.cassandra``), on real JVMs.

A node of its own (not the session's): it is killed and restarted on the same data
directory with every acknowledged write, then stopped and restarted with its native
port taken by another socket, and must come back with its data on another port. The port choice and the failure paths need no running node.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.query import SimpleStatement

from infra.services.cassandra import (
    JIT,
    JIT_ENV,
    PORTS_FILE,
    CassandraError,
    LocalCassandra,
    Ports,
    choose_ports,
    node_yaml,
)
from infra.services.cassandraring import RING_FILE, CassandraRing, RingNode
from infra.services.jars import CASSANDRA, JarError, classpath
from infra.services.procs import cmdline, running
from views.stores.cassandra.config import parse_url
from views.stores.cassandra.executor import execute
from views.stores.cassandra.schema import connect

pytestmark = pytest.mark.long


def _jars_or_skip() -> None:
    try:
        classpath(CASSANDRA)
    except JarError as exc:
        pytest.skip(f"no Cassandra to test against: {exc}")


def test_missing_jars_say_what_to_run(tmp_path: Path) -> None:
    node = LocalCassandra(tmp_path / "node", jar_root=tmp_path / "empty-cache")
    with pytest.raises(JarError, match="make install"):
        node.start()
    assert not (tmp_path / "node").exists()  # nothing written before the check


def test_a_jvm_that_exits_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    _jars_or_skip()
    node = LocalCassandra(tmp_path / "node", heap_mb=1)  # the JVM refuses so small a heap
    with pytest.raises(CassandraError, match=r"exited during start(.|\n)*heap"):
        node.start()
    with pytest.raises(CassandraError, match="not running"):
        _ = node.pid


def test_the_yaml_names_only_loopback_and_the_given_ports(tmp_path: Path) -> None:
    text = node_yaml(tmp_path, Ports(native=1111, storage=2222, jmx=3333))
    assert "native_transport_port: 1111" in text and "storage_port: 2222" in text
    assert "listen_address: 127.0.0.1" in text and "rpc_address: 127.0.0.1" in text
    assert str(tmp_path.resolve() / "commitlog") in text
    # Writes are acknowledged after their fsync unless a benchmark asks for periodic.
    assert "commitlog_sync: batch" in text
    assert "commitlog_sync: periodic" in node_yaml(tmp_path, Ports(1, 2, 3), "periodic")
    with pytest.raises(CassandraError, match="commitlog must be one of"):
        LocalCassandra(tmp_path, commitlog="sometimes")
    # Tables default to the skip-list memtable; a benchmark may ask for the trie.
    assert "default:\n      inherits: skiplist" in text
    assert "inherits: trie" in node_yaml(tmp_path, Ports(1, 2, 3), memtable="trie")
    with pytest.raises(CassandraError, match="memtable must be one of"):
        LocalCassandra(tmp_path, memtable="btree")
    with pytest.raises(CassandraError, match="jit .* must be one of"):
        LocalCassandra(tmp_path, jit="c3")


def test_a_node_that_names_no_jit_takes_the_environments(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JIT_ENV, raising=False)
    assert LocalCassandra(tmp_path).jit == JIT
    monkeypatch.setenv(JIT_ENV, "c2")
    assert LocalCassandra(tmp_path).jit == "c2"
    assert RingNode(tmp_path, tmp_path / "n.log", node=1, nodes=1, ports=Ports(1, 2, 3)).jit == "c2"
    assert LocalCassandra(tmp_path, jit="c1").jit == "c1"  # a node that names one keeps it
    monkeypatch.setenv(JIT_ENV, "c3")
    with pytest.raises(CassandraError, match=f"jit \\({JIT_ENV}\\) must be one of c1, c2, not 'c3'"):
        LocalCassandra(tmp_path)


#: The writes the node acknowledges before it is killed.
ACKED = 20_000


def _keys(hosts: str, keyspace: str) -> set[int]:
    cluster, session = connect(parse_url(f"cassandra://{hosts}/{keyspace}"), wait=30)
    try:
        # Read page by page: one count(*) over the table is a single read that a node
        # starved by the suite's other workers aborts at its read timeout.
        return {row[0] for row in session.execute(
            SimpleStatement(f"SELECT k, v FROM {keyspace}.kv", fetch_size=1000), timeout=60)
            if row[1] == "acked"}
    finally:
        cluster.shutdown()


def test_a_node_keeps_acknowledged_writes_across_a_sigkill_and_a_stop(tmp_path: Path) -> None:
    """One node's life: acknowledged writes, a SIGKILL, a start; a stop, and a start with
    its native port taken by another socket (it comes back on another port).

    The job records a batch's offsets once Cassandra acknowledged its writes, and never
    writes that batch again: an acknowledged write the node loses is lost from the view.
    With the commit log synced every 10 s (periodic), 120 of 20,000 were gone after a
    SIGKILL; a write is acknowledged only once its commit log is synced (batch; group
    keeps that too, and passes this test as well).
    """
    _jars_or_skip()
    data = tmp_path / "node"
    node = LocalCassandra(data, heap_mb=512).start()
    try:
        assert node.ready() and running(node.pid, node.marker)
        assert node.started_in is not None and node.rss_bytes() > 100 * 2**20
        # The JVM stops at C1 (infra.services.cassandra.JIT), as Spark's and Kafka's do.
        assert "-XX:TieredStopAtLevel=1" in cmdline(node.pid)
        with pytest.raises(CassandraError, match="already runs"):
            LocalCassandra(data).start()  # a second JVM on the same files is refused
        cluster, session = connect(parse_url(node.url("kv_ks")), wait=30)
        try:
            session.execute("CREATE KEYSPACE kv_ks WITH replication = "
                            "{'class': 'SimpleStrategy', 'replication_factor': 1}")
            session.execute("CREATE TABLE kv_ks.kv (k int PRIMARY KEY, v text)")
            insert = session.prepare("INSERT INTO kv_ks.kv (k, v) VALUES (?, ?)")
            # As the job's sink does: a write the node timed out on (a starved box with
            # its commit log synced per batch) runs again until it is acknowledged.
            execute(session, [(insert, (k, "acked")) for k in range(ACKED)],
                    ["insert"] * ACKED, profile=EXEC_PROFILE_DEFAULT, concurrency=64,
                    retry_s=120)
        finally:
            cluster.shutdown()
        node.kill()
    finally:
        node.stop()
    assert not node.ready()
    with LocalCassandra(data, heap_mb=512) as again:
        first_port = again.port
        lost = ACKED - len(_keys(again.hosts, "kv_ks"))
        assert lost == 0, f"{lost} acknowledged writes lost to the SIGKILL"
    assert not again.ready()
    with socket.socket() as squatter:  # the old native port is taken: a new one is used
        squatter.bind(("127.0.0.1", first_port))
        squatter.listen()
        with LocalCassandra(data, heap_mb=512) as node:
            assert node.port != first_port
            assert _keys(node.hosts, "kv_ks") == set(range(ACKED))


def test_a_new_rings_port_taken_before_its_node_binds_it_is_chosen_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A port found free and taken by another process before the JVM binds it (as in CI):
    the new ring starts again on other ports; a ring that has run keeps its ports, and
    a taken one fails saying which file names it."""
    _jars_or_skip()
    ring = CassandraRing(tmp_path / "ring", tmp_path / "logs", nodes=1, heap_mb=320)
    spawn, squatters = RingNode._spawn, []

    def squat_then_spawn(node: RingNode, java: str, jars: list[Path], deadline: float) -> bool:
        if not squatters:  # the first start only: a listener on the storage port, first
            squatter = socket.socket()
            squatter.bind((node.address, node._ports.storage))  # noqa: SLF001
            squatter.listen()
            squatters.append(squatter)
        return spawn(node, java, jars, deadline)

    monkeypatch.setattr(RingNode, "_spawn", squat_then_spawn)
    try:
        ring.start()
        taken = squatters[0].getsockname()[1]
        storage = ring.member(1)._ports.storage  # noqa: SLF001
        assert storage != taken and f'"storage": {storage}' in (
            tmp_path / "ring" / RING_FILE).read_text()
        assert "in use by another process" in (tmp_path / "logs" / "cassandra-1.log").read_text()
        cluster, session = connect(parse_url(ring.url("system")), wait=30)
        try:
            assert session.execute("SELECT release_version FROM system.local").one()
        finally:
            cluster.shutdown()
        ring.stop()
        with socket.socket() as squatter:  # the ring's own port, taken now: no other
            squatter.bind(("127.0.0.1", storage))
            squatter.listen()
            with pytest.raises(CassandraError, match=f"recorded in .*{RING_FILE}.*taken"):
                CassandraRing(tmp_path / "ring", tmp_path / "logs", nodes=1).start()
    finally:
        ring.stop()
        for squatter in squatters:
            squatter.close()


def test_recorded_ports_are_reused_while_free(tmp_path: Path) -> None:
    (tmp_path / PORTS_FILE).write_text('{"native": 0, "storage": 0, "jmx": 0}')
    fresh = choose_ports(tmp_path)
    assert len({fresh.native, fresh.storage, fresh.jmx}) == 3 and 0 not in vars(fresh).values()
    (tmp_path / PORTS_FILE).write_text(
        f'{{"native": {fresh.native}, "storage": {fresh.storage}, "jmx": {fresh.jmx}}}')
    assert choose_ports(tmp_path) == fresh
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", fresh.native))
        again = choose_ports(tmp_path)
    assert again.native != fresh.native and again.storage == fresh.storage
    assert choose_ports(tmp_path, reuse=False) != fresh
