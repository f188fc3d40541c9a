"""EndOffsets: each partition's earliest and end offsets, as Kafka's ListOffsets lists them."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from ingest.settings import KafkaSettings
from tests.support.api import closed_port
from views.kafka_offsets import TP, EndOffsets, KafkaReadError

Produce = Callable[[dict[TP, int]], None]


def test_a_dead_broker_is_a_read_error_each_time_through_the_one_client() -> None:
    """The client outlives failed requests (one may still be in flight inside it)."""
    offsets = EndOffsets(f"127.0.0.1:{closed_port()}", timeout=1.0)
    with pytest.raises(KafkaReadError, match="ListOffsets on 127.0.0.1:"):
        offsets.ends([("tweets", 0)])
    client = offsets._admin
    assert client is not None
    with pytest.raises(KafkaReadError, match="metadata request to 127.0.0.1:"):
        offsets.topic_partitions(["tweets"])
    assert offsets._admin is client
    assert pickle.loads(pickle.dumps(offsets))._admin is None


class _Settling(EndOffsets):
    """A client whose first requests meet a broker whose leadership is still settling."""

    def __init__(self, bootstrap: str, errors: list[int]) -> None:
        super().__init__(bootstrap, timeout=10.0)
        self.errors = errors

    def _list_offsets_once(self, tps: list[TP], spec: object) -> dict[TP, int]:
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return super()._list_offsets_once(tps, spec)  # type: ignore[arg-type]


@pytest.mark.parametrize("code", [KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH,
                                  KafkaError.NOT_LEADER_FOR_PARTITION,
                                  KafkaError.OFFSET_NOT_AVAILABLE])
def test_leadership_settling_after_a_broker_comes_back_is_waited_out(
        kafka_settings: KafkaSettings, code: int) -> None:
    # A broker thawed after a SIGSTOP answered UNKNOWN_LEADER_EPOCH, which librdkafka's
    # admin result does not mark retriable, and a job's catch-up read failed on it.
    tp = (kafka_settings.topic("tweets"), 0)
    offsets = _Settling(kafka_settings.bootstrap, [code, code])
    assert offsets.ends([tp]) == {tp: 0} and offsets.errors == []
    with pytest.raises(KafkaReadError, match="INVALID_REQUEST|Broker: Invalid request"):
        _Settling(kafka_settings.bootstrap, [KafkaError.INVALID_REQUEST]).ends([tp])


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


@pytest.mark.broker
def test_ends_are_exact_across_rounds_of_batches(
        kafka_settings: KafkaSettings, produce: Produce) -> None:
    tps = _tps(kafka_settings)
    offsets = EndOffsets(kafka_settings.bootstrap)
    expected = dict.fromkeys(tps, 0)
    assert offsets.ends(tps) == expected
    # One size per (topic, partition): 4 topics × 2 partitions.
    for round_sizes in ((23, 1, 0, 9, 0, 2, 4, 0), (5, 0, 17, 1, 0, 30, 0, 3),
                        (1, 1, 1, 1, 1, 1, 1, 1)):
        counts = dict(zip(tps, round_sizes, strict=True))
        produce(counts)
        expected = {tp: expected[tp] + counts[tp] for tp in tps}
        assert offsets.ends(tps) == expected


@pytest.mark.broker
def test_one_record_batches_and_empty_partitions(kafka_settings: KafkaSettings) -> None:
    tp, empty = (kafka_settings.topic("users"), 1), (kafka_settings.topic("users"), 0)
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap, "linger.ms": 0})
    for i in range(3):
        # Keyed: Kafka refuses keyless records on the compacted users topic.
        producer.produce(tp[0], key=b"1", value=b"%d" % i, partition=tp[1])
        producer.flush(30)
    assert EndOffsets(kafka_settings.bootstrap).ends([tp, empty]) == {tp: 3, empty: 0}


@pytest.mark.broker
def test_earliest_and_partition_discovery(kafka_settings: KafkaSettings) -> None:
    offsets = EndOffsets(kafka_settings.bootstrap)
    tps = offsets.topic_partitions(kafka_settings.physical_topics())
    assert tps == sorted(_tps(kafka_settings))
    assert offsets.earliest(tps) == dict.fromkeys(tps, 0)
    assert offsets.ends([]) == {} and offsets.earliest([]) == {}


@pytest.mark.broker
def test_pickles_without_its_client(kafka_settings: KafkaSettings, produce: Produce) -> None:
    tp = (kafka_settings.topic("follows"), 1)
    produce({tp: 11})
    offsets = EndOffsets(kafka_settings.bootstrap)
    assert offsets.ends([tp]) == {tp: 11}
    copy = pickle.loads(pickle.dumps(offsets))
    assert copy.ends([tp]) == {tp: 11}
