"""Time-ordered 64-bit tweet ids for writes that arrive over HTTP (Twitter's snowflake).

Layout, most significant first: 41 bits of milliseconds since :data:`EPOCH_MS`
(good until 2089), 10 bits of worker id, 12 bits of sequence within the
millisecond. The sign bit stays 0, so every id is a positive 64-bit integer
(DESIGN §3), and ids from one worker sort like their creation times. Two API
processes must have different worker ids or their ids may collide: pass one
explicitly when more than one process writes.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from typing import Final

EPOCH_MS: Final = 1_577_836_800_000  # 2020-01-01T00:00:00Z
WORKER_BITS: Final = 10
SEQUENCE_BITS: Final = 12
MAX_WORKER: Final = (1 << WORKER_BITS) - 1
_MAX_SEQUENCE: Final = (1 << SEQUENCE_BITS) - 1


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


class Snowflake:
    """Thread-safe id source; ``worker`` defaults to a random one per instance."""

    def __init__(self, worker: int | None = None, clock: Callable[[], int] = now_ms) -> None:
        self.worker = secrets.randbelow(MAX_WORKER + 1) if worker is None else worker
        if not 0 <= self.worker <= MAX_WORKER:
            msg = f"worker id must be in [0, {MAX_WORKER}], got {self.worker}"
            raise ValueError(msg)
        self._clock = clock
        self._lock = threading.Lock()
        self._last_ms = 0
        self._sequence = 0

    def next(self) -> tuple[int, int]:
        """A fresh id and the millisecond it encodes (use it as the event's created_at).

        The millisecond never goes backwards: a clock step back reuses the last one,
        and a full sequence borrows the next millisecond instead of sleeping.
        """
        with self._lock:
            ms = max(self._clock(), self._last_ms)
            if ms == self._last_ms:
                self._sequence = (self._sequence + 1) & _MAX_SEQUENCE
                if self._sequence == 0:
                    ms += 1
            else:
                self._sequence = 0
            self._last_ms = ms
            sequence = self._sequence
        if ms <= EPOCH_MS:
            msg = f"clock reads {ms} ms, before the id epoch {EPOCH_MS}"
            raise ValueError(msg)
        return ((ms - EPOCH_MS) << (WORKER_BITS + SEQUENCE_BITS)
                | self.worker << SEQUENCE_BITS | sequence), ms
