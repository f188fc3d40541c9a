"""EndOffsets finds each partition's true end despite the embedded broker's quirk."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from ingest.settings import KafkaSettings
from views.kafka_offsets import TP, EndOffsets

pytestmark = pytest.mark.broker

Produce = Callable[[dict[TP, int]], None]


@pytest.fixture
def produce(kafka_settings: KafkaSettings) -> Produce:
    """Produce n records to each given partition, batched (linger) into several batches."""
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap, "linger.ms": 50,
                         "batch.num.messages": 7, "acks": "all", "enable.idempotence": True})

    def send(counts: dict[TP, int]) -> None:
        for (topic, partition), n in counts.items():
            for i in range(n):
                producer.produce(topic, value=b"r%d" % i, key=b"1", partition=partition)
        assert producer.flush(30) == 0, "records still unacknowledged after 30 s"

    return send


def _tps(settings: KafkaSettings) -> list[TP]:
    return [(t, p) for t in settings.physical_topics() for p in range(settings.partitions)]


def test_embedded_broker_lists_the_start_of_the_last_batch(
        kafka_settings: KafkaSettings, produce: Produce) -> None:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        pytest.skip("the quirk is the embedded broker's; real Kafka lists the exact end")
    tp = (kafka_settings.topic("tweets"), 0)
    produce({tp: 40})
    offsets = EndOffsets(kafka_settings.bootstrap)
    listed, true_end = offsets.listed([tp])[tp], offsets.ends([tp])[tp]
    assert true_end == 40
    assert listed < true_end, "ListOffsets is exact now: the workaround may be dropped"


def test_ends_are_true_ends_across_rounds_of_batches(
        kafka_settings: KafkaSettings, produce: Produce) -> None:
    tps = _tps(kafka_settings)
    offsets = EndOffsets(kafka_settings.bootstrap)
    expected = dict.fromkeys(tps, 0)
    assert offsets.ends(tps) == expected
    for round_sizes in ((23, 1, 0, 9, 0, 2), (5, 0, 17, 1, 0, 30), (1, 1, 1, 1, 1, 1)):
        counts = dict(zip(tps, round_sizes, strict=True))
        produce(counts)
        expected = {tp: expected[tp] + counts[tp] for tp in tps}
        assert offsets.ends(tps) == expected
        assert offsets.ends(tps) == expected  # from the cache


def test_ends_probe_only_partitions_whose_listed_end_moved(
        kafka_settings: KafkaSettings, produce: Produce,
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = (kafka_settings.topic("tweets"), 0), (kafka_settings.topic("tweets"), 1)
    offsets = EndOffsets(kafka_settings.bootstrap)
    probed: list[set[TP]] = []
    real_probe = offsets._probe

    def spy(listed: dict[TP, int]) -> dict[TP, int]:
        probed.append(set(listed))
        return real_probe(listed)

    monkeypatch.setattr(offsets, "_probe", spy)
    produce({a: 20, b: 20})
    assert offsets.ends([a, b]) == {a: 20, b: 20}
    assert offsets.ends([a, b]) == {a: 20, b: 20}
    produce({b: 3})
    assert offsets.ends([a, b]) == {a: 20, b: 23}
    assert probed == [{a, b}, {b}]


def test_one_record_batches_and_empty_partitions(kafka_settings: KafkaSettings) -> None:
    tp, empty = (kafka_settings.topic("users"), 1), (kafka_settings.topic("users"), 0)
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap, "linger.ms": 0})
    for i in range(3):
        producer.produce(tp[0], value=b"%d" % i, partition=tp[1])
        producer.flush(30)
    assert EndOffsets(kafka_settings.bootstrap).ends([tp, empty]) == {tp: 3, empty: 0}


def test_earliest_and_partition_discovery(kafka_settings: KafkaSettings) -> None:
    offsets = EndOffsets(kafka_settings.bootstrap)
    tps = offsets.topic_partitions(kafka_settings.physical_topics())
    assert tps == sorted(_tps(kafka_settings))
    assert offsets.earliest(tps) == dict.fromkeys(tps, 0)
    assert offsets.ends([]) == {} and offsets.earliest([]) == {}


def test_pickles_without_its_client(kafka_settings: KafkaSettings, produce: Produce) -> None:
    tp = (kafka_settings.topic("follows"), 1)
    produce({tp: 11})
    offsets = EndOffsets(kafka_settings.bootstrap)
    assert offsets.ends([tp]) == {tp: 11}
    copy = pickle.loads(pickle.dumps(offsets))
    assert copy.ends([tp]) == {tp: 11}
