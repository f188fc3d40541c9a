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

A third class times a repost the same way (DESIGN §4b): another probe author posts a
tweet, and a normal author reposts it (``POST /v1/tweets/{id}/reposts``); the time
from just before the repost to the follower's page that shows the repost's entry is
the repost's fan-out latency. The original is read back first by its own author
with ``?after=`` (``GET /v1/users/{id}/tweets``): the read-your-writes check. Its
first answer must show the tweet, since the API held it until the view had applied
the post; a miss is counted (and the probe reads on until the tweet shows, as the
repost needs a tweet the views know).

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

CLASSES: Final = ("normal", "celebrity", "repost")


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
    """Every sample, plus histograms of the lags and the counts that stayed out of them.

    ``own``: how long each read-your-writes read took (the API holds it until the view
    applied the write); ``own_misses``: those whose answer did not show the write.
    """

    samples: list[Sample] = field(default_factory=list)
    hists: dict[str, HdrHistogram] = field(
        default_factory=lambda: {k: histogram() for k in CLASSES})
    timeouts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    skipped: int = 0
    own: HdrHistogram = field(default_factory=histogram)
    own_misses: int = 0

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        if sample.lag is None:
            self.timeouts[sample.kind] += 1
        else:
            self.hists[sample.kind].record_value(micros(sample.lag))

    def add_own(self, seconds: float, shown: bool) -> None:
        """One read-your-writes read: how long it took, whether it showed the write."""
        self.own.record_value(micros(seconds))
        self.own_misses += not shown


@dataclass(frozen=True)
class ProbeSettings:
    """Pace and bounds: a probe every ``interval`` s, each given up after ``deadline`` s.

    A check reads up to ``max_pages`` pages of ``page`` entries of the follower's
    timeline; between checks it pauses ``poll`` s. ``reposts``: whether the repost
    class (and its read-your-writes check) takes its turn.
    """

    interval: float = 1.0
    deadline: float = 30.0
    poll: float = 0.05
    concurrency: int = 4
    page: int = 50
    max_pages: int = 10
    reposts: bool = True


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
        self._next = _rounds(self.targets, self.settings.reposts)
        self._turn = itertools.count()
        self.result = ProbeResult()
        self._lock = threading.Lock()

    def run(self, stop: threading.Event, until: float) -> ProbeResult:
        """Probe every ``interval`` s until ``stop`` is set or ``until`` (epoch s)."""
        s = self.settings
        pending: list[Future[None]] = []
        with ThreadPoolExecutor(s.concurrency, thread_name_prefix="fanout-probe") as pool:
            while not stop.is_set() and self.clock() < until:
                kind, target = next(self._next)
                pending = [f for f in pending if not f.done()]
                if len(pending) >= 2 * s.concurrency:
                    self.result.skipped += 1
                else:
                    pending.append(pool.submit(self._measure, kind, target))
                stop.wait(s.interval)
            wait(pending, timeout=s.deadline + 30)  # each probe is bounded by its deadline
        return self.result

    def _measure(self, kind: str, target: Target) -> None:
        try:
            sample = self.measure_repost(target) if kind == "repost" else self.measure(target)
        except (httpx.HTTPError, ProbeError, ValueError, KeyError) as exc:
            log.warning("%s probe of author %d failed: %s", kind, target.author, exc)
            with self._lock:
                self.result.errors[kind] += 1
            return
        with self._lock:
            self.result.add(sample)

    def measure(self, target: Target) -> Sample:
        """Post once as ``target.author``; poll the follower's timeline until it shows."""
        posted_at = self.clock()
        answer = self.client.post("/v1/tweets", json={"text": f"fan-out probe {posted_at:.6f}"},
                                  headers=_auth(target.author, target.author_token))
        _accepted(answer, "POST /v1/tweets")
        post_seconds = self.clock() - posted_at
        body = answer.json()
        lag = self._await(target, str(body["tweet_id"]), body.get("token"), posted_at)
        return Sample(target.kind, target.author, target.followers, posted_at, post_seconds, lag)

    def measure_repost(self, target: Target) -> Sample:
        """Repost, as ``target.author``, a tweet another probe author has just posted.

        Polls the follower's timeline until the repost's entry shows; the original is
        read back by its author first (the read-your-writes check).
        """
        original = self._posted_and_read(self._source(target))
        posted_at = self.clock()
        answer = self.client.post(f"/v1/tweets/{original}/reposts",
                                  headers=_auth(target.author, target.author_token))
        _accepted(answer, f"POST /v1/tweets/{original}/reposts")
        post_seconds = self.clock() - posted_at
        body = answer.json()
        lag = self._await(target, str(body["repost_id"]), body.get("token"), posted_at)
        return Sample("repost", target.author, target.followers, posted_at, post_seconds, lag)

    def _source(self, target: Target) -> Target:
        """The next probe author who may be reposted to the target's follower."""
        sources = _sources(self.targets, target)
        if not sources:
            msg = f"no other probe author to repost as {target.author}"
            raise ProbeError(msg)
        return sources[next(self._turn) % len(sources)]

    def _posted_and_read(self, source: Target) -> str:
        """Post as ``source.author`` and read it back: the read-your-writes check."""
        answer = self.client.post("/v1/tweets", headers=_auth(source.author, source.author_token),
                                  json={"text": f"repost probe original {self.clock():.6f}"})
        _accepted(answer, "POST /v1/tweets")
        body = answer.json()
        tweet_id, started = str(body["tweet_id"]), self.clock()
        shown = self._own_page_shows(source, tweet_id, body.get("token"))
        with self._lock:
            self.result.add_own(self.clock() - started, shown)
        deadline = started + self.settings.deadline
        while not shown and self.clock() < deadline:
            time.sleep(self.settings.poll)
            shown = self._own_page_shows(source, tweet_id, None)
        if not shown:
            msg = f"tweet {tweet_id} never showed on its author's page"
            raise ProbeError(msg)
        return tweet_id

    def _own_page_shows(self, source: Target, tweet_id: str, token: str | None) -> bool:
        """Whether the author's own page shows the tweet (read with ``?after=token``)."""
        path = f"/v1/users/{source.author}/tweets"
        params: dict[str, Any] = {"limit": self.settings.page} | ({"after": token} if token else {})
        answer = self.client.get(path, params=params, timeout=self.settings.deadline + 1,
                                 headers=_auth(source.author, source.author_token))
        if answer.status_code != 200:
            msg = f"GET {path} answered {answer.status_code}: {answer.text[:200]}"
            raise ProbeError(msg)
        return any(e.get("tweet_id") == tweet_id for e in answer.json().get("entries") or [])

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


def _accepted(answer: httpx.Response, what: str) -> None:
    if answer.status_code != 202:
        msg = f"{what} answered {answer.status_code}: {answer.text[:200]}"
        raise ProbeError(msg)


def _sources(targets: Sequence[Target], target: Target) -> list[Target]:
    """Probe authors whose tweet ``target.author`` may repost to ``target.follower``.

    Neither the reposter nor the follower: a repost of one's own tweet, or of the
    follower's, is not shown to the follower (DESIGN §4b).
    """
    return [t for t in targets if t.author not in (target.author, target.follower)]


def _rounds(targets: Sequence[Target], reposts: bool) -> Iterator[tuple[str, Target]]:
    """Endlessly: (class, target) — normal, celebrity, repost, ... (each cycled on its own).

    Reposts are made by normal authors with another probe author to repost; a class
    with no target is left out.
    """
    groups = {k: [t for t in targets if t.kind == k] for k in CLASSES[:2]}
    if reposts:
        groups["repost"] = [t for t in groups["normal"] if _sources(targets, t)]
    cycles = [(k, itertools.cycle(g)) for k, g in groups.items() if g]
    while True:
        for kind, group in cycles:
            yield kind, next(group)
