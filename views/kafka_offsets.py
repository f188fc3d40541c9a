"""The true end (last offset + 1) and start of Kafka partitions, on any broker.

This module owns the one broker quirk the Kafka source depends on (DESIGN §10): the
embedded broker's ListOffsets answer for "latest" is the base offset of the *last
record batch* + 1, not the last offset + 1; only the high watermark inside a Fetch
response is right. Reading up to a listed value would leave the tail of the last
batch unread until the next write.

:class:`EndOffsets` finds the true end like this. ListOffsets is cheap, so it is asked
every time. A partition whose listed value is at most the end already found has not
grown (a new batch would start at or past that end, pushing the listed value beyond
it), so the cached end stands. Otherwise a *fresh* consumer is assigned at (listed
value − 1), which is inside the last batch, and reads until it has passed the high
watermark its first fetch reported. A fetch out of range returns nothing and no
error on that broker, so the read also stops after a no-progress timeout and falls
back to the end confirmed by records. Consumers are never kept: a long-lived one
reports a stale watermark and can leave a partition stuck.

On real Kafka the listed value is exact; the same code confirms it with one record.

A listed value that goes *back* means the partition was truncated or recreated (an
embedded broker restarted empty): its cached end is dropped and found again, so the
source sees that the log now ends before what it has read. :func:`retrying` is how
the source rides out a broker that does not answer: bounded retries with backoff and
one log line per attempt, then :class:`~views.errors.BrokerUnreachable`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from views.errors import BrokerUnreachable, SourceError

log = logging.getLogger(__name__)

#: A partition: (physical topic, partition number).
TP = tuple[str, int]

#: How long a probe waits for a record that should be there before giving up on it.
PROBE_IDLE_TIMEOUT: Final = 2.0
#: First and longest pause between attempts to reach an unreachable broker (seconds).
FIRST_BACKOFF: Final = 0.5
MAX_BACKOFF: Final = 15.0
#: librdkafka log level of our short-lived clients: critical only. A client of a dead
#: broker logs every reconnect; :func:`retrying` says it once per attempt instead.
_QUIET: Final = {"log_level": 2}

T = TypeVar("T")


class KafkaReadError(SourceError):
    """Kafka did not answer, or records that should exist did not arrive in time."""


def consumer_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """Config of a group-less consumer: ``assign()`` at explicit offsets, never commits.

    ``group.id`` is required by the client but unused: nothing subscribes, commits or
    fetches committed offsets (the embedded broker's group protocol is slow).
    """
    return {
        "bootstrap.servers": bootstrap,
        "group.id": f"fanout-nogroup-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "error",
        "allow.auto.create.topics": False,
        **overrides,
    }


class EndOffsets:
    """Per-partition true end offsets, cached while a partition has not grown.

    The constructor does no I/O; the admin client is made on first use and dropped
    when pickled (a Spark stream reader carries one of these to its workers).
    """

    def __init__(self, bootstrap: str, *, timeout: float = 10.0,
                 idle_timeout: float = PROBE_IDLE_TIMEOUT) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self._admin: AdminClient | None = None
        self._found: dict[TP, int] = {}
        self._listed: dict[TP, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_admin": None}

    def ends(self, tps: Iterable[TP]) -> dict[TP, int]:
        """The true end (last offset + 1) of each partition, 0 when empty.

        A listed value never goes back on a living partition; when it does, the
        partition was truncated or recreated (an embedded broker restarted empty), so
        its cached end is dropped and found again.
        """
        tps = list(tps)
        listed = self.listed(tps)
        for tp, n in listed.items():
            if n < self._listed.get(tp, 0):
                log.warning("the listed end of %s went back from %d to %d: the partition "
                            "was truncated or recreated", tp, self._listed[tp], n)
                self._found.pop(tp, None)
            self._listed[tp] = n
        grown = {tp: n for tp, n in listed.items() if n > self._found.get(tp, 0)}
        if grown:
            self._found |= self._probe(grown)
        return {tp: self._found.get(tp, 0) for tp in tps}

    def earliest(self, tps: Iterable[TP]) -> dict[TP, int]:
        """The first offset still stored in each partition."""
        return self._list_offsets(tps, OffsetSpec.earliest())

    def listed(self, tps: Iterable[TP]) -> dict[TP, int]:
        """The broker's ListOffsets "latest" answer (see the module docstring)."""
        return self._list_offsets(tps, OffsetSpec.latest())

    def topic_partitions(self, topics: Iterable[str]) -> list[TP]:
        """The partitions of ``topics`` per cluster metadata, sorted.

        Lists all topics rather than naming them: the embedded broker auto-creates a
        topic named in an admin metadata request.
        """
        topics = list(topics)
        try:
            metadata = self._admin_client().list_topics(timeout=self.timeout).topics
        except KafkaException as exc:
            self._admin = None  # a client of a dead broker keeps reconnecting: drop it
            msg = f"metadata request to {self.bootstrap} failed: {exc}"
            raise KafkaReadError(msg) from exc
        missing = [t for t in topics if t not in metadata]
        if missing:
            msg = f"topics {missing} do not exist on {self.bootstrap}"
            raise KafkaReadError(msg)
        return sorted((t, p) for t in topics for p in metadata[t].partitions)

    def forget(self) -> None:
        """Drop cached ends (e.g. after topics were recreated, or the broker was away)."""
        self._found.clear()
        self._listed.clear()

    def holding(self, wanted: dict[TP, int], timeout: float = 5.0) -> set[TP]:
        """The partitions that hold a record at their ``wanted`` offset or later (read).

        Confirms a suspected loss before it counts as one: a fetch past the end returns
        nothing on the embedded broker (and an out-of-range error on Kafka), so a
        partition with no record within ``timeout`` seconds holds none.
        """
        if not wanted:
            return set()
        consumer = Consumer(consumer_config(self.bootstrap, **_QUIET,
                                            **{"fetch.wait.max.ms": 10}))
        found: set[TP] = set()
        failed: set[TP] = set()
        try:
            consumer.assign([TopicPartition(t, p, n) for (t, p), n in wanted.items()])
            deadline = time.monotonic() + timeout
            while len(found | failed) < len(wanted) and time.monotonic() < deadline:
                for msg in consumer.consume(num_messages=100, timeout=0.1):
                    tp, offset = (msg.topic() or "", msg.partition() or 0), msg.offset()
                    if tp not in wanted:
                        continue  # a client-level error
                    if msg.error() is not None:
                        failed.add(tp)  # the partition's own error: out of range
                    elif offset is not None and offset >= wanted[tp]:
                        found.add(tp)
            return found
        finally:
            consumer.close()

    def _list_offsets(self, tps: Iterable[TP], spec: OffsetSpec) -> dict[TP, int]:
        tps = list(tps)
        if not tps:
            return {}
        request = {TopicPartition(t, p): spec for t, p in tps}
        futures = self._admin_client().list_offsets(request, request_timeout=self.timeout)
        try:
            return {(tp.topic, tp.partition): f.result(timeout=self.timeout).offset
                    for tp, f in futures.items()}
        except (KafkaException, TimeoutError) as exc:
            self._admin = None  # a client of a dead broker keeps reconnecting: drop it
            detail = str(exc) or f"no answer within {self.timeout:g}s"
            topics = ", ".join(sorted({t for t, _ in tps}))
            msg = f"ListOffsets on {self.bootstrap} failed for {topics}: {detail}"
            raise KafkaReadError(msg) from exc

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, **_QUIET})
        return self._admin

    def _probe(self, listed: dict[TP, int]) -> dict[TP, int]:
        """Read each partition from (listed − 1) up to its Fetch high watermark."""
        consumer = Consumer(consumer_config(self.bootstrap, **_QUIET,
                                            **{"fetch.wait.max.ms": 10}))
        try:
            consumer.assign([TopicPartition(t, p, n - 1) for (t, p), n in listed.items()])
            found = _read_to_watermarks(consumer, listed, self.idle_timeout)
        finally:
            consumer.close()
        for tp, end in found.items():
            if end < listed[tp]:
                log.warning("no record at %s offset %d (listed end %d); keeping %d",
                            tp, listed[tp] - 1, listed[tp], end)
        return found


def _read_to_watermarks(consumer: Consumer, listed: dict[TP, int],
                        idle_timeout: float) -> dict[TP, int]:
    """Consume until every partition passed the watermark of its first fetch.

    Returns last offset seen + 1 per partition (the listed value where no record came).
    The target is fixed at the first watermark seen so that a busy partition is not
    chased forever.
    """
    ends = dict(listed)
    targets: dict[TP, int] = {}
    idle_deadline = time.monotonic() + idle_timeout
    while len(targets) < len(listed) or any(ends[tp] < n for tp, n in targets.items()):
        messages = consumer.consume(num_messages=10_000, timeout=0.01)
        progress = False
        for msg in messages:
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            if topic is None or partition is None or offset is None or msg.error():
                _give_up_on(msg, targets, ends)
                continue
            tp = (topic, partition)
            ends[tp] = max(ends[tp], offset + 1)
            if tp not in targets:
                _, high = consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
                targets[tp] = max(high, ends[tp])
            progress = True
        if progress:
            idle_deadline = time.monotonic() + idle_timeout
        elif time.monotonic() >= idle_deadline:
            break
    return ends


def _give_up_on(message: Message, targets: dict[TP, int], ends: dict[TP, int]) -> None:
    """A probe error: fatal ones raise, a partition's own error ends its probe."""
    error: Any = message.error()
    if error is not None and error.fatal():
        msg = f"fatal Kafka consumer error while probing end offsets: {error}"
        raise KafkaReadError(msg)
    tp = (message.topic() or "", message.partition() or 0)
    if tp in ends:
        log.warning("probing the end of %s failed (%s); keeping %d", tp, error, ends[tp])
        targets[tp] = ends[tp]
    else:  # a client-level, transient error (connection); the idle timeout bounds it
        log.debug("consumer error while probing end offsets: %s", error)


def retrying(call: Callable[[], T], *, what: str, bootstrap: str, budget: float,
             on_failure: Callable[[], object] | None = None,
             sleep: Callable[[float], object] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> T:
    """``call()``, retried with exponential backoff while the broker does not answer.

    Each failed attempt (a :class:`KafkaReadError`) logs one warning saying what was
    being done, the error and the pause before the next attempt (0.5 s, doubling, at
    most 15 s); ``on_failure`` runs after each (e.g. to drop cached ends, which may
    not hold for the broker that comes back). Once ``budget`` seconds have passed it
    gives up with :class:`~views.errors.BrokerUnreachable`: bounded, never a spin.
    """
    deadline = clock() + budget
    delay, attempt = FIRST_BACKOFF, 0
    while True:
        attempt += 1
        try:
            result = call()
        except KafkaReadError as exc:
            if on_failure is not None:
                on_failure()
            left = deadline - clock()
            if left <= 0:
                msg = (f"broker {bootstrap} unreachable for over {budget:.0f}s while "
                       f"{what} ({attempt} attempts; last error: {exc}). Giving up: start "
                       f"the view job again once the broker is back with its topics; it "
                       f"resumes from its checkpoint")
                log.error("%s", msg)
                raise BrokerUnreachable(msg) from exc
            pause = min(delay, left)
            log.warning("broker %s unreachable while %s (attempt %d): %s; retrying in "
                        "%.1fs, giving up in %.0fs", bootstrap, what, attempt, exc, pause, left)
            sleep(pause)
            delay = min(delay * 2, MAX_BACKOFF)
            continue
        if attempt > 1:
            log.warning("broker %s answers again (%s, after %d attempts)", bootstrap, what,
                        attempt)
        return result
