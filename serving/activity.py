"""Home-timeline reads, appended to the ``activity`` log (DESIGN §4b, inactive users).

Which users get fan-out writes is derived from this log by the view job: a user whose
newest read is older than ``FANOUT_INACTIVE_DAYS`` when an entry for them arrives goes
dormant, and their next read record regenerates their cache. So the read path only
has to say, now and then, that a user read: :class:`ActivityLog` appends at most one
record per user per ``every_s`` seconds and process (a dict lookup on the hot path),
from one background thread, so a read never waits for Kafka. A returning user's
first read is always appended: it comes after far more than ``every_s`` (which is
kept well below the inactive threshold) since the last record.
A monitor's read (``X-Fanout-Monitor``, the live verifier's) is not appended: a
monitor reading a timeline is not its user coming back (:data:`serving.callers.MONITOR_HEADER`).

A record that cannot be produced (the broker down) is counted in ``/metrics``
(``fanout_activity_records{outcome="failed"}``) and logged by the producer; the read
itself is unaffected and stays exact, and the user's cache is regenerated on a later
read.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from ingest.errors import IngestError
from ingest.events import Activity
from ingest.writer import SharedProducer

log = logging.getLogger(__name__)

_STOP = -1


class ActivityLog:
    """Appends ``Activity`` records for reads, rate-limited per user (module docstring)."""

    def __init__(self, writer: Callable[[], SharedProducer], every_s: float,
                 capacity: int = 1_000_000, clock: Callable[[], float] = time.time) -> None:
        self._writer, self.every_s, self._capacity, self._clock = writer, every_s, capacity, clock
        self._last: dict[int, float] = {}
        self._queue: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0

    def saw(self, user: int) -> None:
        """``user`` read their home timeline now: append a record unless one is recent."""
        now = self._clock()
        last = self._last.get(user)
        if last is not None and now - last < self.every_s:
            return
        if len(self._last) >= self._capacity:
            self._last.clear()  # forgetting only means one more record per user
        self._last[user] = now
        self._queue.put((user, int(now * 1000)))
        if self._thread is None:
            self._start()

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (bounded by ``timeout``) and stop the thread."""
        thread = self._thread
        if thread is not None:
            self._queue.put((_STOP, 0))
            thread.join(timeout)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="activity-log",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            user, read_at = self._queue.get()
            if user == _STOP:
                return
            try:
                self._writer().send_sync(Activity(user, read_at))
                self.sent += 1
            except IngestError:  # logged and counted by the producer too
                self.failed += 1
