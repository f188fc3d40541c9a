"""The local Kafka node's lifecycle and the changelog topic layout."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.services import process as process_module
from infra.services.broker import JIT, BrokerError, KafkaBroker
from infra.services.jars import JarError
from infra.services.procs import running
from ingest.settings import KafkaSettings
from ingest.topics import TopicLayoutError, check_copartitioned, create_topics
from tests.support.process import wait_for
from views.kafka_offsets import consumer_config


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(30) == 0


def _consume(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
    finally:
        consumer.close()
    return got


def test_constructor_does_no_io(tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path / "kafka", tmp_path / "logs" / "kafka.log")
    assert not (tmp_path / "logs").exists() and not (tmp_path / "kafka").exists()
    with pytest.raises(BrokerError, match="start"):
        _ = broker.bootstrap


def test_missing_jars_say_what_to_run(tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path / "kafka", jar_root=tmp_path / "empty-cache")
    with pytest.raises(JarError, match="make install"):
        broker.start()


@pytest.mark.broker
def test_records_survive_a_restart_and_a_sigkill(tmp_path: Path) -> None:
    """The log is on disk: a clean stop and a SIGKILL both keep every acked record."""
    data = tmp_path / "kafka"
    with KafkaBroker(data) as broker:
        host, port = broker.bootstrap.split(":")
        assert host == "127.0.0.1" and int(port) > 0
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic("kept", 1, 1)]).values():
            future.result(timeout=30)
        _produce(broker.bootstrap, "kept", [b"a", b"b"])
        first = broker.bootstrap
    broker = KafkaBroker(data).start()
    try:
        assert broker.bootstrap == first  # the same port again: clients find it
        _produce(broker.bootstrap, "kept", [b"c"])
        pid = broker.pid
        assert broker.ready() and running(pid, broker.marker)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not broker.ready(), 30, "the killed broker to stop answering")
        broker.stop()  # reaps it
        assert not _alive(pid)
    finally:
        broker.stop()
    with KafkaBroker(data) as again:
        assert _consume(again.bootstrap, "kept", 3) == [b"a", b"b", b"c"]


@pytest.mark.broker
def test_the_local_node_compiles_with_c1_only(kafka_bootstrap: str) -> None:
    # It shares the machine with the job: C2 compiling its fetch path took CPU from a
    # cold job reading a backlog (infra.services.process.JIT_OPTIONS).
    if os.environ.get("KAFKA_BOOTSTRAP"):
        pytest.skip("the suite runs against an external Kafka")
    port = int(kafka_bootstrap.rsplit(":", 1)[1])

    def listening(process: psutil.Process) -> bool:
        try:
            return (process.name() == "java" and "kafka.Kafka" in process.cmdline()
                    and any(c.laddr.port == port and c.status == psutil.CONN_LISTEN
                            for c in process.net_connections()))
        except psutil.Error:  # gone meanwhile, or a zombie another test's JVM left
            return False

    nodes = [p for p in psutil.process_iter() if listening(p)]
    assert nodes, f"no Kafka node of this machine listens on the session's {kafka_bootstrap}"
    assert JIT == ("-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m")
    assert all(set(JIT) <= set(p.cmdline()) for p in nodes)


def test_a_taken_port_moves_the_broker_to_another(tmp_path: Path) -> None:
    data = tmp_path / "kafka"
    with KafkaBroker(data) as broker:
        port = int(broker.bootstrap.rsplit(":", 1)[1])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with KafkaBroker(data) as moved:
            assert moved.bootstrap != f"127.0.0.1:{port}"
            AdminClient({"bootstrap.servers": moved.bootstrap}).list_topics(timeout=10)


def test_a_broker_that_cannot_start_is_reported_with_its_log(tmp_path: Path) -> None:
    data = tmp_path / "kafka"
    (data / "log").mkdir(parents=True)
    # A log directory formatted for another node id: Kafka refuses it at start.
    (data / "log" / "meta.properties").write_text(
        "version=1\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\nnode.id=99\n"
        "directory.id=AAAAAAAAAAAAAAAAAAAAAA\n")
    broker = KafkaBroker(data, start_timeout=60)
    with pytest.raises(BrokerError, match="exited before it answered"):
        broker.start()
    with pytest.raises(BrokerError):
        _ = broker.pid


def test_stop_kills_a_process_that_ignores_the_signal() -> None:
    script = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "print('ready', flush=True); time.sleep(60)")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    process_module.terminate(process, timeout=0.5, name="test")
    assert process.returncode == -9


@pytest.mark.broker
def test_create_topics_makes_copartitioned_topics(kafka_settings: KafkaSettings) -> None:
    topics = AdminClient({"bootstrap.servers": kafka_settings.bootstrap}).list_topics(
        timeout=5).topics
    for name in kafka_settings.physical_topics():
        assert len(topics[name].partitions) == 2
    assert create_topics(kafka_settings) == 2  # idempotent


@pytest.mark.broker
def test_create_topics_rejects_topics_with_different_partition_counts(
        kafka_bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap=kafka_bootstrap, partitions=2,
                             topic_prefix=f"t{uuid.uuid4().hex[:12]}_")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_topics([NewTopic(settings.topic("tweets"), 3, 1)]).values():
        future.result(timeout=10)
    with pytest.raises(TopicLayoutError, match="not co-partitioned"):
        create_topics(settings)


def test_check_copartitioned() -> None:
    assert check_copartitioned({"a": 4, "b": 4}, expected=4) == 4
    assert check_copartitioned({"a": 8, "b": 8}, expected=4) == 8
    with pytest.raises(TopicLayoutError, match="a=2, b=3"):
        check_copartitioned({"a": 2, "b": 3}, expected=2)


def test_create_topics_needs_a_bootstrap() -> None:
    with pytest.raises(TopicLayoutError, match="bootstrap"):
        create_topics(KafkaSettings(bootstrap=""))
