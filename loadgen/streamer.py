"""One simulated client of the live home stream: connect, read, leave, resume.

A person with the app open holds one stream of their home (``GET
/v1/users/{id}/home/stream?limit=N``, DESIGN §7 *Live stream*) for a while, closes it
(the app goes to the background, the train enters a tunnel), and comes back: the
client reconnects with the ``Last-Event-ID`` of the last event it applied, and the
server sends what it missed. :class:`StreamClient` does that with the times drawn
from :class:`Habits`: each :meth:`StreamClient.session` is one connection held for
an exponentially distributed time (mean ``hold_s``), and :meth:`StreamClient.away`
the pause before the next (mean ``away_s``). A ``reset`` drops nothing the client
needs (it keeps only the last id); an ``end`` ends the session (``too_slow`` and
``shutdown`` say to reconnect, ``account_deleted`` that the reader is gone).

Every ``add`` of a tweet created since the run started is a receipt for the push
latency (:class:`loadgen.push.PushLog`), once per tweet per client: an entry removed
and added again, or sent again by a resume after a ``reset``, was delivered before.
The Locust user in ``locustfile.py`` drives it under gevent; nothing here knows
Locust, so the tests drive it on a plain thread against a real API.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

import orjson

from loadgen.push import PushLog, StreamTally
from loadgen.sse import Event, StreamConnection, StreamError

log = logging.getLogger(__name__)

STREAM: Final = "GET home stream"
#: Tweet ids a client remembers having received, at most (then it starts over).
MAX_SEEN: Final = 50_000


@dataclass(frozen=True)
class Habits:
    """How a client uses its stream: window size, how long it stays and stays away."""

    limit: int = 20
    hold_s: float = 60.0
    away_s: float = 2.0
    idle_timeout: float = 45.0
    connect_timeout: float = 10.0


@dataclass(frozen=True)
class Connect:
    """One connect, as a request to time: status (0: none), seconds to the answer's head."""

    status: int
    seconds: float
    resumed: bool
    error: str | None = None


class StreamClient:
    """``user``'s stream at ``base``; see the module docstring.

    ``since`` (epoch s): only tweets created from then on are push receipts.
    ``on_connect`` is told of every connect (the Locust user reports it as a request).
    """

    def __init__(self, base: str, user: int, headers: dict[str, str], habits: Habits,
                 rng: random.Random, push: PushLog, tally: StreamTally, since: float,
                 on_connect: Callable[[Connect], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.user, self.headers, self.habits, self.rng = user, headers, habits, rng
        self.push, self.tally, self.on_connect, self.clock = push, tally, on_connect, clock
        self.since_ms = since * 1000
        self.connection = StreamConnection(base, connect_timeout=habits.connect_timeout,
                                           idle_timeout=habits.idle_timeout)
        self.target = f"/v1/users/{user}/home/stream?{urlencode({'limit': habits.limit})}"
        self.last_id: str | None = None
        self.seen: set[int] = set()

    def session(self, stopping: Callable[[], bool] = lambda: False) -> str:
        """Connect (resuming from the last id), read until it is time to go; how it ended.

        ``left``: the client went (its hold time passed, or ``stopping()``); ``gone``:
        the reader's account is deleted (404, or ``end`` ``account_deleted``);
        ``ended``: the server sent ``end``; ``dropped``: it closed without one;
        ``error``: the connect or the connection failed.
        """
        resumed = self.last_id is not None
        began = time.perf_counter()
        try:
            status, body, first = self.connection.open(self.target, self.headers, self.last_id)
        except StreamError as exc:
            self._connected(Connect(0, time.perf_counter() - began, resumed, str(exc)))
            self.tally.failed()
            return "error"
        error = None if status in (200, 404) else f"HTTP {status}: {body[:200]!r}"
        self._connected(Connect(status, time.perf_counter() - began, resumed, error))
        if status != 200:
            self.tally.failed()
            return "gone" if status == 404 else "error"
        connected_at = self.clock()
        self.tally.opened(connected_at, resumed)
        how = self._read(first, connected_at, stopping)
        self.connection.close()
        self.tally.closed(self.clock(), how)
        return how

    def away(self) -> float:
        """Seconds to stay away before the next session."""
        return self.rng.expovariate(1 / self.habits.away_s) if self.habits.away_s > 0 else 0.0

    def close(self) -> None:
        self.connection.close()

    def _read(self, events: list[Event], connected_at: float,
              stopping: Callable[[], bool]) -> str:
        hold = self.rng.expovariate(1 / self.habits.hold_s) if self.habits.hold_s > 0 else 0.0
        until = connected_at + hold
        while True:
            for event in events:
                how = self._apply(event, connected_at)
                if how is not None:
                    return how
            now = self.clock()
            self.tally.alive(now)
            left = until - now
            if left <= 0 or stopping():
                return "left"
            try:
                got = self.connection.read(min(left, 1.0))
            except StreamError as exc:
                log.info("stream of user %d failed: %s", self.user, exc)
                return "error"
            if got is None:
                return "dropped"
            events = got

    def _apply(self, event: Event, connected_at: float) -> str | None:
        """Take one event in; how the session ends if it ends it."""
        now = self.clock()
        if event.kind == "end":
            reason = str(_data(event).get("reason", "unknown"))
            self.tally.event(now, "end", reason)
            return "gone" if reason == "account_deleted" else "ended"
        self.tally.event(now, event.kind)
        if event.id is not None:
            self.last_id = event.id
        if event.kind == "add":
            entry = _data(event).get("entry") or {}
            tweet_id, created = entry.get("tweet_id"), entry.get("created_at")
            if tweet_id is not None and created is not None and created >= self.since_ms:
                self._received(int(tweet_id), now, connected_at)
        return None

    def _received(self, tweet_id: int, now: float, connected_at: float) -> None:
        if tweet_id in self.seen:
            return
        if len(self.seen) >= MAX_SEEN:
            self.seen.clear()
        self.seen.add(tweet_id)
        self.push.receive(tweet_id, now, connected_at)

    def _connected(self, connect: Connect) -> None:
        if self.on_connect is not None:
            self.on_connect(connect)


def _data(event: Event) -> dict[str, Any]:
    try:
        data = orjson.loads(event.data)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}
