"""Running a fan-out probe until it has enough, rather than for a fixed window."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

from loadgen.probe import FanoutProbe, ProbeResult

#: The longest a probe run waits for enough (seconds): it then stops, and the test's
#: assertions say what was missing.
WAIT_S = 30.0


def run_until(probe: FanoutProbe, enough: Callable[[ProbeResult], bool]) -> ProbeResult:
    """``probe.run`` stopped once ``enough`` says so (at most :data:`WAIT_S`), not after a
    fixed window: how many probes fit in one depends on how busy the machine is."""
    stop = threading.Event()

    def watch() -> None:
        began = time.monotonic()
        while not enough(probe.result) and time.monotonic() - began < WAIT_S:
            time.sleep(0.01)
        stop.set()

    watcher = threading.Thread(target=watch, name="probe-watch")
    watcher.start()
    try:
        return probe.run(stop, until=time.time() + 2 * WAIT_S)
    finally:
        stop.set()
        watcher.join()


def steps(start: float = 1000.0, step: float = 0.01) -> Callable[[], float]:
    """A probe's clock that moves ``step`` seconds each time it is read: a deadline then
    counts the probe's own reads and polls, not the wall clock of a box that may stall."""
    return itertools.count(start, step).__next__
