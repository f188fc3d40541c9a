"""The request threads' one producer: shared, lazily started, failing fast when down.

:class:`SharedProducer` wraps :class:`~ingest.producer.ChangelogProducer` for a
process that writes one event per request (the API's write routes, :mod:`serving.writes`).
It is made on first use (constructors never touch the network), bounded at every
step, and fails fast for a short cool-down after the broker was found unreachable,
so a broker outage is refused quickly instead of tying up every worker thread. It
also keeps the error counts and a cached broker probe that health checks and
metrics read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ingest.errors import BrokerUnavailable, IngestError
from ingest.events import Event
from ingest.producer import ChangelogProducer, Position
from ingest.settings import KafkaSettings
from ingest.topics import TopicLayoutError

log = logging.getLogger(__name__)


class WriterStats(NamedTuple):
    """Errors the write path has seen; ``last_error`` is the newest, for logs and health."""

    errors: int
    last_error: str | None
    cooling_down: bool


class SharedProducer:
    """A lazily started :class:`ChangelogProducer` shared by the request threads.

    ``connect_timeout`` bounds the first connection, ``cooldown`` is how long sends
    fail fast after the broker was found unreachable, ``probe_every`` how stale the
    health probe may be. ``overrides`` go to the producer (librdkafka settings).
    """

    def __init__(self, settings: KafkaSettings, *, connect_timeout: float = 5.0,
                 cooldown: float = 2.0, probe_every: float = 5.0, **overrides: Any) -> None:
        self.settings = settings
        self._connect_timeout, self._cooldown = connect_timeout, cooldown
        self._probe_every = probe_every
        self._overrides = overrides
        self._producer: ChangelogProducer | None = None
        self._lock = threading.Lock()
        self._errors = 0
        self._last_error: str | None = None
        self._down_until = 0.0
        self._probe = _Probe(settings.bootstrap, probe_every)

    def send_sync(self, event: Event, timeout: float = 10.0) -> Position:
        """Produce and wait for the acknowledgement, failing fast while cooling down."""
        if time.monotonic() < self._down_until:
            msg = f"broker unreachable a moment ago; not retrying for {self._cooldown:g}s"
            raise BrokerUnavailable(msg)
        try:
            producer = self._get()
            producer.start(timeout=min(timeout, self._connect_timeout))
            return producer.send_sync(event, timeout)
        except IngestError as exc:
            self._failed(exc)
            raise

    @property
    def config(self) -> Mapping[str, Any]:
        """The librdkafka settings its producer connects with (makes none)."""
        return ChangelogProducer(self.settings, **self._overrides).config

    def broker_reachable(self) -> bool | None:
        """Whether a broker answered a metadata request lately (None: none configured)."""
        return self._probe.reachable()

    @property
    def stats(self) -> WriterStats:
        with self._lock:
            return WriterStats(self._errors, self._last_error,
                               time.monotonic() < self._down_until)

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is in flight (bounded) and drop the producer."""
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.close(timeout)

    def _get(self) -> ChangelogProducer:
        with self._lock:
            if self._producer is None:
                self._producer = ChangelogProducer(self.settings, **self._overrides)
            return self._producer

    def _failed(self, exc: IngestError) -> None:
        log.warning("write not produced: %s", exc)
        with self._lock:
            self._errors += 1
            self._last_error = str(exc)
            broken, producer = self._producer is not None and self._producer.fatal, None
            if broken:  # it will never deliver again: the next write makes a new one
                producer, self._producer = self._producer, None
            elif not isinstance(exc, BrokerUnavailable | TopicLayoutError):
                return
            self._down_until = time.monotonic() + self._cooldown
        if producer is not None:
            log.warning("the producer hit a fatal error (%s); replacing it", exc)
            producer.close(0)
        self._probe.mark_down()


class _Probe:
    """A cached metadata request: at most one every ``every`` seconds, never concurrent.

    Each probe uses a fresh, quiet admin client: a long-lived one would keep
    reconnecting to a dead broker in the background and log every attempt.
    """

    def __init__(self, bootstrap: str, every: float, timeout: float = 1.0) -> None:
        self._bootstrap, self._every, self._timeout = bootstrap, every, timeout
        self._lock = threading.Lock()
        self._checked_at = -float("inf")
        self._ok = True

    def reachable(self) -> bool | None:
        if not self._bootstrap:
            return None
        if time.monotonic() - self._checked_at >= self._every and self._lock.acquire(False):
            try:
                self._ok = self._ask()
                self._checked_at = time.monotonic()
            finally:
                self._lock.release()
        return self._ok

    def mark_down(self) -> None:
        self._ok, self._checked_at = False, time.monotonic()

    def _ask(self) -> bool:
        admin = AdminClient({"bootstrap.servers": self._bootstrap, "log_level": 0})
        try:
            # All topics, never a named one: a broker that auto-creates topics would.
            admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            log.warning("health: broker %s unreachable: %s", self._bootstrap, exc)
            return False
        return True
