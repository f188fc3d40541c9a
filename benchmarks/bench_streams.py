"""Live streams at scale: N open SSE home streams while posting at a fixed rate.

    .venv/bin/python benchmarks/bench_streams.py --streams 10000 --rate 200 --seconds 60

Starts a SQLite stack in a scratch directory (``infra.stack.launch.up``: Kafka, the Spark
view job, the API as ``fanout up`` runs it, one process per core; auth off, verifier
off) and fills it with a synthetic history (``infra.load.prep.seed``). Then, from ONE
asyncio process (uvloop when installed; the file-descriptor limit raised with
``resource`` first, for the client and, inherited, the stack):

1. *Baseline*: posts at ``--rate`` for ``--baseline`` s with no stream open: the
   API's CPU for the writes alone, and the view's own delay — for one post in
   ``--probe-every``, a follower's ``GET /home?after=TOKEN&limit=1`` (held by the API
   until the view applied the write) timed from the post's 202.
2. *Open*: ``--streams`` streams (``GET /v1/users/{id}/home/stream?limit=20``) of
   distinct readers, the most-following first (cycled when there are fewer users),
   opened at ``--ramp`` per second; after a settling pause, the API processes' RSS
   over the RSS before, per stream.
3. *Push*: posts at ``--rate`` for ``--seconds`` s, ``--celebrity-share`` of them by
   celebrities (uniformly), the rest by normal authors with followers. Each post is
   timed from its 202 (the write accepted) to each ``add`` of that tweet at a stream
   (the first per stream): push latency p50/p99/p99.9/max for normal and celebrity
   authors. The view probe runs as in 1, and a probe whose follower holds a stream
   pairs the two: the stream's own part (``add`` minus the view's ``?after=`` answer).
   The client's, the API's and the machine's CPU over the phase say what bounds the
   figures.
4. *Poll*: the streams closed, the same posts while polling clients read ``/home``
   at ``--poll-rate`` reads/s, each client every ~2 s with ``If-None-Match`` (what a
   polling app sends; a page that stood still is a 304): the API's CPU per poll
   read, over the baseline.

*Reads saved.* A client polling every P seconds sees a change P/2 after the view
applied it, on average; the stream shows it after its own part (3). At the same
freshness P = 2 × the stream's mean own part, so N polling clients would read
N / P pages per second. The stream's actual read work is its CPU over the baseline,
counted in poll reads (÷ the API's CPU per poll read from 4). The difference is what
the stream saves. Results go to ``benchmarks/results/streams.json`` (``--name``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from harness import ROOT, argument_parser, save
from pipeline import scratch

sys.path.insert(0, str(ROOT))

from hdrh.histogram import HdrHistogram  # noqa: E402

from infra.load.prep import History, seed  # noqa: E402
from infra.load.run import api_processes  # noqa: E402
from infra.stack.launch import up  # noqa: E402
from infra.stack.stack import Stack, down  # noqa: E402
from loadgen.sse import Parser, head, request  # noqa: E402
from views.stores import store_from_url  # noqa: E402

HOST = "127.0.0.1"
LIMIT = 20
TARGET_S = {"normal": 1.0, "celebrity": 2.0}
_TWEET_ID = re.compile(r'"tweet_id":"(\d+)"')
_CREATED = re.compile(r'"created_at":(\d+)')
#: Seconds a bucket of the push latency's time series spans (by accept time).
BUCKET_S = 5.0
#: Stream connects waiting for their answer at once, at most (the API's accept backlog
#: is 2,048; at 400 connects/s on a busy box a few thousand waited past 30 s).
CONNECTING = 256
_STREAM_OPEN = re.compile(rb"^fanout_streams_open(?:\{[^}]*\})? ([0-9.e+]+)", re.M)
_CUT = re.compile(rb'^fanout_stream_cut_off_total\{reason="(\w+)"\} ([0-9.e+]+)', re.M)


def long_histogram() -> HdrHistogram:
    """Microseconds up to an hour: a starved box pushes past the load report's 60 s."""
    return HdrHistogram(1, 3_600_000_000, 3)


def raise_nofile(need: int) -> tuple[int, int]:
    """Raise this process's open-files limit to ``need`` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


# -- the graph --------------------------------------------------------------------------------
def graph(store_url: str) -> tuple[dict[int, list[int]], list[int], list[int]]:
    """Followers by author, normal authors with followers, celebrities with followers."""
    with store_from_url(store_url) as store:
        followees = {u: store.followees(u) for u in store.home_users()}
        celebrities = set(store.celebrities())
    followers: dict[int, list[int]] = {}
    for user, them in followees.items():
        for author in them:
            followers.setdefault(author, []).append(user)
    normal = sorted(a for a in followers if a not in celebrities)
    celebs = sorted(a for a in celebrities if followers.get(a))
    return followers, normal, celebs


def readers(followers: dict[int, list[int]], n: int) -> list[int]:
    """``n`` stream owners: users by how many they follow, most first, cycled if few."""
    following = Counter(u for users in followers.values() for u in users)
    ranked = [u for u, _ in following.most_common()]
    return list(itertools.islice(itertools.cycle(ranked), n))


# -- the client -------------------------------------------------------------------------------
class State:
    """What the client measured: accepts, push and view latencies, stream counts."""

    def __init__(self, celebrities: set[int]) -> None:
        self.celebrities = celebrities
        self.accepted: dict[int, tuple[float, str]] = {}
        self.since_ms = time.time() * 1000  # the history's tweets are older than the run
        self.phase_start = 0.0
        self.series: dict[int, HdrHistogram] = {}
        self.pending: list[tuple[int, float]] = []
        self.push = {k: long_histogram() for k in TARGET_S}
        self.post = long_histogram()
        self.view = long_histogram()
        self.probes: dict[tuple[int, int], float] = {}  # (tweet, user) -> view answered at
        self.probe_kind: dict[int, str] = {}  # tweet -> its author's class
        self.receipts: dict[tuple[int, int], float] = {}  # (tweet, user) -> add received at
        self.counts: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self.ended: Counter[str] = Counter()
        self.open = 0
        self.measuring = False

    def receive(self, tweet: int, created_ms: int, user: int, at: float) -> None:
        if created_ms < self.since_ms:
            return  # the page's history, not a post of this run
        known = self.accepted.get(tweet)
        if (tweet, user) in self.probes and known is not None and self.measuring \
                and known[0] >= self.phase_start:
            self.receipts[(tweet, user)] = at  # a push of this phase, not a catch-up
        if known is None:
            self.pending.append((tweet, at))
        elif self.measuring:
            self._record(known, at)

    def _record(self, known: tuple[float, str], at: float) -> None:
        accepted, kind = known
        if accepted < self.phase_start:
            return  # accepted before the phase (in the ramp): not this phase's push
        value = max(1, round((at - accepted) * 1e6))
        self.push[kind].record_value(value)
        bucket = int((accepted - self.phase_start) // BUCKET_S)
        self.series.setdefault(bucket, long_histogram()).record_value(value)

    def join_pending(self) -> None:
        for tweet, at in self.pending:
            known = self.accepted.get(tweet)
            if known is not None and self.measuring:
                self._record(known, at)
            else:
                self.counts["unmatched"] += 1
        self.pending = []


async def hold(port: int, user: int, state: State, connecting: asyncio.Semaphore) -> None:
    """One stream: connect, then read events until cancelled (or the server ends it)."""
    async with connecting:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 60)
        except (OSError, TimeoutError) as exc:
            state.counts[f"connect_error_{type(exc).__name__}"] += 1
            return
        try:
            parsed = await asyncio.wait_for(_answer(reader, writer, port, user), 120)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            state.counts[f"connect_error_{type(exc).__name__}"] += 1
            writer.close()
            return
    try:
        status, fields, rest = parsed
        if status != 200:
            state.counts[f"status_{status}"] += 1
            return
        state.open += 1
        state.counts["opened"] += 1
        try:
            await _read(reader, Parser(chunked=b"chunked" in fields.get(b"transfer-encoding", b"")),
                        rest, user, state)
        finally:
            state.open -= 1
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
        state.counts[f"stream_error_{type(exc).__name__}"] += 1
    finally:
        writer.close()


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int,
                  user: int) -> tuple[int, dict[bytes, bytes], bytes]:
    """Send the stream's request; its answer's head (and what came after it)."""
    writer.write(request(f"{HOST}:{port}".encode(), f"/v1/users/{user}/home/stream?limit={LIMIT}"))
    buffer = b""
    while (parsed := head(buffer)) is None:
        chunk = await reader.read(65_536)
        if not chunk:
            raise ConnectionResetError
        buffer += chunk
    return parsed


async def _read(reader: asyncio.StreamReader, parser: Parser, data: bytes, user: int,
                state: State) -> None:
    seen: set[int] = set()
    while True:
        now = time.time()
        for event in parser.feed(data):
            state.events[event.kind] += 1
            if event.kind == "add":
                match, created = _TWEET_ID.search(event.data), _CREATED.search(event.data)
                if match is not None and created is not None and \
                        (tweet := int(match.group(1))) not in seen:
                    seen.add(tweet)
                    state.receive(tweet, int(created.group(1)), user, now)
            elif event.kind == "end":
                state.ended[json.loads(event.data).get("reason", "?")] += 1
                return
        data = await reader.read(65_536)
        if not data:
            state.counts["dropped"] += 1
            return


class Http:
    """Keep-alive HTTP/1.1 connections to the API, reused (Content-Length bodies)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def call(self, method: str, path: str, headers: dict[str, str] | None = None,
                   body: bytes | None = None) -> tuple[int, dict[bytes, bytes], bytes]:
        """One exchange; once more on a new connection if an idle one was closed (keep-alive)."""
        lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")
        while self.idle:
            try:
                return await self._exchange(self.idle.pop(), data)
            except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as exc:
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise
        return await self._exchange(await asyncio.open_connection(HOST, self.port), data)

    async def _exchange(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                        data: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        reader, writer = conn
        try:
            writer.write(data)
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            status, fields, _ = head(raw) or (0, {}, b"")
            payload = await reader.readexactly(int(fields.get(b"content-length", b"0")))
        except BaseException:
            writer.close()
            raise
        self.idle.append(conn)
        return status, fields, payload

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle = []


class Authors:
    """Who posts: a celebrity (uniformly) with probability ``share``, else a normal author."""

    def __init__(self, normal: list[int], celebrities: list[int], share: float) -> None:
        self.normal, self.celebrities = normal, celebrities
        self.share = share if celebrities else 0.0

    def pick(self, rng: random.Random) -> tuple[int, str]:
        if rng.random() < self.share:
            return rng.choice(self.celebrities), "celebrity"
        return rng.choice(self.normal), "normal"


async def post_at_rate(http: Http, state: State, rate: float, seconds: float,
                       authors: Authors, followers: dict[int, list[int]],
                       holders: set[int], probe_every: int, rng: random.Random) -> int:
    """Open loop: post ``i`` is due at start + i/rate; returns the posts accepted."""
    tasks: set[asyncio.Task[None]] = set()
    start = time.perf_counter() + 0.2
    n = int(rate * seconds)
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        author, kind = authors.pick(rng)
        task = asyncio.ensure_future(_post(http, state, author, kind, followers, holders,
                                           i % probe_every == 0, rng, time.time()))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=60)
    return n


async def _post(http: Http, state: State, author: int, kind: str,
                followers: dict[int, list[int]], holders: set[int], probe: bool,
                rng: random.Random, due: float) -> None:
    body = json.dumps({"text": f"live {author} {due:.3f}"}).encode()
    try:
        status, _, payload = await http.call("POST", "/v1/tweets", {"X-User-Id": str(author)},
                                             body)
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        state.counts["post_errors"] += 1
        return
    accepted = time.time()
    if status != 202:
        state.counts[f"post_status_{status}"] += 1
        return
    answer = json.loads(payload)
    tweet = int(answer["tweet_id"])
    state.accepted[tweet] = (accepted, kind)
    if state.measuring:
        state.post.record_value(max(1, round((accepted - due) * 1e6)))
    if probe:
        watched = [u for u in followers.get(author, ()) if u in holders] or followers[author]
        await _probe(http, state, tweet, rng.choice(watched), answer["token"], accepted)


async def _probe(http: Http, state: State, tweet: int, user: int, token: str,
                 accepted: float) -> None:
    """The view's own delay: a follower's ``?after=`` read, timed from the 202."""
    state.probes[(tweet, user)] = 0.0
    state.probe_kind[tweet] = state.accepted[tweet][1]
    try:
        status, _, payload = await http.call(
            "GET", f"/v1/users/{user}/home?limit=1&after={token}")
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        state.counts["probe_errors"] += 1
        return
    answered = time.time()
    if status == 200 and json.loads(payload).get("consistent"):
        state.probes[(tweet, user)] = answered
        if state.measuring:
            state.view.record_value(max(1, round((answered - accepted) * 1e6)))
    else:
        state.counts["probe_not_consistent"] += 1


async def poll_at_rate(http_pool: list[Http], users: list[int], rate: float, seconds: float,
                       state: State) -> int:
    """Polling clients: ``/home`` of ``users`` in turn at ``rate``/s, with If-None-Match."""
    etags: dict[int, str] = {}
    tasks: set[asyncio.Task[None]] = set()
    done = Counter[str]()

    async def one(http: Http, user: int) -> None:
        headers = {"If-None-Match": etags[user]} if user in etags else {}
        try:
            status, fields, _ = await http.call("GET", f"/v1/users/{user}/home?limit={LIMIT}",
                                                headers)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            done["errors"] += 1
            return
        done[str(status)] += 1
        if b"etag" in fields:
            etags[user] = fields[b"etag"].decode()

    start, n = time.perf_counter(), int(rate * seconds)
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(one(http_pool[i % len(http_pool)], users[i % len(users)]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    state.counts.update({f"poll_{k}": v for k, v in done.items()})
    return done["200"] + done["304"]


# -- measuring --------------------------------------------------------------------------------
class Meter:
    """CPU seconds of the API processes, this client and the machine over a phase."""

    def __init__(self, api: list[psutil.Process]) -> None:
        self.api, self.me = api, psutil.Process()

    def snapshot(self) -> dict[str, float]:
        busy = psutil.cpu_times()
        each = {f"api_{i}": _cpu(p) for i, p in enumerate(self.api)}
        return {**each, "wall": time.monotonic(), "api": sum(each.values()),
                "client": _cpu(self.me),
                "machine": busy.user + busy.system + busy.nice + busy.irq + busy.softirq}

    @staticmethod
    def cores(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        wall = b["wall"] - a["wall"]
        return {k: round((b[k] - a[k]) / wall, 3) for k in a if k != "wall"} | {
            "seconds": round(wall, 1), "load_average_1m": round(os.getloadavg()[0], 2)}


def _cpu(process: psutil.Process) -> float:
    try:
        t = process.cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


def rss(api: list[psutil.Process]) -> int:
    total = 0
    for p in api:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def percentiles(h: HdrHistogram) -> dict[str, Any]:
    if not h.get_total_count():
        return {"count": 0}
    return {"count": h.get_total_count(),
            **{f"p{q:g}": round(h.get_value_at_percentile(q) / 1e6, 3) for q in (50, 99, 99.9)},
            "max": round(h.get_max_value() / 1e6, 3), "mean": round(h.get_mean_value() / 1e6, 3)}


async def metrics(http: Http) -> dict[str, Any]:
    status, _, body = await http.call("GET", "/metrics")
    if status != 200:
        return {}
    open_ = sum(float(v) for v in _STREAM_OPEN.findall(body))
    return {"open": open_, "cut_off": {k.decode(): float(v) for k, v in _CUT.findall(body)}}


# -- the run ---------------------------------------------------------------------------------
def view_batches(store_url: str, since: float, until: float) -> dict[str, Any]:
    """The view job's micro-batches that finished in [since, until] (epoch s)."""
    with store_from_url(store_url) as store:
        rows = [b for b in store.batches(5_000) if since * 1000 <= b.finished_at <= until * 1000]
    ends = sorted(b.finished_at / 1000 for b in rows)
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    return {"batches": len(rows),
            "interval_s_mean": round(sum(gaps) / len(gaps), 3) if gaps else None,
            "apply_s_mean": round(sum(b.seconds for b in rows) / len(rows), 3) if rows else None}


async def bench(api_url: str, owners: list[int], followers: dict[int, list[int]],
                normal: list[int], celebs: list[int], args: argparse.Namespace,
                store_url: str) -> dict:
    port = int(api_url.rsplit(":", 1)[1])
    api = api_processes(api_url)
    meter, rng = Meter(api), random.Random(args.seed)
    state = State(set(celebs))
    weighted = Authors(normal, celebs, args.celebrity_share)
    holders = set(owners)
    http = Http(port)
    result: dict[str, Any] = {"api_processes": len(api)}

    print(f"baseline: posting at {args.rate}/s for {args.baseline} s, no streams", flush=True)
    state.measuring, state.phase_start = True, time.time()
    a = meter.snapshot()
    await post_at_rate(http, state, args.rate, args.baseline, weighted, followers, set(),
                       args.probe_every, rng)
    result["baseline"] = {"cores": Meter.cores(a, meter.snapshot()),
                          "view_s": percentiles(state.view), "post_s": percentiles(state.post)}
    state.view, state.post = long_histogram(), long_histogram()
    state.measuring = False

    rss0 = rss(api)
    print(f"opening {len(owners)} streams at {args.ramp}/s", flush=True)
    began = time.monotonic()
    holding = []
    connecting = asyncio.Semaphore(CONNECTING)
    for i, user in enumerate(owners):
        delay = began + i / args.ramp - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        holding.append(asyncio.ensure_future(hold(port, user, state, connecting)))
    deadline = time.monotonic() + args.open_timeout
    while state.open + sum(v for k, v in state.counts.items() if "error" in k or "status" in k) \
            < len(owners) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    opened_s = time.monotonic() - began
    await asyncio.sleep(args.settle)
    idle_a = meter.snapshot()
    await asyncio.sleep(5)
    rss1 = rss(api)
    result["open"] = {"streams": state.open, "wanted": len(owners), "seconds": round(opened_s, 1),
                      "rss_before_mb": round(rss0 / 2**20, 1), "rss_after_mb": round(rss1 / 2**20, 1),
                      "kib_per_stream": round((rss1 - rss0) / 1024 / max(state.open, 1), 1),
                      "idle_cores": Meter.cores(idle_a, meter.snapshot()),
                      "server": await metrics(http), "counts": dict(state.counts)}
    print(f"  {state.open} open after {opened_s:.1f} s; "
          f"{result['open']['kib_per_stream']} KiB per stream", flush=True)

    print(f"push: posting at {args.rate}/s for {args.seconds} s with streams open", flush=True)
    events0 = _sent(state)
    state.measuring, state.phase_start = True, time.time()
    a = meter.snapshot()
    await post_at_rate(http, state, args.rate, args.seconds, weighted, followers, holders,
                       args.probe_every, rng)
    b, events = meter.snapshot(), _sent(state) - events0
    batches = view_batches(store_url, state.phase_start, time.time())
    await asyncio.sleep(args.drain)  # the last posts' adds
    state.join_pending()
    state.measuring = False
    extras = {kind: sorted(state.receipts[k] - v for k, v in state.probes.items()
                           if v and k in state.receipts and state.probe_kind[k[0]] == kind)
              for kind in TARGET_S}
    result["push"] = {"cores": Meter.cores(a, b), "open_at_end": state.open,
                      "normal_s": percentiles(state.push["normal"]),
                      "celebrity_s": percentiles(state.push["celebrity"]),
                      "view_s": percentiles(state.view), "post_s": percentiles(state.post),
                      "view_not_applied_in_5s": state.counts["probe_not_consistent"],
                      "stream_part_s": _summary(extras["normal"] + extras["celebrity"]),
                      "stream_part_normal_s": _summary(extras["normal"]),
                      "stream_part_celebrity_s": _summary(extras["celebrity"]),
                      "events_per_s": round(
                          events / max(b["wall"] - a["wall"], 1e-9), 1),
                      "events": dict(state.events), "ended": dict(state.ended),
                      "view_batches": batches,
                      "series": [[k * BUCKET_S, h.get_total_count(),
                                  round(h.get_value_at_percentile(50) / 1e6, 3),
                                  round(h.get_value_at_percentile(99) / 1e6, 3)]
                                 for k, h in sorted(state.series.items())],
                      "server": await metrics(http), "counts": dict(state.counts)}
    for task in holding:
        task.cancel()
    await asyncio.wait(holding, timeout=30)
    deadline = time.monotonic() + 60  # the API lets go of the closed streams
    while (await metrics(http)).get("open", 0) > 0 and time.monotonic() < deadline:
        await asyncio.sleep(1)

    print(f"poll: {args.poll_rate} polls/s of /home with If-None-Match, posting at "
          f"{args.rate}/s, for {args.poll_seconds} s", flush=True)
    pool = [Http(port) for _ in range(64)]
    a = meter.snapshot()
    posting = asyncio.ensure_future(post_at_rate(http, state, args.rate, args.poll_seconds,
                                                 weighted, followers, set(), 10**9, rng))
    # Each polling client reads every ~2 s (after its first read, with its ETag).
    pollers = owners[:max(1, min(len(owners), int(args.poll_rate * 2)))]
    polls = await poll_at_rate(pool, pollers, args.poll_rate, args.poll_seconds, state)
    await posting
    b = meter.snapshot()
    result["poll"] = {"cores": Meter.cores(a, b), "polls": polls,
                      "counts": {k: v for k, v in state.counts.items() if k.startswith("poll_")}}
    for h in [http, *pool]:
        h.close()
    return result


def _sent(state: State) -> int:
    """Events received so far, heartbeats left out."""
    return sum(v for k, v in state.events.items() if k != "comment")


def _summary(values: list[float]) -> dict[str, Any]:
    values = sorted(values)
    if not values:
        return {"count": 0}
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"count": len(values), "mean": round(sum(values) / len(values), 3),
            "p50": round(pick(0.5), 3), "p99": round(pick(0.99), 3), "max": round(values[-1], 3)}


def saved_reads(result: dict[str, Any], streams: int) -> dict[str, Any]:
    """Reads/s polling clients would need at the stream's freshness, against its own work."""
    base = result["baseline"]["cores"]["api"]
    per_poll = (result["poll"]["cores"]["api"] - base) / max(
        result["poll"]["polls"] / result["poll"]["cores"]["seconds"], 1e-9)
    part = result["push"]["stream_part_s"].get("mean")
    if not part or per_poll <= 0:
        return {"note": "no paired probe or no poll cost measured"}
    period = 2 * part
    needed = streams / period
    stream_cores = result["push"]["cores"]["api"] - base
    equivalent = stream_cores / per_poll
    return {"stream_part_mean_s": part, "poll_period_s": round(period, 3),
            "poll_reads_per_s_needed": round(needed), "api_cpu_ms_per_poll": round(
                per_poll * 1000, 3),
            "stream_api_cores": round(stream_cores, 3),
            "stream_reads_per_s_equivalent": round(equivalent),
            "reads_per_s_saved": round(needed - equivalent),
            "ratio": round(needed / equivalent, 1) if equivalent > 0 else None}


def stream_work(result: dict[str, Any]) -> dict[str, Any] | None:
    """The stream's CPU per event and per view batch, from the push phase over the baseline."""
    push = result["push"]
    interval = (push.get("view_batches") or {}).get("interval_s_mean")
    events = push["events_per_s"]
    api = [v for k, v in push["cores"].items() if k.startswith("api_")]
    if not interval or not events or not api:
        return None
    per_event = (push["cores"]["api"] - result["baseline"]["cores"]["api"]) / events
    per_batch = events * interval
    return {"batch_interval_s": interval, "events_per_batch": round(per_batch),
            "api_cpu_ms_per_event": round(per_event * 1000, 3),
            "batch_work_s": round(per_batch * per_event / len(api), 2), "processes": len(api),
            # at the CPU the API processes got in the phase (the box is shared)
            "batch_work_wall_s": round(per_batch * per_event / max(sum(api), 1e-9), 2),
            "api_cores": round(sum(api), 3)}


def bounds(result: dict[str, Any]) -> list[str]:
    """What the figures say bounds each push p99 that misses its target (measured)."""
    push, out = result["push"], []
    for kind, target in TARGET_S.items():
        p99 = push[f"{kind}_s"].get("p99")
        if p99 is None or p99 <= target:
            continue
        view = push["view_s"].get("p99") or 0.0
        part = push[f"stream_part_{kind}_s"].get("p99") or 0.0
        cores = push["cores"]
        post, before = push["post_s"].get("p99"), result["baseline"]["post_s"].get("p99")
        why = [f"{kind} push p99 {p99} s > {target} s:",
               f"the posts' own accept (due → 202) p99 {post} s against {before} s with no "
               "stream open (the API's event loops serve the streams and the writes),",
               f"the view's own delay (post 202 → ?after= answered) p99 {view} s "
               f"({push.get('view_not_applied_in_5s', 0)} probes of the run not applied "
               "within the API's 5 s ?after= wait),",
               f"the stream's own part (add − ?after= answer) p99 {part} s;",
               f"CPU over the phase: API {cores['api']}, client {cores['client']}, machine "
               f"{cores['machine']} of {os.cpu_count()} cores"]
        if cores["machine"] >= 0.9 * (os.cpu_count() or 1):
            why.append("— the machine's cores are saturated")
        if cores["client"] >= 0.9:
            why.append("— the client process is at a full core")
        busiest = max((v for k, v in cores.items() if k.startswith("api_")), default=0.0)
        if busiest >= 0.9:
            why.append(f"— an API process is at {busiest} of a core (its one event loop "
                       "sends every stream's events)")
        work = stream_work(result)
        if work:
            why.append(f"— a view batch every {work['batch_interval_s']} s brings ~"
                       f"{work['events_per_batch']} stream events; at the API's "
                       f"{work['api_cpu_ms_per_event']} CPU-ms an event (re-read, encode, "
                       f"send) over the baseline, a batch's events take ~"
                       f"{work['batch_work_s']} s of its {work['processes']} processes at a "
                       f"full core each, ~{work['batch_work_wall_s']} s at the "
                       f"{work['api_cores']} cores they got, one page after another")
        series = [row for row in push.get("series", []) if row[1]]
        if len(series) >= 3 and series[-1][2] > 2 * series[0][2]:
            why.append(f"— push p50 grew from {series[0][2]} s (posts of the first "
                       f"{BUCKET_S:g} s) to {series[-1][2]} s (the last): the streams' "
                       "re-reads and sends fell behind the post rate (a backlog, not a "
                       "fixed delay)")
        why.append(f"(load average {cores['load_average_1m']}: the machine is shared)")
        out.append(" ".join(why))
    return out


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="streams", users=10_000, follows=100_000,
                         tweets=10_000)
    ap.add_argument("--streams", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=200.0, help="posts per second")
    ap.add_argument("--seconds", type=float, default=60.0, help="the push phase")
    ap.add_argument("--baseline", type=float, default=20.0)
    ap.add_argument("--poll-rate", type=float, default=1000.0)
    ap.add_argument("--poll-seconds", type=float, default=15.0)
    ap.add_argument("--ramp", type=float, default=400.0, help="streams opened per second")
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--drain", type=float, default=10.0)
    ap.add_argument("--probe-every", type=int, default=20)
    ap.add_argument("--celebrity-share", type=float, default=0.01,
                    help="share of the posts by celebrities (default 0.01: the 27 of a "
                         "10k-user history each post ~4x as often as an average user)")
    ap.add_argument("--open-timeout", type=float, default=300.0,
                    help="seconds to wait for every stream to open")
    ap.add_argument("--celebrity-threshold", type=int, default=300)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--stack", type=Path, default=None, metavar="RUN_DIR",
                    help="load the stack running in RUN_DIR instead (not started, filled or "
                         "stopped here; for trying the client)")
    args = ap.parse_args()
    limits = raise_nofile(2 * args.streams + 4_096)
    started = time.time()
    env = {"FANOUT_AUTH": "off", "FANOUT_API_ACCESS_LOG": "false",
           "FANOUT_CELEBRITY_THRESHOLD": str(args.celebrity_threshold)}
    if args.stack is not None:
        running = Stack.load(args.stack.resolve())
        if running is None:
            print(f"no stack in {args.stack}", file=sys.stderr)
            return 1
        followers, normal, celebs = graph(running.store_url)
        result = _run(bench(running.api_url, readers(followers, args.streams), followers,
                            normal, celebs, args, running.store_url))
        return _finish(result, args, limits, started)
    with scratch("bench-streams-") as work:
        run_dir = work / "run"
        try:
            stack = up(run_dir, extra_env=env, verifier=False)
            seeded = seed(stack, History(args.users, args.follows, args.tweets,
                                         args.celebrity_threshold, args.seed), work / "history")
            followers, normal, celebs = graph(stack.store_url)
            owners = readers(followers, args.streams)
            print(f"stack up, history of {seeded['events']} events; {len(normal)} normal "
                  f"authors, {len(celebs)} celebrities", flush=True)
            result = _run(bench(stack.api_url, owners, followers, normal, celebs, args,
                                stack.store_url))
        finally:
            down(run_dir)
    return _finish(result, args, limits, started)


def _finish(result: dict[str, Any], args: argparse.Namespace, limits: tuple[int, int],
            started: float) -> int:
    result["reads_saved"] = saved_reads(result, result["open"]["streams"])
    result["stream_work"] = stream_work(result)
    result["bounds"] = bounds(result)
    result["settings"] = {**vars(args), "nofile": list(limits), "wall_s": round(
        time.time() - started)}
    result["command"] = "benchmarks/bench_streams.py " + " ".join(sys.argv[1:])
    _print(result)
    print(f"written to {save(args.name, result)}")
    return 0


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _print(r: dict[str, Any]) -> None:
    push, o = r["push"], r["open"]
    print(f"\n{o['streams']} of {o['wanted']} streams open in {o['seconds']} s; "
          f"{o['kib_per_stream']} KiB of API RSS per stream")
    for kind in TARGET_S:
        s = push[f"{kind}_s"]
        print(f"push {kind:<9} n={s.get('count')} p50 {s.get('p50')} s, p99 {s.get('p99')} s, "
              f"p99.9 {s.get('p99.9')} s, max {s.get('max')} s (target p99 <= {TARGET_S[kind]} s)")
    print(f"view (202 → ?after= answered): {push['view_s']}")
    for kind in TARGET_S:
        print(f"stream's own part (add − ?after= answer), {kind}: "
              f"{push[f'stream_part_{kind}_s']}")
    print(f"events/s {push['events_per_s']}; cores {push['cores']}; ended {push['ended']}")
    print(f"reads saved: {r['reads_saved']}")
    for line in r["bounds"]:
        print("BOUND:", line)
    print(f"command: {r['command']}")


if __name__ == "__main__":
    sys.exit(main())
