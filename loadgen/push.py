"""Push latency and stream figures of a load run, mergeable across Locust processes.

**Push latency** is the time from a write accepted by the API — the ``202`` a load
user's ``POST /v1/tweets`` (a post or a reply) got back, timed when the answer
arrived — to the ``add`` event carrying that tweet at a follower holding a live
stream (DESIGN §7, *Live stream*). The two ends are usually seen by different
processes (a Locust master's workers, ``--processes``), so neither can compute it
alone. :class:`PushLog` keeps both sides as raw facts and joins them where they
meet:

- the writer's process records ``accept(tweet id, accepted at, writer)``;
- a stream user's process records ``receive(tweet id, received at, connected at)``
  for the first ``add`` of a tweet on its stream (the same tweet added again after a
  removal is not a second delivery), for tweets created since the run started;
- both travel to the master with each worker's regular report (:meth:`drain` →
  :meth:`merge`), and the master — or the one local process — matches each receipt to
  the accept of the same tweet id (:meth:`join`). Tweet ids are snowflakes unique
  across the API's processes, so the id is the key; the times are each process's
  ``time.time()``: exact for processes on one machine, off by the clock offset
  between machines otherwise.

A receipt whose tweet was accepted *before* its stream connected is not a push but
the catch-up a (re)connect sends (the page, or the diff since ``Last-Event-ID``): it
is counted as ``caught_up``, not timed. A receipt no load user's accept matches (a
probe's post, a tweet accepted before the measured part) stays ``unmatched``. The
samples keep the writer, so the report splits them into normal and celebrity authors
with the celebrity set it knows (:func:`classify`) — the celebrity of a tweet is its
author at the time it was read, which for a run is the store's celebrity table.

**Stream figures.** :class:`StreamTally` counts what the stream users saw: connects
(fresh and resumed with ``Last-Event-ID``), events by type, heartbeats, resets,
streams the server ended (``end``, by reason: ``too_slow`` is a cut-off client) or
dropped without an ``end`` (a send timeout closes the socket), failed connects, and
per interval the events and the streams open (the most open at once in each process,
summed over processes).
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from hdrh.histogram import HdrHistogram

from loadgen.recording import histogram, micros

#: Receipts kept waiting for their accept, at most; past it the oldest are unmatched.
MAX_PENDING: Final = 200_000
#: Matched samples kept for the report, at most (past it, counted in ``dropped``).
MAX_SAMPLES: Final = 500_000
CLASSES: Final = ("normal", "celebrity")


@dataclass
class PushLog:
    """Accepts and receipts of one process; joined in the master (module docstring)."""

    measure_from: float = 0.0
    accepted: dict[int, tuple[float, int]] = field(default_factory=dict)
    pending: list[tuple[int, float, float]] = field(default_factory=list)
    #: (writer, accepted at, push latency in s), one per matched receipt.
    samples: list[tuple[int, float, float]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    _out_accepts: list[tuple[int, float, int]] = field(default_factory=list)
    _out_receipts: list[tuple[int, float, float]] = field(default_factory=list)

    def accept(self, tweet_id: int, at: float, writer: int) -> None:
        """A load user's post or reply was answered 202 at ``at`` (epoch s)."""
        self._out_accepts.append((tweet_id, at, writer))

    def receive(self, tweet_id: int, at: float, connected_at: float) -> None:
        """A stream connected at ``connected_at`` got the tweet's first ``add`` at ``at``."""
        self._out_receipts.append((tweet_id, at, connected_at))

    def drain(self) -> dict[str, Any]:
        """What this process saw since the last drain, as plain lists; then forget it."""
        out = {"accepted": self._out_accepts, "received": self._out_receipts}
        self._out_accepts, self._out_receipts = [], []
        return out

    def merge(self, data: Mapping[str, Any]) -> None:
        """Add a :meth:`drain` payload (a worker's, or this process's own)."""
        for tweet_id, at, writer in data.get("accepted", ()):
            self.accepted[int(tweet_id)] = (float(at), int(writer))
        self.pending.extend((int(t), float(a), float(c)) for t, a, c in data.get("received", ()))
        if len(self.pending) > MAX_PENDING:
            self.counts["unmatched_dropped"] += len(self.pending) - MAX_PENDING
            del self.pending[:len(self.pending) - MAX_PENDING]

    def join(self) -> None:
        """Fold in this process's own lists and time every receipt whose accept is known."""
        self.merge(self.drain())
        waiting = []
        for tweet_id, received_at, connected_at in self.pending:
            known = self.accepted.get(tweet_id)
            if known is None:
                waiting.append((tweet_id, received_at, connected_at))
                continue
            accepted_at, writer = known
            if accepted_at < self.measure_from:
                self.counts["warmup"] += 1
            elif accepted_at < connected_at:
                self.counts["caught_up"] += 1
            elif len(self.samples) >= MAX_SAMPLES:
                self.counts["dropped"] += 1
            else:
                self.counts["negative"] += received_at < accepted_at
                self.samples.append((writer, accepted_at, max(received_at - accepted_at, 0.0)))
        self.pending = waiting

    def to_dict(self) -> dict[str, Any]:
        """Everything joined so far, for ``hdr.json`` (after :meth:`join`)."""
        measured = sum(1 for at, _ in self.accepted.values() if at >= self.measure_from)
        return {"samples": [list(s) for s in self.samples], "accepted": measured,
                "unmatched": len(self.pending), **dict(self.counts)}


def classify(samples: Iterable[Iterable[Any]], celebrities: set[int]
             ) -> dict[str, HdrHistogram]:
    """Push latencies (µs histograms) by the writer's class: ``normal``, ``celebrity``."""
    hists = {k: histogram() for k in CLASSES}
    for writer, _, latency in samples:
        hists["celebrity" if int(writer) in celebrities else "normal"].record_value(
            micros(float(latency)))
    return hists


@dataclass
class StreamTally:
    """What this process's stream users saw; see the module docstring.

    ``process`` names this process (host and pid), so that the master keeps each
    process's most-open count per interval once, however its reports cut the interval.
    """

    interval: float = 1.0
    process: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    counts: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    ended: Counter[str] = field(default_factory=Counter)
    open: int = 0
    #: Per interval slot: events received (not heartbeats).
    slot_events: Counter[int] = field(default_factory=Counter)
    #: Per interval slot, per process: the most streams open at once.
    slot_open: dict[int, dict[str, int]] = field(default_factory=dict)

    def opened(self, now: float, resumed: bool) -> None:
        self.counts["connects"] += 1
        self.counts["resumes" if resumed else "fresh"] += 1
        self.open += 1
        self.alive(now)

    def closed(self, now: float, how: str) -> None:
        """A stream this process held ended ``how`` (:meth:`StreamClient.session`'s words)."""
        self.alive(now)
        self.open -= 1
        self.counts[how] += 1

    def event(self, now: float, kind: str, reason: str | None = None) -> None:
        self.events[kind] += 1
        if kind == "end" and reason is not None:
            self.ended[reason] += 1
        if kind != "comment":
            self.slot_events[int(now // self.interval)] += 1
        self.alive(now)

    def failed(self) -> None:
        """A connect that was not answered 200 (or not at all)."""
        self.counts["failed_connects"] += 1

    def alive(self, now: float) -> None:
        """Note the streams open now (a client calls it at least once a second)."""
        here = self.slot_open.setdefault(int(now // self.interval), {})
        here[self.process] = max(here.get(self.process, 0), self.open)

    def drain(self) -> dict[str, Any]:
        """Counts and timeline since the last drain (the open count stays); then reset."""
        out = self.to_dict()
        self.counts, self.events, self.ended = Counter(), Counter(), Counter()
        self.slot_events, self.slot_open = Counter(), {}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"interval": self.interval, "counts": dict(self.counts),
                "events": dict(self.events), "ended": dict(self.ended),
                "slot_events": {str(k): v for k, v in self.slot_events.items()},
                "slot_open": {str(k): v for k, v in self.slot_open.items()}}

    def merge(self, data: Mapping[str, Any]) -> None:
        """Add a :meth:`drain` payload (another process's, or a file's)."""
        self.counts.update(data.get("counts", {}))
        self.events.update(data.get("events", {}))
        self.ended.update(data.get("ended", {}))
        for key, n in data.get("slot_events", {}).items():
            self.slot_events[int(key)] += n
        for key, by_process in data.get("slot_open", {}).items():
            here = self.slot_open.setdefault(int(key), {})
            for process, n in by_process.items():
                here[process] = max(here.get(process, 0), n)

    def open_series(self) -> list[tuple[float, int]]:
        """(interval start, streams open at most) per interval, summed over processes."""
        return [(slot * self.interval, sum(self.slot_open[slot].values()))
                for slot in sorted(self.slot_open)]

    def event_series(self) -> list[tuple[float, float]]:
        """(interval start, events/s) per interval."""
        return [(slot * self.interval, n / self.interval)
                for slot, n in sorted(self.slot_events.items())]
