"""Replaying a stream of history events into the changelogs, fast or paced.

It owns the loop between a reader (``ingest.history``) and a producer: pacing at the
original inter-event times divided by a speed-up (or no pacing at all), the progress
bar on stderr, and the end-of-run summary, which accounts for every event: sent by
topic, delivered, failed, still unacknowledged after the bounded final flush, and the
lines the readers rejected or skipped. A replay never stops on a bad line; it stops
early only when the producer gives up, when more than ``max_failures`` deliveries
failed (with the broker gone, every further record would fail after the producer's
message timeout), on a read error, or on Ctrl-C, and says so in the summary.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tqdm import tqdm

from ingest.errors import ProduceError
from ingest.events import TOPICS, Event, encode
from ingest.history import ReadReport
from ingest.producer import DeliveryCallback, ProducerStats
from ingest.progress import progress as progress_bar

log = logging.getLogger(__name__)

_BAR_STEP = 1_000


class Sink(Protocol):
    """What a replay needs of a producer (``ChangelogProducer`` or ``DryRunProducer``)."""

    def send(self, event: Event, on_delivery: DeliveryCallback | None = None) -> None:
        """Queue one event."""

    def poll(self, timeout: float = 0) -> int:
        """Serve delivery callbacks for up to ``timeout`` seconds."""

    def flush(self, timeout: float = 30.0) -> int:
        """Wait (bounded) for everything queued; return how many remain."""

    @property
    def stats(self) -> ProducerStats:
        """Accounting so far."""


class DryRunProducer:
    """A sink that encodes and counts events but sends nothing (``--dry-run``)."""

    def __init__(self) -> None:
        self._sent: dict[str, int] = dict.fromkeys(TOPICS, 0)

    def send(self, event: Event, on_delivery: DeliveryCallback | None = None) -> None:
        """Encode ``event`` and count it as delivered."""
        encode(event)
        self._sent[event.topic] += 1

    def poll(self, timeout: float = 0) -> int:
        """Sleep ``timeout`` s (a real producer would serve callbacks meanwhile)."""
        time.sleep(timeout)
        return 0

    def flush(self, timeout: float = 30.0) -> int:
        """Nothing is ever pending."""
        return 0

    @property
    def stats(self) -> ProducerStats:
        """Everything sent counts as delivered."""
        sent = sum(self._sent.values())
        return ProducerStats(sent, sent, 0, None, dict(self._sent))


@dataclass(frozen=True)
class ReplaySummary:
    """The accounting of one replay."""

    sent_by_topic: Mapping[str, int]
    delivered: int
    failed: int
    unacknowledged: int
    duration_s: float
    invalid: int = 0
    skipped: Mapping[str, int] = field(default_factory=dict)
    failures_by_reason: Mapping[str, int] = field(default_factory=dict)
    last_error: str | None = None
    aborted: str | None = None
    behind_s: float | None = None

    @property
    def events(self) -> int:
        """Events sent, all topics."""
        return sum(self.sent_by_topic.values())

    @property
    def events_per_s(self) -> float:
        """Events sent per second of the whole run, final flush included."""
        return self.events / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def ok(self) -> bool:
        """Everything read was acknowledged and the run was not cut short."""
        return not (self.failed or self.unacknowledged or self.aborted)

    def render(self) -> str:
        """A few lines for a person."""
        topics = ", ".join(f"{t} {n:,}" for t, n in sorted(self.sent_by_topic.items()) if n)
        lines = [f"replayed {self.events:,} events in {self.duration_s:.1f}s "
                 f"({self.events_per_s:,.0f} events/s): {topics or 'none'}",
                 f"delivered {self.delivered:,}, failed {self.failed:,}, "
                 f"unacknowledged {self.unacknowledged:,}",
                 f"invalid lines skipped {self.invalid:,}"
                 + "".join(f", {reason} skipped {n:,}" for reason, n in self.skipped.items())]
        if self.behind_s is not None:
            lines.append(f"pacing: at most {self.behind_s:.2f}s behind schedule")
        if self.aborted:
            lines.append(f"ABORTED: {self.aborted}")
        lines += [f"failed ({reason}): {n:,}" for reason, n in self.failures_by_reason.items()]
        if self.last_error and not self.ok:
            lines.append(f"last error: {self.last_error}")
        return "\n".join(lines)


def replay(events: Iterable[Event], producer: Sink, speedup: float | None = None,
           progress: bool = True, *, report: ReadReport | None = None,
           total: int | None = None, flush_timeout: float = 60.0,
           max_failures: int | None = 1_000) -> ReplaySummary:
    """Send ``events`` in order through ``producer`` and account for every one.

    ``speedup=None`` sends as fast as possible; ``speedup=x`` waits so that events go
    out at their original spacing (``created_at``) divided by ``x``. ``report`` is the
    readers' report (invalid and skipped lines) to include; ``total`` sizes the bar.
    The replay stops early once more than ``max_failures`` deliveries have failed
    (None: never): with the broker gone, every further record would fail too.
    """
    if speedup is not None and speedup <= 0:
        msg = "speedup must be positive"
        raise ValueError(msg)
    before, started = producer.stats, time.monotonic()
    pacer = _Pacer(speedup, producer) if speedup else None
    aborted = None
    bar = progress_bar(total=total, unit="ev", unit_scale=True, disable=not progress,
                       mininterval=0.5, smoothing=0.05)
    try:
        _pump(events, producer, pacer, bar, _FailureLimit(producer, before, max_failures))
    except ProduceError as exc:
        aborted = str(exc)
    except (OSError, EOFError, ValueError) as exc:
        log.exception("reading the history failed")
        aborted = f"reading failed: {exc}"
    except KeyboardInterrupt:
        aborted = "interrupted"
    finally:
        bar.close()
    remaining = producer.flush(flush_timeout)
    return _summary(before, producer.stats, remaining, time.monotonic() - started,
                    report or ReadReport(), aborted, pacer)


def _pump(events: Iterable[Event], producer: Sink, pacer: _Pacer | None, bar: tqdm,
          limit: _FailureLimit) -> None:
    n = 0
    for event in events:
        if pacer is not None:
            pacer.wait(event.created_at)
        producer.send(event)
        n += 1
        if n % _BAR_STEP == 0:
            bar.update(_BAR_STEP)
            limit.check()
    bar.update(n % _BAR_STEP)


class _FailureLimit:
    """Raises :class:`ProduceError` once too many deliveries of this replay failed."""

    def __init__(self, producer: Sink, before: ProducerStats, limit: int | None) -> None:
        self._producer, self._before, self._limit = producer, before.failed, limit

    def check(self) -> None:
        if self._limit is None:
            return
        stats = self._producer.stats
        if stats.failed - self._before > self._limit:
            msg = (f"more than {self._limit} deliveries failed, stopping "
                   f"(last: {stats.last_error})")
            raise ProduceError(msg)


class _Pacer:
    """Waits until an event's scheduled wall time: the first event anchors the clock."""

    def __init__(self, speedup: float, producer: Sink) -> None:
        self._speedup = speedup
        self._producer = producer
        self._origin: tuple[int, float] | None = None
        self.behind_s = 0.0

    def wait(self, created_at: int) -> None:
        if self._origin is None:
            self._origin = (created_at, time.monotonic())
            return
        first_ms, first_wall = self._origin
        due = first_wall + (created_at - first_ms) / 1000 / self._speedup
        delay = due - time.monotonic()
        self.behind_s = max(self.behind_s, -delay)
        while delay > 0.0005:
            # Polling doubles as sleeping: delivery callbacks are served meanwhile.
            self._producer.poll(min(delay, 0.1))
            delay = due - time.monotonic()


def _summary(before: ProducerStats, after: ProducerStats, remaining: int, duration: float,
             report: ReadReport, aborted: str | None, pacer: _Pacer | None) -> ReplaySummary:
    sent = {t: after.sent_by_topic.get(t, 0) - before.sent_by_topic.get(t, 0) for t in TOPICS}
    reasons = {reason: n - before.failures_by_reason.get(reason, 0)
               for reason, n in after.failures_by_reason.items()
               if n > before.failures_by_reason.get(reason, 0)}
    return ReplaySummary(sent, after.delivered - before.delivered,
                         after.failed - before.failed, remaining, duration,
                         report.invalid, dict(report.skipped), reasons, after.last_error,
                         aborted, pacer.behind_s if pacer is not None else None)
