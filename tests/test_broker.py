"""The embedded broker's lifecycle and the changelog topic layout."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from infra import broker as broker_module
from infra.broker import BrokerError, EmbeddedBroker
from ingest.settings import KafkaSettings
from ingest.topics import TopicLayoutError, check_copartitioned, create_topics


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_constructor_does_no_io(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "logs" / "tansu.log")
    assert not (tmp_path / "logs").exists()
    with pytest.raises(BrokerError, match="start"):
        _ = broker.bootstrap


@pytest.mark.broker
def test_start_answers_on_loopback_and_stop_ends_process(tmp_path: Path) -> None:
    log_path = tmp_path / "tansu.log"
    with EmbeddedBroker(log_path) as broker:
        host, port = broker.bootstrap.split(":")
        pid = broker.pid
        assert host == "127.0.0.1" and int(port) > 0
        assert _alive(pid)
        AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=5)
    assert not _alive(pid)
    assert f"tcp://127.0.0.1:{port}" in log_path.read_text()


@pytest.mark.broker
def test_two_brokers_run_side_by_side(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "a.log") as first, EmbeddedBroker(tmp_path / "b.log") as second:
        assert first.bootstrap != second.bootstrap
        for broker in (first, second):
            AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=5)


def test_start_fails_clearly_when_the_binary_exits(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "tansu.log", binary="/bin/false", start_timeout=10)
    with pytest.raises(BrokerError, match="did not start"):
        broker.start()
    with pytest.raises(BrokerError):
        _ = broker.pid


def test_stop_kills_a_process_that_ignores_the_signal() -> None:
    script = ("import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
              "print('ready', flush=True); time.sleep(60)")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    broker_module._terminate(process, timeout=0.5)
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
