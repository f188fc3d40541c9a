"""Start and end offsets of Kafka partitions, and riding out a broker that is away.

This module owns how the Python source and ``fanout verify`` learn where each
partition begins and ends: one ListOffsets request per call (``earliest`` and
``latest``), which on Apache Kafka is exact — ``latest`` is the last offset + 1, the
high watermark. (The embedded Tansu broker used before listed the start of the last
record batch + 1 instead, and this module read records to find the true end; that
workaround went with the broker.) Nothing is cached: a partition that was truncated
or recreated simply lists a smaller end, which the source checks against what it has
read. :func:`retrying` is how the source rides out a broker that does not answer:
bounded retries with backoff and one log line per attempt, then
:class:`~views.errors.BrokerUnreachable`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from ingest.retry import attempts, within
from views.errors import BrokerUnreachable, SourceError

log = logging.getLogger(__name__)

#: A partition: (physical topic, partition number).
TP = tuple[str, int]

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
    fetches committed offsets. ``auto.offset.reset=error`` makes a fetch out of range
    (records deleted) an error instead of a silent jump.
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
    """Per-partition earliest and end offsets (ListOffsets), and partition discovery.

    The constructor does no I/O; the admin client is made on first use and kept for the
    object's life, through failed requests (librdkafka reconnects by itself), but not
    when pickled (a Spark stream reader carries one of these to its workers). A failed
    request does not drop the client: one that timed out is still in flight inside
    librdkafka, and destroying the client under it is the path a job's SIGSEGV in a
    ``rdk:broker`` thread followed, two seconds after such a drop, with the job cut off
    from the brokers.
    """

    def __init__(self, bootstrap: str, *, timeout: float = 10.0) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        self._admin: AdminClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_admin": None}

    def ends(self, tps: Iterable[TP]) -> dict[TP, int]:
        """The end (last offset + 1, the high watermark) of each partition, 0 when empty."""
        return self._list_offsets(tps, OffsetSpec.latest())

    def earliest(self, tps: Iterable[TP]) -> dict[TP, int]:
        """The first offset still stored in each partition."""
        return self._list_offsets(tps, OffsetSpec.earliest())

    def topic_partitions(self, topics: Iterable[str]) -> list[TP]:
        """The partitions of ``topics`` per cluster metadata, sorted.

        Lists all topics rather than naming them, so that the request can never
        auto-create a topic on a broker that allows it.
        """
        topics = list(topics)
        try:
            metadata = self._admin_client().list_topics(timeout=self.timeout).topics
        except KafkaException as exc:
            msg = f"metadata request to {self.bootstrap} failed: {exc}"
            raise KafkaReadError(msg) from exc
        missing = [t for t in topics if t not in metadata]
        if missing:
            msg = f"topics {missing} do not exist on {self.bootstrap}"
            raise KafkaReadError(msg)
        return sorted((t, p) for t in topics for p in metadata[t].partitions)

    def _list_offsets(self, tps: Iterable[TP], spec: OffsetSpec) -> dict[TP, int]:
        """One ListOffsets request, repeated within ``timeout`` while Kafka says to retry.

        Right after a topic is created its partitions may have no leader yet
        (``NOT_LEADER_FOR_PARTITION``, retriable), and right after a broker comes back
        its leader epochs may lag the client's (``UNKNOWN_LEADER_EPOCH``): both are
        waited out, not reported.
        """
        tps = list(tps)
        if not tps:
            return {}
        policy = within(self.timeout, first=_SETTLING_PAUSE_S, most=_SETTLING_PAUSE_S,
                        transient=_transient)
        try:
            return policy(self._list_offsets_once, tps, spec)
        except (KafkaException, TimeoutError) as exc:
            raise self._failed(tps, exc) from exc

    def _list_offsets_once(self, tps: list[TP], spec: OffsetSpec) -> dict[TP, int]:
        request = {TopicPartition(t, p): spec for t, p in tps}
        futures = self._admin_client().list_offsets(request, request_timeout=self.timeout)
        return {(tp.topic, tp.partition): f.result(timeout=self.timeout).offset
                for tp, f in futures.items()}

    def _failed(self, tps: list[TP], exc: Exception) -> KafkaReadError:
        detail = str(exc) or f"no answer within {self.timeout:g}s"
        topics = ", ".join(sorted({t for t, _ in tps}))
        return KafkaReadError(f"ListOffsets on {self.bootstrap} failed for {topics}: {detail}")

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, **_QUIET})
        return self._admin


#: Errors of a partition whose leadership is settling: its leader not known yet (a topic
#: just created), or the broker's view of its leader epoch behind or ahead of the
#: request's (a broker just back from a pause or a restart, a leader just moved). Kafka
#: names each retriable; librdkafka's admin results do not always say so.
_LEADERSHIP_SETTLING: Final = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE})


#: The pause between two ListOffsets while a partition's leadership settles (seconds).
_SETTLING_PAUSE_S: Final = 0.1


def _transient(exc: BaseException) -> bool:
    if not isinstance(exc, KafkaException):
        return False
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and (error.retriable() or
                                              error.code() in _LEADERSHIP_SETTLING)


def retrying(call: Callable[[], T], *, what: str, bootstrap: str, budget: float,
             on_failure: Callable[[], object] | None = None,
             sleep: Callable[[float], object] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> T:
    """``call()``, retried with exponential backoff while the broker does not answer.

    The policy is :func:`ingest.retry.within`'s: each failed attempt (a
    :class:`KafkaReadError`) logs one warning saying what was being done, the error and
    the pause before the next attempt (0.5 s, doubling, at most 15 s); ``on_failure``
    runs after each. Once ``budget`` seconds have passed it gives up with
    :class:`~views.errors.BrokerUnreachable`: bounded, never a spin.
    """

    def say(attempt: int, exc: BaseException, pause: float, left: float) -> None:
        log.warning("broker %s unreachable while %s (attempt %d): %s; retrying in "
                    "%.1fs, giving up in %.0fs", bootstrap, what, attempt, exc, pause, left)

    policy = within(budget, first=FIRST_BACKOFF, most=MAX_BACKOFF,
                    transient=lambda exc: isinstance(exc, KafkaReadError), say=say,
                    after=None if on_failure is None else lambda _: on_failure(),
                    sleep=sleep, clock=clock)
    try:
        result = policy(call)
    except KafkaReadError as exc:
        msg = (f"broker {bootstrap} unreachable for over {budget:.0f}s while {what} "
               f"({attempts(policy)} attempts; last error: {exc}). Giving up: start the view "
               f"job again once the broker is back with its topics; it resumes from its "
               f"checkpoint")
        log.error("%s", msg)
        raise BrokerUnreachable(msg) from exc
    if attempts(policy) > 1:
        log.warning("broker %s answers again (%s, after %d attempts)", bootstrap, what,
                    attempts(policy))
    return result
