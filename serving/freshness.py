"""Read-your-writes on demand: a read with ``?after=TOKEN`` waits for the view.

A write's consistency token names the changelog record it produced (logical topic,
partition, offset; :mod:`ingest.consistency`). The store keeps the highest applied
offset per (logical topic, partition), so the read polls
:meth:`~views.stores.contract.TimelineReader.applied_offsets` until the token's offset is
applied or ``timeout`` passes, and then reads; the answer says which happened
(``consistent``). The wait runs on a worker thread (sync endpoints), never on the
event loop, and at most ``max_waiters`` reads wait at once: the rest answer at once
with ``consistent: false`` rather than let forged tokens use up the thread pool.
"""

from __future__ import annotations

import threading
import time
from typing import Final

from ingest.consistency import Applied, decode_token
from ingest.errors import InvalidToken
from serving.errors import BadRequest
from views.stores.contract import TimelineReader

_FIRST_POLL: Final = 0.005
_MAX_POLL: Final = 0.05


class Freshness:
    """Bounded waits for tokens to be applied; shared by the requests of one app."""

    def __init__(self, timeout: float, max_waiters: int) -> None:
        self.timeout = timeout
        self._slots = threading.BoundedSemaphore(max_waiters) if max_waiters > 0 else None

    def wait(self, store: TimelineReader, token: str) -> bool:
        """Whether the view has applied ``token``'s write, waiting up to ``timeout``."""
        position = parse_token(token)
        if applied(store, position):
            return True
        if self._slots is None or not self._slots.acquire(blocking=False):
            return False
        try:
            return self._poll(store, position)
        finally:
            self._slots.release()

    def _poll(self, store: TimelineReader, position: Applied) -> bool:
        deadline = time.monotonic() + self.timeout
        pause = _FIRST_POLL
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(pause, left))
            if applied(store, position):
                return True
            pause = min(pause * 2, _MAX_POLL)
        return False


def parse_token(token: str) -> Applied:
    """The position of an ``after`` token, or a 400 naming the parameter."""
    try:
        return decode_token(token)
    except InvalidToken as exc:
        raise BadRequest(str(exc), field="after") from None


def applied(store: TimelineReader, position: Applied) -> bool:
    """Whether the store has applied the record at ``position``."""
    done = store.applied_offsets().get((position.topic, position.partition), -1)
    return done >= position.offset
