"""The changelog producer: every write of fanout enters Kafka through this class.

It owns the producer configuration that the contract depends on (DESIGN §3): acks=all
with idempotence, and the ``murmur2_random`` partitioner, which hashes keys exactly as
the Java clients do, so one author's tweets and follower edges land in the same
partition number of ``tweets`` and ``follows`` whichever client wrote them. Those three
settings cannot be overridden. It also owns the accounting: every record handed to
:meth:`ChangelogProducer.send` ends up counted as delivered or failed (or still in
flight, which :meth:`ChangelogProducer.close` reports), so a replay can say exactly
what reached the broker.

The constructor does no network I/O; :meth:`ChangelogProducer.start` (called lazily by
the first send) connects, and checks that the topics exist and are co-partitioned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import ClusterMetadata

from ingest.errors import BrokerUnavailable, ProduceError
from ingest.events import TOPICS, Event, encode
from ingest.settings import KafkaSettings
from ingest.topics import TopicLayoutError, check_copartitioned

log = logging.getLogger(__name__)

#: Settings the changelog contract depends on; overrides may not change them.
PINNED: Mapping[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    # Same hash as the Java client's default partitioner: co-partitioning across clients.
    "partitioner": "murmur2_random",
    # A topic missing when a record is sent (a broker back from a restart, empty) must
    # not be created by the send with the broker's partition count: create_topics does.
    "allow.auto.create.topics": False,
}
#: Defaults that overrides may change; lz4 costs the least CPU of Kafka's codecs.
DEFAULTS: Mapping[str, Any] = {
    "linger.ms": 5,
    "compression.type": "lz4",
    "message.timeout.ms": 30_000,
    "queue.buffering.max.messages": 200_000,
    "batch.num.messages": 10_000,
}
_BROKER_DOWN_CODES = frozenset({
    KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._MSG_TIMED_OUT,
})
#: Serve delivery callbacks every this many sends (poll(0) per send halves throughput).
_POLL_EVERY = 1_000


class Position(NamedTuple):
    """Where a record landed: physical topic, partition and offset (a consistency token)."""

    topic: str
    partition: int
    offset: int


DeliveryCallback = Callable[[Event, "Position | ProduceError"], None]


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """A snapshot of the producer's accounting; ``in_flight`` is not yet acknowledged.

    ``failures_by_reason`` counts failed deliveries by the client's error text.
    """

    sent: int = 0
    delivered: int = 0
    failed: int = 0
    last_error: str | None = None
    sent_by_topic: Mapping[str, int] = field(default_factory=dict)
    failures_by_reason: Mapping[str, int] = field(default_factory=dict)

    @property
    def in_flight(self) -> int:
        """Sent but neither delivered nor failed yet."""
        return self.sent - self.delivered - self.failed


class ChangelogProducer:
    """Produces :mod:`ingest.events` to the topics named by a :class:`KafkaSettings`.

    ``overrides`` are librdkafka settings; underscores stand for dots, so
    ``linger_ms=0`` means ``linger.ms=0``. Thread-safe: the HTTP write path may call
    :meth:`send_sync` from several threads.
    """

    def __init__(self, settings: KafkaSettings, *, backpressure_timeout: float = 60.0,
                 **overrides: Any) -> None:
        self._settings = settings
        self._config = _config(overrides)
        self._backpressure_timeout = backpressure_timeout
        self._topics = {logical: settings.topic(logical) for logical in TOPICS}
        self._producer: Producer | None = None
        self._closed = False
        self._lock = threading.Lock()  # guards the counters; callbacks take it
        self._start_lock = threading.Lock()
        self._since_poll = 0
        self._sent: Counter[str] = Counter()
        self._delivered = 0
        self._failed = 0
        self._last_error: str | None = None
        self._failures: Counter[str] = Counter()
        self._broker_down = False
        self._fatal = False

    # -- lifecycle ---------------------------------------------------------------

    def start(self, timeout: float = 10.0, *, check_topics: bool = True) -> None:
        """Connect, and check the topics exist with equal partition counts.

        Raises :class:`BrokerUnavailable` if no broker answers within ``timeout``, and
        :class:`~ingest.topics.TopicLayoutError` if a topic is missing (producing would
        auto-create it with the broker's partition count, breaking co-partitioning) or
        the partition counts differ.
        """
        with self._start_lock:
            if self._producer is not None:
                return
            if self._closed:
                msg = "producer is closed"
                raise ProduceError(msg)
            producer, metadata = self._connect(timeout)
            if check_topics:
                self._check_topics(metadata)
            self._producer = producer

    def close(self, timeout: float = 30.0) -> ProducerStats:
        """Flush (bounded), stop producing and return the final accounting."""
        remaining = self.flush(timeout)
        if remaining:
            self._record_error(f"{remaining} record(s) still unacknowledged at close")
        self._closed = True
        self._producer = None
        return self.stats

    def __enter__(self) -> ChangelogProducer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- producing ---------------------------------------------------------------

    def send(self, event: Event, on_delivery: DeliveryCallback | None = None) -> None:
        """Queue ``event``; waits (polling) while the local queue is full.

        The outcome is counted in :attr:`stats` and, if given, passed to
        ``on_delivery(event, Position | ProduceError)`` from a later poll/flush.
        """
        callback = self._on_delivery
        if on_delivery is not None:
            callback = partial(self._on_delivery_then, on_delivery, event)
        self._produce(event, callback)
        self._since_poll += 1
        if self._since_poll >= _POLL_EVERY:
            self._since_poll = 0
            self.poll(0)

    def send_sync(self, event: Event, timeout: float = 10.0) -> Position:
        """Produce ``event`` and wait for the broker's acknowledgement; return its position.

        Raises :class:`ProduceError` if the broker rejects it or does not answer within
        ``timeout`` (the record may then still arrive), :class:`BrokerUnavailable` if
        the broker is unreachable.
        """
        done = threading.Event()
        box: list[Position | ProduceError] = []
        self._produce(event, partial(self._on_delivery_sync, box, done), timeout)
        deadline = time.monotonic() + timeout
        while not done.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout_error(event, timeout)
            self.poll(min(remaining, 0.01))
        if isinstance(box[0], ProduceError):
            raise box[0]
        return box[0]

    def poll(self, timeout: float = 0) -> int:
        """Serve delivery callbacks; returns how many were served.

        Raises :class:`ProduceError` once the client hit a fatal error (see :attr:`fatal`).
        """
        producer = self._producer
        try:
            return producer.poll(timeout) if producer is not None else 0
        except KafkaException as exc:
            self._fatal = self._fatal or _fatal(exc)
            self._record_error(f"producer error: {exc}")
            msg = f"producer failed: {exc}"
            raise ProduceError(msg) from None

    @property
    def config(self) -> Mapping[str, Any]:
        """The librdkafka settings this producer connects with (a copy)."""
        return dict(self._config)

    @property
    def fatal(self) -> bool:
        """Whether the client hit a fatal error: it will never deliver again.

        An idempotent producer gets one when the broker no longer knows its producer
        id — e.g. a broker that came back from a restart without its data. Only a new
        producer can send then.
        """
        return self._fatal

    def flush(self, timeout: float = 30.0) -> int:
        """Wait at most ``timeout`` s for every queued record; return how many remain."""
        producer = self._producer
        if producer is None:
            return 0
        remaining = producer.flush(timeout)
        if remaining:
            log.warning("flush: %d record(s) still unacknowledged after %.1fs",
                        remaining, timeout)
        return remaining

    @property
    def stats(self) -> ProducerStats:
        """Counts so far: sent, delivered, failed, last error, sends by logical topic."""
        with self._lock:
            return ProducerStats(sum(self._sent.values()), self._delivered, self._failed,
                                 self._last_error, dict(self._sent), dict(self._failures))

    # -- internals -----------------------------------------------------------------

    def _connect(self, timeout: float) -> tuple[Producer, ClusterMetadata]:
        if not self._settings.bootstrap:
            msg = ("no broker address: KafkaSettings.bootstrap is empty "
                   "(run `fanout up` or set KAFKA_BOOTSTRAP)")
            raise BrokerUnavailable(msg)
        config = {**self._config, "bootstrap.servers": self._settings.bootstrap,
                  "error_cb": self._on_error, "logger": log}
        producer = Producer(config)
        try:
            # Metadata for all topics, never for a named one: a broker that auto-creates
            # topics would create it.
            return producer, producer.list_topics(timeout=timeout)
        except KafkaException as exc:
            msg = f"no broker answered at {self._settings.bootstrap} within {timeout}s: {exc}"
            raise BrokerUnavailable(msg) from None

    def _check_topics(self, metadata: ClusterMetadata) -> None:
        counts = {}
        for physical in self._topics.values():
            topic = metadata.topics.get(physical)
            if topic is None or topic.error is not None or not topic.partitions:
                msg = (f"topic {physical!r} does not exist on {self._settings.bootstrap}; "
                       "create the topics first (`fanout up` does)")
                raise TopicLayoutError(msg)
            counts[physical] = len(topic.partitions)
        check_copartitioned(counts, self._settings.partitions)

    def _produce(self, event: Event, callback: Callable[[Any, Message], None],
                 timeout: float | None = None) -> None:
        if self._producer is None:
            self.start()
        producer = self._producer
        assert producer is not None  # narrowed for the type checker
        key, value = encode(event)
        wait = self._backpressure_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        while True:
            try:
                producer.produce(self._topics[event.topic], value, key, on_delivery=callback)
                break
            except BufferError:
                # Local queue full: serve callbacks until the broker catches up.
                if time.monotonic() > deadline:
                    raise self._timeout_error(event, wait) from None
                producer.poll(0.05)
            except KafkaException as exc:
                self._fatal = self._fatal or _fatal(exc)
                msg = f"produce to {event.topic} failed: {exc}"
                raise ProduceError(msg) from None
        with self._lock:
            self._sent[event.topic] += 1

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            with self._lock:
                self._delivered += 1
                self._broker_down = False
            return
        with self._lock:
            self._failed += 1
            self._failures[err.str()] += 1
        self._record_error(f"{msg.topic()} key={_shown(msg.key())}: {err.str()}")

    def _on_delivery_then(self, user: DeliveryCallback, event: Event,
                          err: KafkaError | None, msg: Message) -> None:
        self._on_delivery(err, msg)
        user(event, self._outcome(err, msg))

    def _on_delivery_sync(self, box: list[Position | ProduceError], done: threading.Event,
                          err: KafkaError | None, msg: Message) -> None:
        self._on_delivery(err, msg)
        box.append(self._outcome(err, msg))
        done.set()

    def _outcome(self, err: KafkaError | None, msg: Message) -> Position | ProduceError:
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        if err is None and topic is not None and partition is not None and offset is not None:
            return Position(topic, partition, offset)
        text = f"{topic} not acknowledged: {err.str() if err else 'no position reported'}"
        if err is not None and err.code() in _BROKER_DOWN_CODES and self._broker_down:
            return BrokerUnavailable(text)
        return ProduceError(text)

    def _on_error(self, err: KafkaError) -> None:
        # librdkafka recovers from most of these on its own; they matter when they
        # explain why deliveries fail, so remember them and log the first of a streak.
        if err.code() in _BROKER_DOWN_CODES:
            if not self._broker_down:
                log.warning("broker unreachable: %s", err.str())
            self._broker_down = True
        else:
            log.warning("producer error: %s", err.str())
        if err.fatal():
            self._fatal = True
            self._record_error(f"fatal producer error: {err.str()}")

    def _record_error(self, text: str) -> None:
        with self._lock:
            self._last_error = text

    def _timeout_error(self, event: Event, timeout: float) -> ProduceError:
        text = f"{event.topic} record not acknowledged within {timeout}s"
        self._record_error(text)
        if self._broker_down:
            return BrokerUnavailable(f"{text}: broker {self._settings.bootstrap} unreachable")
        return ProduceError(f"{text}; it may still be delivered")


def _config(overrides: Mapping[str, Any]) -> dict[str, Any]:
    config = dict(DEFAULTS)
    for name, value in overrides.items():
        key = name.replace("_", ".")
        if key in PINNED and value != PINNED[key]:
            msg = f"{key} is fixed at {PINNED[key]!r} by the changelog contract"
            raise ValueError(msg)
        config[key] = value
    return {**config, **PINNED}


def _fatal(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and (err.fatal() or err.code() == KafkaError._FATAL)


def _shown(key: bytes | None) -> str:
    return "None" if key is None else key[:40].decode("ascii", "replace")
