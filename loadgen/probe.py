"""Fan-out latency: post as an author, time until a follower's home timeline shows it.

The :class:`FanoutProbe` posts a tweet as a sampled author (``POST /v1/tweets``),
then reads one of the author's followers' home timelines with ``?after=TOKEN`` —
the API holds that read (bounded) until the view has applied the write — and polls
on, with a short pause, until the tweet is there or the deadline passes. The time
from just before the post to the answer that first shows the tweet is the fan-out
latency as a user sees it: produce, the view job's micro-batch, the sink's commit
and the read. Normal and celebrity authors are measured separately: a celebrity's
tweet is not fanned out but stored once and merged in at read time, so the two paths
have different costs.

Probes start at a fixed pace on a small thread pool, so one slow probe does not
delay the next (the probe is open-loop too); a probe that would exceed the pool's
backlog is skipped and counted. Latencies go into HdrHistograms; tweets never seen
before the deadline are counted as timeouts, not folded into the percentiles.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
from hdrh.histogram import HdrHistogram

from loadgen.errors import ProbeError
from loadgen.recording import histogram, micros

log = logging.getLogger(__name__)

CLASSES: Final = ("normal", "celebrity")


@dataclass(frozen=True)
class Target:
    """An author to post as, one of their followers to watch, and their tokens (auth on)."""

    author: int
    follower: int
    celebrity: bool
    followers: int = 0
    author_token: str | None = None
    follower_token: str | None = None

    @property
    def kind(self) -> str:
        return "celebrity" if self.celebrity else "normal"


@dataclass(frozen=True)
class Sample:
    """One probe: when it posted (epoch s), how long until visible (None: timed out)."""

    kind: str
    author: int
    followers: int
    posted_at: float
    post_seconds: float
    lag: float | None


@dataclass
class ProbeResult:
    """Every sample, plus histograms of the lags and the counts that stayed out of them."""

    samples: list[Sample] = field(default_factory=list)
    hists: dict[str, HdrHistogram] = field(
        default_factory=lambda: {k: histogram() for k in CLASSES})
    timeouts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    skipped: int = 0

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        if sample.lag is None:
            self.timeouts[sample.kind] += 1
        else:
            self.hists[sample.kind].record_value(micros(sample.lag))


@dataclass(frozen=True)
class ProbeSettings:
    """Pace and bounds: a probe every ``interval`` s, each given up after ``deadline`` s.

    A check reads up to ``max_pages`` pages of ``page`` entries of the follower's
    timeline; between checks it pauses ``poll`` s.
    """

    interval: float = 1.0
    deadline: float = 30.0
    poll: float = 0.05
    concurrency: int = 4
    page: int = 50
    max_pages: int = 10


class FanoutProbe:
    """Posts as sampled authors and times fan-out; see the module docstring."""

    def __init__(self, client: httpx.Client, targets: Sequence[Target],
                 settings: ProbeSettings | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if not targets:
            msg = "the fan-out probe needs at least one author with a follower"
            raise ProbeError(msg)
        self.client, self.settings, self.clock = client, settings or ProbeSettings(), clock
        self.targets = list(targets)
        self._next = _alternate(self.targets)
        self.result = ProbeResult()
        self._lock = threading.Lock()

    def run(self, stop: threading.Event, until: float) -> ProbeResult:
        """Probe every ``interval`` s until ``stop`` is set or ``until`` (epoch s)."""
        s = self.settings
        pending: list[Future[None]] = []
        with ThreadPoolExecutor(s.concurrency, thread_name_prefix="fanout-probe") as pool:
            while not stop.is_set() and self.clock() < until:
                target = next(self._next)
                pending = [f for f in pending if not f.done()]
                if len(pending) >= 2 * s.concurrency:
                    self.result.skipped += 1
                else:
                    pending.append(pool.submit(self._measure, target))
                stop.wait(s.interval)
            wait(pending, timeout=s.deadline + 30)  # each probe is bounded by its deadline
        return self.result

    def _measure(self, target: Target) -> None:
        try:
            sample = self.measure(target)
        except (httpx.HTTPError, ProbeError, ValueError, KeyError) as exc:
            log.warning("fan-out probe of author %d failed: %s", target.author, exc)
            with self._lock:
                self.result.errors[target.kind] += 1
            return
        with self._lock:
            self.result.add(sample)

    def measure(self, target: Target) -> Sample:
        """Post once as ``target.author``; poll the follower's timeline until it shows."""
        posted_at = self.clock()
        answer = self.client.post("/v1/tweets", json={"text": f"fan-out probe {posted_at:.6f}"},
                                  headers=_auth(target.author, target.author_token))
        if answer.status_code != 202:
            msg = f"POST /v1/tweets answered {answer.status_code}: {answer.text[:200]}"
            raise ProbeError(msg)
        post_seconds = self.clock() - posted_at
        body = answer.json()
        lag = self._await(target, str(body["tweet_id"]), body.get("token"), posted_at)
        return Sample(target.kind, target.author, target.followers, posted_at, post_seconds, lag)

    def _await(self, target: Target, tweet_id: str, token: str | None,
               posted_at: float) -> float | None:
        s = self.settings
        while (left := posted_at + s.deadline - self.clock()) > 0:
            if self._visible(target, tweet_id, token, left):
                return self.clock() - posted_at
            time.sleep(min(s.poll, max(0.0, posted_at + s.deadline - self.clock())))
        return None

    def _visible(self, target: Target, tweet_id: str, token: str | None, left: float) -> bool:
        """Whether the follower's timeline shows the tweet, paging down to where it belongs.

        Newer tweets of other followees may already sit above it when it first shows
        (they came in the same micro-batch), so one page is not enough: read on while
        the page ends with tweets newer than it (ids are time-ordered).
        """
        path = f"/v1/users/{target.follower}/home"
        headers = _auth(target.follower, target.follower_token)
        params: dict[str, Any] = {"limit": self.settings.page} | ({"after": token} if token else {})
        for _ in range(self.settings.max_pages):
            answer = self.client.get(path, params=params, headers=headers, timeout=left + 1)
            if answer.status_code != 200:
                msg = f"GET {path} answered {answer.status_code}: {answer.text[:200]}"
                raise ProbeError(msg)
            body = answer.json()
            entries = body.get("entries") or []
            if any(e.get("tweet_id") == tweet_id for e in entries):
                return True
            cursor = body.get("next_cursor")
            if not entries or cursor is None or int(entries[-1]["tweet_id"]) < int(tweet_id):
                return False
            params = {"limit": self.settings.page, "cursor": cursor}
        return False


def _auth(user: int, token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {"X-User-Id": str(user)}


def _alternate(targets: Sequence[Target]) -> Iterator[Target]:
    """Endlessly: a normal target, a celebrity one, ... (each class cycled on its own)."""
    groups = [itertools.cycle(g) for k in CLASSES if (g := [t for t in targets if t.kind == k])]
    while True:
        for group in groups:
            yield next(group)
