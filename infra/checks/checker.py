"""A Jepsen-style history checker: what the API acknowledged, against the log and views.

While a fault plays out, :class:`Workload` posts tweets through the HTTP API from a
few writer threads and reads home timelines from a few reader threads, recording
every operation — when it was sent, how long it took, what came back (the status,
and for a 202 the consistency token and the tweet id) — in a :class:`History`. Each
tweet's text carries the history's marker and the write's number, so the records
of this history are found in the ``tweets`` topic by their text alone, whoever else
writes to the cluster meanwhile.

:func:`check` then reads the topic from where it ended when the history began (so a
real cluster's older records are never scanned) and counts, per history:

* **lost** — answered 202, but no record of it in the log (or none where its token
  points), or not in the store's tweets once the view has caught up;
* **duplicated** — one write found in the log more than once;
* **phantom** — a record carrying the marker that no writer ever sent;
* **indeterminate** — sent, not answered 202 (a 503, a timeout), yet in the log:
  allowed (the broker may have taken a write whose answer was lost), and counted.

It also reports the windows in which writes were refused (from the first refusal to
the next 202) and, for any time window, the reads' error rate and latency
percentiles.

**Live streams** (DESIGN §7). :class:`StreamHolder` threads hold
``GET …/home/stream`` for some users while the history plays out, the way a client
does: each folds the events into the page it holds (apply, keep the newest
``limit``), drops the connection at random and resumes with ``Last-Event-ID``, and
reconnects after an ``end`` or an error. It counts **duplicated** events (an add of an
entry it holds) and **phantom** ones (a remove of one it does not hold); at the end
:func:`check_streams` waits (bounded) for each one's page to equal the first page
``GET /home`` serves, and counts what is still **missed** (on ``/home``, not held) and
**phantom** (held, not on ``/home``). It needs nothing of the stack that started the services, only the
API's URL, the broker and the store: it runs against a real cluster as it does
against ``fanout up --nodes 3`` (``python -m infra.checks.checker --help``).
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import orjson

from infra import webclient
from serving.callers import USER_HEADER

log = logging.getLogger(__name__)

#: How long one HTTP request may take before it counts as failed (seconds).
REQUEST_TIMEOUT_S: Final = 15.0


@dataclass(frozen=True)
class Op:
    """One operation of the history: a write (``n`` >= 0) or a read (``n`` = -1)."""

    n: int
    user: int
    began: float  # wall clock, seconds
    took: float
    status: int  # HTTP status; 0 when no answer came (refused, reset, timed out)
    token: str = ""
    tweet_id: int = 0

    @property
    def ended(self) -> float:
        return self.began + self.took


@dataclass
class History:
    """Everything the workload did, and where the tweets topic ended when it began."""

    marker: str = field(default_factory=lambda: f"chk{uuid.uuid4().hex[:10]}")
    writes: list[Op] = field(default_factory=list)
    reads: list[Op] = field(default_factory=list)
    start_offsets: dict[int, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _next: int = 0

    def number(self) -> int:
        with self._lock:
            self._next += 1
            return self._next - 1

    def record(self, op: Op) -> None:
        with self._lock:
            (self.writes if op.n >= 0 else self.reads).append(op)

    def text(self, n: int) -> str:
        return f"{self.marker}:{n}"

    def parse(self, text: str) -> int | None:
        """The write number of a tweet's text if it is one of this history's, else None."""
        head, _, number = text.partition(":")
        return int(number) if head == self.marker and number.isdigit() else None


@dataclass(frozen=True)
class ReadStats:
    """Reads begun in a window: how many, the share that failed, latency percentiles."""

    count: int
    errors: int
    p50_ms: float
    p99_ms: float

    @property
    def error_rate(self) -> float:
        return self.errors / self.count if self.count else 0.0

    def render(self) -> str:
        return (f"{self.count} reads, {self.error_rate:.1%} errors, p50 {self.p50_ms:.0f} ms, "
                f"p99 {self.p99_ms:.0f} ms")


@dataclass(frozen=True)
class Report:
    """What :func:`check` found; ``ok`` when nothing acknowledged is lost or doubled."""

    attempted: int
    acknowledged: int
    lost: list[int]
    duplicated: list[int]
    phantom: list[int]
    indeterminate: list[int]
    not_in_views: list[int]
    refusals: list[tuple[float, float, int]]  # (from, to, writes refused) per window
    #: Each duplicated write, said whole: its answer, when it was sent, where it landed.
    doubled: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.phantom or self.not_in_views)

    def longest_refusal(self) -> float:
        return max((end - begin for begin, end, _ in self.refusals), default=0.0)

    def render(self) -> str:
        windows = "; ".join(f"{end - begin:.1f}s ({count} refused)"
                            for begin, end, count in self.refusals) or "none"
        return (f"{self.attempted} writes, {self.acknowledged} answered 202: lost "
                f"{len(self.lost)}, duplicated {len(self.duplicated)}, phantom "
                f"{len(self.phantom)}, not in the views {len(self.not_in_views)}, "
                f"indeterminate (not 202, yet in the log) {len(self.indeterminate)}; "
                f"windows of refused writes: {windows}"
                + "".join(f"\n  duplicated: {line}" for line in self.doubled))


def caller_headers(user: int, token: str | None) -> dict[str, str]:
    """The headers of a request made as ``user``: its bearer token, else (auth off) the caller's id."""
    return {"Authorization": f"Bearer {token}"} if token else {USER_HEADER: str(user)}


class Workload:
    """Writer and reader threads on the API, recording into a :class:`History`.

    ``users`` are the accounts that post and read; ``token_of(user)`` gives the
    bearer token of one (None: the API runs without auth). ``write_every`` and
    ``read_every`` are each thread's pause between operations (seconds).
    """

    def __init__(self, api_url: str, users: list[int], history: History,
                 token_of: Callable[[int], str | None], *, writers: int = 2, readers: int = 2,
                 write_every: float = 0.05, read_every: float = 0.05, seed: int = 0) -> None:
        self.api_url, self.users, self.history = api_url.rstrip("/"), users, history
        self.token_of = token_of
        self.writers, self.readers = writers, readers
        self.write_every, self.read_every = write_every, read_every
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Workload:
        loops = [self._write_loop] * self.writers + [self._read_loop] * self.readers
        self._threads = [threading.Thread(target=loop, args=(self._rng.random(),), daemon=True,
                                          name=f"checker-{i}") for i, loop in enumerate(loops)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> History:
        self._stop.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT_S + 5)
        return self.history

    def __enter__(self) -> Workload:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _headers(self, user: int) -> dict[str, str]:
        """The user's bearer token; with auth off (no token), the header naming the caller."""
        return caller_headers(user, self.token_of(user))

    def _write_loop(self, seed: float) -> None:
        rng = random.Random(seed)
        with webclient.client(base_url=self.api_url, timeout=REQUEST_TIMEOUT_S) as client:
            while not self._stop.is_set():
                user, n = rng.choice(self.users), self.history.number()
                began, clock = time.time(), time.monotonic()
                status, token, tweet = 0, "", 0
                try:
                    response = client.post("/v1/tweets", json={"text": self.history.text(n)},
                                           headers=self._headers(user))
                    status = response.status_code
                    if status == 202:
                        body = response.json()
                        token, tweet = str(body["token"]), int(body["tweet_id"])
                except httpx.HTTPError as exc:
                    log.debug("write %d: no answer: %s", n, exc)
                self.history.record(Op(n, user, began, time.monotonic() - clock, status,
                                       token, tweet))
                self._stop.wait(self.write_every)

    def _read_loop(self, seed: float) -> None:
        rng = random.Random(seed)
        with webclient.client(base_url=self.api_url, timeout=REQUEST_TIMEOUT_S) as client:
            while not self._stop.is_set():
                user = rng.choice(self.users)
                began, clock = time.time(), time.monotonic()
                try:
                    status = client.get(f"/v1/users/{user}/home",
                                        headers=self._headers(user)).status_code
                except httpx.HTTPError:
                    status = 0
                self.history.record(Op(-1, user, began, time.monotonic() - clock, status))
                self._stop.wait(self.read_every)


# -- the log and the views -------------------------------------------------------------

def log_ends(bootstrap: str, topic: str, timeout: float = 30.0) -> dict[int, int]:
    """The high watermark of every partition of ``topic`` now."""
    from confluent_kafka import Consumer, TopicPartition

    from views.kafka_offsets import consumer_config

    consumer = Consumer(consumer_config(bootstrap))
    try:
        partitions = consumer.list_topics(topic, timeout=timeout).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
                for p in sorted(partitions)}
    finally:
        consumer.close()


def read_log(bootstrap: str, topic: str, start: dict[int, int],
             timeout: float = 120.0) -> Iterable[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every record from ``start`` to today's end."""
    from confluent_kafka import Consumer, TopicPartition

    from views.kafka_offsets import consumer_config

    ends = log_ends(bootstrap, topic)
    todo = {p: end for p, end in ends.items() if end > start.get(p, 0)}
    if not todo:
        return
    consumer = Consumer(consumer_config(bootstrap))
    try:
        consumer.assign([TopicPartition(topic, p, start.get(p, 0)) for p in todo])
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() >= deadline:
                msg = f"reading {topic} to its end timed out; partitions left: {todo}"
                raise TimeoutError(msg)
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                msg = f"reading {topic}: {message.error()}"
                raise RuntimeError(msg)
            partition, offset = int(message.partition() or 0), int(message.offset() or 0)
            yield partition, offset, message.key(), message.value()
            if partition in todo and offset + 1 >= todo[partition]:
                del todo[partition]
    finally:
        consumer.close()


def check(history: History, bootstrap: str, topic: str, store: Any) -> Report:
    """Check ``history`` against the ``tweets`` topic and the store's tweets.

    ``topic`` is the topic's physical name; the module docstring says what is counted.
    """
    from ingest.consistency import decode_token
    from ingest.errors import InvalidEvent
    from ingest.events import TWEETS, Post, decode

    # A record is its position: one read twice (a fetch retried across a leader change)
    # is one record, two positions of one write are a duplicate.
    found: dict[int, set[tuple[int, int]]] = {}
    for partition, offset, key, value in read_log(bootstrap, topic, history.start_offsets):
        try:
            event = decode(TWEETS, key, value)
        except InvalidEvent:
            continue
        n = history.parse(event.text) if isinstance(event, Post) else None
        if n is not None:
            found.setdefault(n, set()).add((partition, offset))
    sent = {op.n: op for op in history.writes}
    acked = {n: op for n, op in sent.items() if op.status == 202}
    lost = []
    for n, op in acked.items():
        where = decode_token(op.token)
        if (where.partition, where.offset) not in found.get(n, set()):
            lost.append(n)
    in_views = store.tweets([op.tweet_id for op in acked.values()]) if acked else {}
    duplicated = sorted(n for n, at in found.items() if len(at) > 1)
    return Report(
        attempted=len(sent), acknowledged=len(acked), lost=sorted(lost),
        duplicated=duplicated,
        phantom=sorted(n for n in found if n not in sent),
        indeterminate=sorted(n for n in found if n in sent and n not in acked),
        not_in_views=sorted(n for n, op in acked.items()
                            if op.tweet_id not in in_views or in_views[op.tweet_id].deleted),
        refusals=refusal_windows(history.writes),
        doubled=[_doubled(n, sent.get(n), found[n]) for n in duplicated])


def _doubled(n: int, op: Op | None, at: set[tuple[int, int]]) -> str:
    """One duplicated write: its answer, when it was sent, and its positions in the log."""
    where = ", ".join(f"{partition}@{offset}" for partition, offset in sorted(at))
    if op is None:
        return f"write {n}, never sent, at {where}"
    answer = f"answered {op.status}" if op.status else "no answer"
    return (f"write {n}, {answer} after {op.took:.2f}s, sent at {op.began:.3f} "
            f"(token {op.token or '-'}), at {where}")


def refusal_windows(writes: list[Op]) -> list[tuple[float, float, int]]:
    """Spans in which writes were refused, with how many were refused in each.

    A span runs from the first refused write's start to the end of the last refused
    one before the next 202.
    """
    windows: list[tuple[float, float, int]] = []
    begin = end = 0.0
    count = 0
    for op in sorted(writes, key=lambda o: o.began):
        if op.status == 202:
            if count:
                windows.append((begin, end, count))
                count = 0
            continue
        if not count:
            begin = op.began
        end, count = max(end, op.ended) if count else op.ended, count + 1
    if count:
        windows.append((begin, end, count))
    return windows


def read_stats(reads: list[Op], begin: float = 0.0, end: float = float("inf")) -> ReadStats:
    """The reads begun in [begin, end): errors are anything but 200 and 304."""
    window = [op for op in reads if begin <= op.began < end]
    if not window:
        return ReadStats(0, 0, 0.0, 0.0)
    took = sorted(op.took * 1000 for op in window)
    errors = Counter(op.status in (200, 304) for op in window)[False]
    return ReadStats(len(window), errors, _percentile(took, 50), _percentile(took, 99))


def _percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile: the smallest value with ``q`` % of them at or below."""
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


# -- live streams ----------------------------------------------------------------------------

Key = tuple[int, int]  # an entry's position: (created_at, tweet_id)


def _key(entry: dict[str, Any]) -> Key:
    return int(entry["created_at"]), int(entry["tweet_id"])


@dataclass
class StreamTally:
    """What one stream client saw: events, drops and what a correct stream never sends."""

    user: int
    limit: int
    events: int = 0
    resumes: int = 0
    resets: int = 0
    errors: int = 0
    duplicated: int = 0
    phantom: int = 0
    missed: int = 0
    ends: Counter[str] = field(default_factory=Counter)


def sse_events(lines: Iterable[str]) -> Iterator[dict[str, str]]:
    """The events of a Server-Sent Events body, as their fields (``id``, ``event``, ``data``).

    An event ends at a blank line. A comment (the server's heartbeat) comes out as an
    empty dict, so that a reader learns, at least that often, that it may stop.
    """
    fields: dict[str, str] = {}
    for line in lines:
        if line.startswith(":"):
            yield {}
        elif line:
            name, _, text = line.partition(": ")
            fields[name] = text
        elif fields:
            yield fields
            fields = {}


class StreamHolder:
    """One client holding a user's live home stream on a thread (module docstring).

    ``drop_every``: the mean number of events between two drops (0: never drops).
    """

    def __init__(self, api_url: str, user: int, token: str | None, *, limit: int = 20,
                 drop_every: float = 5.0, seed: int = 0) -> None:
        self.api_url, self.user, self.limit = api_url.rstrip("/"), user, limit
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.tally = StreamTally(user, limit)
        self.held: dict[Key, dict[str, Any]] = {}
        self.last: str | None = None
        self._rng, self.drop_every = random.Random(seed), drop_every
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the page held, between the reader and the check
        self._thread: threading.Thread | None = None

    def start(self) -> StreamHolder:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"stream-{self.user}")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the next event or heartbeat."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def page(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self.held[k] for k in sorted(self.held, reverse=True)]

    def _run(self) -> None:
        with webclient.client(base_url=self.api_url, timeout=REQUEST_TIMEOUT_S) as client:
            while not self._stop.is_set():
                try:
                    self._hold(client)
                except httpx.HTTPError as exc:
                    self.tally.errors += 1
                    log.debug("stream of user %d: %s", self.user, exc)
                    self._stop.wait(0.5)

    def _hold(self, client: httpx.Client) -> None:
        """One connection: read and fold until a drop, an ``end`` or the stop."""
        headers = self.auth | ({"Last-Event-ID": self.last} if self.last else {})
        with client.stream("GET", f"/v1/users/{self.user}/home/stream",
                           params={"limit": self.limit}, headers=headers) as response:
            if response.status_code != 200:
                self.tally.errors += 1
                self._stop.wait(0.5)
                return
            for fields in sse_events(response.iter_lines()):
                if self._stop.is_set():
                    return
                if not fields:
                    continue  # a heartbeat
                kind = self.take(fields)
                if kind == "end":
                    return
                if self.drop_every and self._rng.random() < 1 / self.drop_every:
                    self.tally.resumes += 1
                    return

    def take(self, fields: dict[str, str]) -> str:
        """Fold one event (its SSE fields) into the page held; its type."""
        kind, data = fields.get("event", "message"), orjson.loads(fields.get("data", "{}"))
        self.tally.events += 1
        with self._lock:
            if kind == "end":
                self.tally.ends[data.get("reason", "")] += 1
                return kind
            if kind == "reset":
                self.tally.resets += 1
                self.held = {}
            elif kind == "remove":
                key = next((k for k in self.held if k[1] == int(data["tweet_id"])), None)
                self.tally.phantom += key is None
                self.held.pop(key, None)  # type: ignore[arg-type]
            elif kind == "add":
                key = _key(data["entry"])
                self.tally.duplicated += key in self.held
                self.held[key] = data["entry"]
                for old in sorted(self.held, reverse=True)[self.limit:]:
                    del self.held[old]
            if "id" in fields:
                self.last = fields["id"]
        return kind


@dataclass(frozen=True)
class StreamReport:
    """:func:`check_streams`' totals over every holder; ``ok`` when nothing is off."""

    streams: int
    events: int
    resumes: int
    resets: int
    missed: int
    duplicated: int
    phantom: int

    @property
    def ok(self) -> bool:
        return not (self.missed or self.duplicated or self.phantom)

    def render(self) -> str:
        return (f"{self.streams} streams, {self.events} events, {self.resumes} resumes, "
                f"{self.resets} resets: missed {self.missed}, duplicated {self.duplicated}, "
                f"phantom {self.phantom}")


def check_streams(holders: list[StreamHolder], wait: float = 30.0) -> StreamReport:
    """Stop dropping, let each holder catch up with ``GET /home``, and count (module doc).

    Each holder keeps reading (with no more drops) until its page equals the first page
    ``/home`` serves, or ``wait`` seconds pass; then it is stopped. Every holder's page
    is read at least once, however long the holders before it took.
    """
    for holder in holders:
        holder.drop_every = 0
    deadline = time.monotonic() + wait
    for holder in holders:
        with webclient.client(base_url=holder.api_url, timeout=REQUEST_TIMEOUT_S) as client:
            while True:
                response = client.get(f"/v1/users/{holder.user}/home",
                                      params={"limit": holder.limit}, headers=holder.auth)
                home: list[dict[str, Any]] = response.json().get("entries", []) \
                    if response.status_code == 200 else []
                if holder.page() == home or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
        held, served = {_key(e) for e in holder.page()}, {_key(e) for e in home}
        holder.tally.missed += len(served - held)
        holder.tally.phantom += len(held - served)
        holder.stop()
    tallies = [h.tally for h in holders]
    return StreamReport(len(holders), sum(t.events for t in tallies),
                        sum(t.resumes for t in tallies), sum(t.resets for t in tallies),
                        sum(t.missed for t in tallies), sum(t.duplicated for t in tallies),
                        sum(t.phantom for t in tallies))


# -- from a shell ----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """``python -m infra.checks.checker``: run the workload for a while, then check it.

    Points at the stack of ``--run-dir`` (as ``fanout`` commands do), or at whatever
    ``FANOUT_API_URL``, ``KAFKA_BOOTSTRAP`` and ``FANOUT_STORE`` name — a real cluster.
    """
    import os
    from pathlib import Path

    from infra.settings import API_URL_ENV, RUN_DIR_ENV
    from infra.stack.stack import Stack
    from ingest.events import TWEETS
    from ingest.settings import KafkaSettings
    from serving.callers import mint
    from serving.settings import AUTH_SECRET_ENV
    from views.settings import DEFAULT_RUN_DIR, ViewSettings
    from views.stores import store_from_url

    p = argparse.ArgumentParser(prog="python -m infra.checks.checker", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--run-dir", default=os.environ.get(RUN_DIR_ENV, DEFAULT_RUN_DIR))
    p.add_argument("--seconds", type=float, default=30.0, help="how long the workload runs")
    p.add_argument("--users", type=int, default=50, help="accounts 1..N post and read")
    p.add_argument("--wait", type=float, default=120.0,
                   help="how long the views may take to catch up before the check")
    p.add_argument("--streams", type=int, default=0,
                   help="live home streams held during the workload (users 1..N, each "
                        "dropping and resuming at random) and checked after it")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stack = Stack.load(Path(args.run_dir))
    environ = {**(stack.env() if stack else {}), **os.environ}
    api_url = environ.get(API_URL_ENV)
    if not api_url:
        print(f"no API: set {API_URL_ENV} or point --run-dir at a stack (`fanout up`)")
        return 2
    kafka, view = KafkaSettings.from_env(environ), ViewSettings.from_env(environ)
    secret = environ.get(AUTH_SECRET_ENV, "").encode()
    history = History()
    topic = kafka.topic(TWEETS)
    history.start_offsets = log_ends(kafka.bootstrap, topic)
    token_of: Callable[[int], str | None] = lambda u: mint(u, secret, 3600) if secret else None
    holders = [StreamHolder(api_url, u, token_of(u), seed=u).start()
               for u in range(1, args.streams + 1)]
    with Workload(api_url, list(range(1, args.users + 1)), history, token_of):
        time.sleep(args.seconds)
    streams = check_streams(holders, args.wait) if holders else None
    with store_from_url(view.store_url, cap=view.timeline_cap) as store:
        deadline = time.monotonic() + args.wait
        report = check(history, kafka.bootstrap, topic, store)
        while report.not_in_views and time.monotonic() < deadline:
            time.sleep(1.0)
            report = check(history, kafka.bootstrap, topic, store)
    print(report.render())
    print(f"reads: {read_stats(history.reads).render()}")
    if streams is not None:
        print(f"live streams: {streams.render()}")
    return 0 if report.ok and (streams is None or streams.ok) else 1


if __name__ == "__main__":
    raise SystemExit(main())
