"""Open-loop pacing: requests at a fixed arrival rate, timed from when they were due.

A closed-loop generator (Locust's usual model: each user waits for its answer, then
thinks, then asks again) slows down exactly when the server does, so the requests
that would have arrived during a stall are never sent and never measured —
coordinated omission. The open-loop model fixes the arrival times in advance: the
:class:`Schedule` gives request ``n`` its intended send time (``start + n/rate``, or
Poisson arrivals with the same mean), and a request is timed from that intended time,
not from when a free user got round to sending it (:func:`corrected`). A stall then
shows up as it would to real clients arriving at that rate: every request due during
it waits, and its latency grows with how long ago it was due (wrk2's model; see its
README on coordinated omission).

The users of one process share one schedule through a :class:`Pacer`: whichever user
is free takes the next intended time, sleeps until it (never sleeping when it is
late) and sends. Slots are never skipped, so a backlog is paid for in latency, not
hidden. With several processes each takes ``rate / processes``.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from loadgen.errors import WorkloadError

Clock = Callable[[], float]
Sleep = Callable[[float], None]


class Schedule:
    """Intended send times at ``rate`` per second from ``start`` (seconds)."""

    def __init__(self, rate: float, start: float, *, poisson: bool = False,
                 seed: int = 0) -> None:
        if not rate > 0:
            msg = f"an open-loop rate must be > 0 requests/s, got {rate}"
            raise WorkloadError(msg)
        self.rate, self.start, self.poisson = rate, start, poisson
        self.issued = 0
        self._rng = random.Random(seed)
        self._next = start

    def next(self) -> float:
        """The intended send time of the next request (non-decreasing)."""
        self.issued += 1
        if not self.poisson:
            # start + n/rate rather than summing gaps: no float drift over long runs.
            return self.start + (self.issued - 1) / self.rate
        due = self._next
        self._next += self._rng.expovariate(self.rate)
        return due

    def due_by(self, now: float) -> int:
        """How many requests should have been issued by ``now`` (constant schedule)."""
        return max(0, int((now - self.start) * self.rate) + 1)


class Pacer:
    """Shares a schedule between the users of a process; see the module docstring."""

    def __init__(self, schedule: Schedule, clock: Clock, sleep: Sleep) -> None:
        self.schedule, self.clock, self.sleep = schedule, clock, sleep
        self.late = 0

    def acquire(self) -> float:
        """Wait for the next slot and return its intended send time."""
        intended = self.schedule.next()
        delay = intended - self.clock()
        if delay > 0:
            self.sleep(delay)
        else:
            self.late += 1
        return intended


def corrected(intended: float, sent: float, service: float) -> float:
    """Latency from the intended send time: the wait to be sent plus the service time.

    ``intended`` and ``sent`` are on one clock (seconds); ``service`` is the measured
    time from send to answer. A request sent early (the sleep overshot the other
    way) counts from when it was sent.
    """
    return max(0.0, sent - intended) + service


def per_process_rate(total: float, processes: int) -> float:
    """Each of ``processes`` load processes' share of the total arrival rate."""
    return total / max(1, processes)
