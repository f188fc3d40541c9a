"""The changelogs followed as they grow, held back to where the view stands.

The live verifier (:mod:`infra.checks.verifier`) keeps a reference of the view that must
stand exactly where the store stands: at the offsets the store has applied, not at
the end of the log. :class:`LogTail` reads every partition of the topics that the
view's meaning is made of — tweets, follows, users; not activity, which changes how
the view is kept, never what it says (DESIGN §4b, inactive users) — from the start,
once, with ``assign()`` and no consumer group, and then keeps reading what is
appended. Each record is decoded once, as the job's sources decode it (an invalid
record is a dead letter there and nothing here), and waits in its partition's buffer
until the caller *releases* it: the verifier releases exactly the records at or
below the store's applied offsets, so the records past them (the view's lag) are all
that is ever held. Nothing is read twice; a log that no longer holds what was read
(a topic deleted and recreated, a partition added) raises :class:`LogReset`, and the
caller starts over from the beginning.

The decoding is :func:`ingest.events.decode` and the row mapping of
:mod:`views.row` — what :func:`views.source.event_row` does — called directly, so
that this long-lived process never imports PySpark (70 MB of resident memory).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from infra.errors import InfraError
from ingest.events import (
    FOLLOWS,
    KINDS,
    TWEETS,
    USERS,
    AccountDelete,
    Activity,
    Delete,
    Event,
    Follow,
    Post,
    Relation,
    Repost,
    Unrepost,
    UserUpsert,
    decode,
)
from ingest.settings import KafkaSettings
from views.kafka_offsets import EndOffsets, consumer_config
from views.row import event_fields, to_event

log = logging.getLogger(__name__)

#: The topics whose records the view's meaning is a function of.
MEANING_TOPICS: Final = (TWEETS, FOLLOWS, USERS)
#: A partition by its logical topic name: how the store names applied offsets.
LogicalTP = tuple[str, int]
#: Offsets per partition; -1 (or absent): nothing of that partition.
Offsets = Mapping[LogicalTP, int]

_CONF: Final = {"fetch.wait.max.ms": 100, "queued.min.messages": 20_000}
_BATCH: Final = 5_000


class LogReset(InfraError):
    """The log no longer holds what was read from it: read it again from the start."""


class LogTail:
    """Decoded records of :data:`MEANING_TOPICS`, buffered until released (module doc)."""

    def __init__(self, kafka: KafkaSettings, timeout: float = 10.0) -> None:
        self.kafka = kafka
        self._ends = EndOffsets(kafka.bootstrap, timeout=timeout)
        self._consumer: Consumer | None = None
        self._buffers: dict[LogicalTP, deque[tuple[int, Event | None]]] = {}
        #: The next offset to read per partition (everything below it has been read).
        self.next: dict[LogicalTP, int] = {}
        self.read = 0

    @property
    def started(self) -> bool:
        return self._consumer is not None

    def start(self) -> LogTail:
        """Assign every partition from its beginning (raises ``KafkaReadError``)."""
        physical = [self.kafka.topic(t) for t in MEANING_TOPICS]
        tps = self._ends.topic_partitions(physical)
        consumer = Consumer(consumer_config(self.kafka.bootstrap, **_CONF))
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in tps])
        self._consumer = consumer
        for topic, part in tps:
            key = (self.kafka.logical(topic), part)
            self._buffers[key] = deque()
            self.next[key] = 0
        return self

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def poll(self, budget: float) -> int:
        """Read what has arrived, for at most ``budget`` seconds; how many records."""
        if self._consumer is None:
            msg = "the log tail is not started"
            raise LogReset(msg)
        deadline = time.monotonic() + budget
        count = 0
        while True:
            batch = self._consumer.consume(num_messages=_BATCH, timeout=0.01)
            for record in batch:
                self._take(record)
            count += len(batch)
            if len(batch) < _BATCH or time.monotonic() >= deadline:
                self.read += count
                return count

    def _take(self, msg: Any) -> None:
        error = msg.error()
        if error is not None:
            if error.fatal() or msg.topic() is not None:
                text = f"reading {msg.topic()}[{msg.partition()}]: {error}"
                raise LogReset(text)
            return  # a client-level hiccup (a dropped connection): the client retries
        key = (self.kafka.logical(msg.topic()), msg.partition())
        offset = msg.offset()
        self._buffers[key].append((offset, _event(key[0], msg.key(), msg.value())))
        self.next[key] = offset + 1

    def reached(self, upto: Offsets) -> bool:
        """Whether every record at or below ``upto`` has been read."""
        for tp, offset in upto.items():
            if offset < 0:
                continue
            if tp not in self.next:
                msg = f"{tp[0]}[{tp[1]}] is not a partition this tail reads (a partition added?)"
                raise LogReset(msg)
            if self.next[tp] <= offset:
                return False
        return True

    def release(self, upto: Offsets) -> list[Event]:
        """Hand over (and forget) the events at or below ``upto``, in log order per partition."""
        out: list[Event] = []
        for tp, buffer in self._buffers.items():
            limit = upto.get(tp, -1)
            while buffer and buffer[0][0] <= limit:
                event = buffer.popleft()[1]
                if event is not None:
                    out.append(event)
        return out

    def held(self, upto: Offsets) -> Iterator[Event]:
        """The events still held at or below ``upto`` (not released)."""
        for tp, buffer in self._buffers.items():
            limit = upto.get(tp, -1)
            for offset, event in buffer:
                if offset > limit:
                    break
                if event is not None:
                    yield event

    def between(self, after: Offsets, upto: Offsets) -> Iterator[Event]:
        """The events still held above ``after`` and at or below ``upto``."""
        for tp, buffer in self._buffers.items():
            low, limit = after.get(tp, -1), upto.get(tp, -1)
            for offset, event in buffer:
                if offset > limit:
                    break
                if offset > low and event is not None:
                    yield event

    def pending(self) -> int:
        """Records read and not yet released."""
        return sum(len(b) for b in self._buffers.values())

    def ends(self) -> dict[LogicalTP, int]:
        """Each partition's end (last offset + 1) now, from Kafka (one ListOffsets request)."""
        physical = {(self.kafka.topic(t), p): (t, p) for t, p in self._buffers}
        return {physical[tp]: end for tp, end in self._ends.ends(physical).items()}


def _event(topic: str, key: bytes | None, value: bytes | None) -> Event | None:
    """The event a record carries as the job sees it, or None for an invalid record."""
    try:
        return to_event(*event_fields(decode(topic, key, value)))
    except Exception:  # a dead letter to the job, whatever it holds: no part of the view
        return None


def _author(event: Any) -> tuple[int, ...]:
    return (event.author_id,)


def _edge(event: Any) -> tuple[int, ...]:
    return (event.follower_id, event.followee_id)


def _user(event: Any) -> tuple[int, ...]:
    return (event.user_id,)


#: The users each kind's events name (``ingest.events.KINDS``), by event class: whose
#: timelines, or whose entries, they can change. A read changes neither.
_NAMED: Final[dict[type, Callable[[Any], tuple[int, ...]]]] = {
    Post: _author,
    Delete: _author,
    Unrepost: _author,
    Repost: lambda event: (event.author_id, event.original_author_id),
    Follow: _edge,
    Relation: _edge,
    AccountDelete: _user,
    UserUpsert: _user,
    Activity: lambda _event: (),
}
if _MISSING := sorted(c.__name__ for c in {k.event for k in KINDS} - _NAMED.keys()):
    _MSG = f"logtail names no users for {', '.join(_MISSING)} (ingest.events.KINDS)"
    raise TypeError(_MSG)


def named_users(event: Event) -> tuple[int, ...]:
    """The users an event names: whose timelines, or whose entries, it can change."""
    return _NAMED[type(event)](event)
