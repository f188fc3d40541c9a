"""One node of each against three: replay, freshness, home reads, RSS and the RF 3 write cost.

    .venv/bin/python benchmarks/run.py run nodes              # 15-25 min here → results/nodes.json
    .venv/bin/python benchmarks/run.py run nodes --users 300 --follows 3000 --posts 2000 \\
        --rate 50 --seconds 10 --read-seconds 5 --name nodes-smoke      # a smoke run

One history is generated (``fanout generate``, the default social mix: ``--users``
2,000, ``--follows`` 30,000, ``--posts`` 20,000 posts with their replies, reposts,
blocks, mutes and deletions), and then each stack runs in a fresh run directory of its
own in a scratch directory removed at the end (``FANOUT_BENCH_KEEP=1`` keeps it):

- 1 node: ``fanout up --store cassandra --cluster``: one KRaft Kafka node, one Cassandra
  node (RF 1) and a Spark standalone master with one 2-core worker, so that the job runs
  on executors in their own JVMs as on 3 nodes (``--one-spark local``: the job in
  ``local[2]``, as plain ``fanout up --store cassandra`` runs it);
- 3 nodes: ``fanout up --nodes 3``: three Kafka nodes (topics at RF 3,
  ``min.insync.replicas=2``), three Cassandra nodes on 127.0.0.1..3 (keyspace at RF 3,
  LOCAL_QUORUM), a Spark master with two 1-core workers.

Both without the live verifier. On each stack, in turn:

1. idle: ``--settle-seconds`` after ``up`` (its schema, JIT and first empty batches), every
   service's CPU over ``--idle-seconds``;
2. replay: ``fanout replay`` of the history, timed from its first record sent (its own
   duration, read off its summary) until the API's ``/healthz`` shows every record
   applied: events/s; every service's CPU-seconds over the window; the rows and timeline
   adds the sink wrote (its ``batch N: R rows (A timeline adds, ...)`` lines in the job's
   log). Cassandra's CPU-seconds, summed over its nodes, per row written is the write
   cost at RF 3 against RF 1 (also net of the nodes' idle CPU);
3. freshness: posts produced straight to Kafka at ``--rate`` for ``--seconds`` (open
   loop, acks=all, each timed from its intended send time), a post visible once
   ``/healthz``, polled every 50 ms, shows its offset applied: p50/p90/p99/max;
4. home reads over HTTP as the users themselves (bearer tokens minted with the stack's
   secret): ``--first-reads`` first pages of distinct users one at a time (not in any
   page cache), then a closed loop on ``/v1/users/{random}/home?limit=20``
   (``--connections``, ``--read-seconds``; wrk, or Python threads where wrk is missing);
5. RSS of every service (its process tree: a Spark worker's executors apart, the job's
   driver JVM and Python workers with it; forked processes each count the pages they
   share), at the end and at its peak over the run (sampled every 2 s).

Then ``fanout down``, and any process still naming the run directory is killed. The
table at the end sets 3 nodes against 1; ``results/nodes.json`` (``--name``) holds it all.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from harness import ROOT, WRK_THREADS_LUA, argument_parser, save
from pipeline import percentile, scratch

from infra import webclient

sys.path.insert(0, str(ROOT))

from infra.services.sparkcluster import EXECUTOR_CLASS  # noqa: E402
from infra.stack.stack import Stack  # noqa: E402
from ingest.events import Post  # noqa: E402
from ingest.producer import ChangelogProducer, Position  # noqa: E402
from ingest.settings import KafkaSettings  # noqa: E402
from ingest.snowflake import Snowflake  # noqa: E402
from serving.callers import mint  # noqa: E402
from serving.settings import ServingSettings  # noqa: E402
from views.kafka_offsets import EndOffsets  # noqa: E402

FANOUT = [sys.executable, "-m", "infra.cli"]
MB = 2**20
#: Variables that would point a stack's commands elsewhere (``--nodes`` refuses them).
_FOREIGN = ("KAFKA_BOOTSTRAP", "FANOUT_STORE", "FANOUT_SPARK_MASTER", "FANOUT_RUN_DIR")
_BATCH_LINE = re.compile(r"batch (\d+): (\d+) rows \((\d+) timeline adds")
_REPLAYED = re.compile(r"^replayed ([\d,]+) events in ([\d.]+)s")
_STARTED = time.monotonic()


def say(label: str, text: str) -> None:
    print(f"[{time.monotonic() - _STARTED:6.0f}s] {label}: {text}", flush=True)


class BenchError(RuntimeError):
    """A step of the benchmark failed; the message says which and where its log is."""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    return {**env, "PYTHONPATH": str(ROOT)}


def fanout(run: Path, *argv: str, label: str, timeout: float = 2400) -> str:
    """A ``fanout`` command on the stack in ``run``; its output. Says every 30 s it still runs."""
    log = run.parent / f"{run.name}-{argv[0]}.log"
    with log.open("w") as out:
        process = subprocess.Popen([*FANOUT, "--run-dir", str(run), *argv], cwd=ROOT,
                                   env=_env(), stdout=out, stderr=subprocess.STDOUT)
        began = time.monotonic()
        while process.poll() is None:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                if time.monotonic() - began > timeout:
                    process.kill()
                    process.wait()
                say(label, f"fanout {argv[0]} still running ({time.monotonic() - began:.0f}s)")
    text = log.read_text()
    if process.returncode != 0:
        msg = f"fanout {' '.join(argv)} failed (exit {process.returncode}); {log}:\n{text[-3000:]}"
        raise BenchError(msg)
    return text


# -- the services as process trees ---------------------------------------------------------

@dataclass
class Snapshot:
    """One scan of every process: parent links, command lines, RSS and CPU."""

    info: dict[int, dict[str, Any]]
    children: dict[int, list[int]]

    @classmethod
    def take(cls) -> Snapshot:
        info: dict[int, dict[str, Any]] = {}
        children: dict[int, list[int]] = {}
        for proc in psutil.process_iter(["ppid", "cmdline", "memory_info", "cpu_times"]):
            info[proc.pid] = proc.info
            children.setdefault(proc.info["ppid"], []).append(proc.pid)
        return cls(info, children)

    def tree(self, root: int, cut: bool = False) -> Iterator[int]:
        """``root`` and its descendants; with ``cut``, not a Spark executor's subtree."""
        todo = [root] if root in self.info else []
        while todo:
            pid = todo.pop()
            yield pid
            todo += [c for c in self.children.get(pid, [])
                     if not (cut and self._executor(c))]

    def _executor(self, pid: int) -> bool:
        return any(EXECUTOR_CLASS in part for part in self.info[pid]["cmdline"] or ())

    def rss(self, pid: int, cut: bool = False) -> int:
        return sum(m.rss for p in self.tree(pid, cut) if (m := self.info[p]["memory_info"]))

    def cpu(self, pid: int) -> float:
        return sum(t.user + t.system for p in self.tree(pid) if (t := self.info[p]["cpu_times"]))

    def executors(self, root: int) -> list[int]:
        return [p for p in self.tree(root) if p != root and self._executor(p)]


class Census:
    """RSS and CPU by service of a stack (``stack.json``'s pids), and RSS peaks over time."""

    def __init__(self, stack: Stack) -> None:
        self.pids = dict(stack.pids)
        self.peak: dict[str, int] = {}
        self.peak_total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def rss(self) -> dict[str, int]:
        """Bytes per service; a Spark worker's executors as ``<worker>/executors``."""
        snap, out = Snapshot.take(), {}
        for name, pid in self.pids.items():
            out[name] = snap.rss(pid, cut=True)
            if execs := snap.executors(pid):
                out[f"{name}/executors"] = sum(snap.rss(e) for e in execs)
        return out

    def cpu(self) -> dict[str, float]:
        snap = Snapshot.take()
        return {name: snap.cpu(pid) for name, pid in self.pids.items()}

    def __enter__(self) -> Census:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def note(self, rss: dict[str, int]) -> None:
        """Fold one sample into the peaks."""
        for name, value in rss.items():
            self.peak[name] = max(self.peak.get(name, 0), value)
        self.peak_total = max(self.peak_total, sum(rss.values()))

    def _sample(self) -> None:
        while not self._stop.wait(2.0):
            self.note(self.rss())


def kind(service: str) -> str:
    """kafka, cassandra, spark, job, api or verifier: what a service (or node) is."""
    if service == "broker" or service.startswith("kafka-"):
        return "kafka"
    if service.startswith("cassandra"):
        return "cassandra"
    return "spark" if service.startswith("spark-") else service


def by_kind(values: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in values.items():
        out[kind(name)] = out.get(kind(name), 0.0) + value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 2) for k in after}


# -- the view's position ----------------------------------------------------------------------

def applied(client: httpx.Client) -> dict[tuple[str, int], int] | None:
    """The applied offsets the API reports (``/healthz``), or None while it cannot say."""
    try:
        body = client.get("/healthz").json()
    except (httpx.HTTPError, ValueError):
        return None
    return {(topic, int(p)): offset for topic, parts in body.get("applied_offsets", {}).items()
            for p, offset in parts.items()}


def log_ends(kafka: KafkaSettings) -> dict[tuple[str, int], int]:
    ends = EndOffsets(kafka.bootstrap)
    tps = ends.topic_partitions(kafka.physical_topics())
    return {(kafka.logical(t), p): end for (t, p), end in ends.ends(tps).items()}


def wait_caught_up(client: httpx.Client, ends: dict[tuple[str, int], int], label: str,
                   timeout: float) -> float:
    """Poll until every record below ``ends`` is applied; the monotonic time it was seen."""
    total, deadline, last_said = sum(ends.values()), time.monotonic() + timeout, 0.0
    while True:
        done = applied(client) or {}
        have = sum(min(done.get(tp, -1) + 1, end) for tp, end in ends.items())
        now = time.monotonic()
        if have >= total:
            return now
        if now > deadline:
            msg = f"the view applied {have:,} of {total:,} records in {timeout:.0f}s"
            raise BenchError(msg)
        if now - last_said >= 10:
            say(label, f"view applied {have:,}/{total:,} records")
            last_said = now
        time.sleep(0.2)


def sink_lines(run: Path) -> dict[int, tuple[int, int]]:
    """Batch id → (rows, timeline adds) from the sink's lines in the job's log (last wins)."""
    log = run / "logs" / "job.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return {int(m[1]): (int(m[2]), int(m[3])) for m in _BATCH_LINE.finditer(text)}


# -- the phases -----------------------------------------------------------------------------

def replay(run: Path, history: Path, stack: Stack, census: Census, idle: dict[str, float],
           label: str) -> dict[str, Any]:
    """``fanout replay`` of the history until the view has caught up; rate, CPU, write cost."""
    cpu0, t0 = census.cpu(), time.monotonic()
    argv = [*FANOUT, "--run-dir", str(run), "replay", "--no-progress", str(history)]
    process = subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(1800, process.kill)
    watchdog.start()
    output: list[str] = []
    finished, produced = 0.0, None
    assert process.stdout is not None
    for line in process.stdout:  # the summary's line, as it comes: the last record's time
        output.append(line)
        if produced is None and (produced := _REPLAYED.match(line)):
            finished = time.monotonic()
    process.wait()
    watchdog.cancel()
    if process.returncode != 0 or produced is None:
        msg = f"fanout replay failed (exit {process.returncode}):\n{''.join(output)[-3000:]}"
        raise BenchError(msg)
    producing = float(produced[2])
    first = finished - producing
    say(label, f"replay produced {produced[1]} events in {producing}s; waiting for the view")
    kafka = KafkaSettings.from_env(stack.env())
    ends = log_ends(kafka)
    with webclient.client(base_url=stack.api_url, timeout=10) as client:
        caught = wait_caught_up(client, ends, label, timeout=3600)
    cpu = delta(census.cpu(), cpu0)
    window, events = caught - t0, sum(ends.values())
    batches = sink_lines(run)
    rows = sum(r for r, _ in batches.values())
    adds = sum(a for _, a in batches.values())
    seconds = caught - first
    out = {"events": events, "seconds": round(seconds, 2),
           "events_per_s": round(events / seconds), "producer_s": producing,
           "producer_events_per_s": round(events / max(producing, 1e-9)),
           "catch_up_after_produce_s": round(caught - finished, 2),
           "cpu_window_s": round(window, 2), "cpu_s": cpu,
           "cpu_s_by_kind": {k: round(v, 2) for k, v in by_kind(cpu).items()},
           "batches": len(batches), "rows_written": rows, "timeline_adds": adds,
           "summary": [line.strip() for line in output[output.index(produced.string):]]}
    out["cassandra"] = write_cost(cpu, idle, window, rows, adds)
    return out


def write_cost(cpu: dict[str, float], idle: dict[str, float], window: float, rows: int,
               adds: int) -> dict[str, Any]:
    """Cassandra CPU over the replay, summed over nodes, per row and per timeline add."""
    spent = sum(v for k, v in cpu.items() if kind(k) == "cassandra")
    idle_s = sum(v for k, v in idle.items() if kind(k) == "cassandra") * window
    net = spent - idle_s

    def per(value: float, n: int) -> float | None:
        return round(value / n * 1e6, 2) if n else None

    return {"cpu_s": round(spent, 2), "idle_cpu_s": round(idle_s, 2),
            "cpu_us_per_row": per(spent, rows), "cpu_us_per_row_net_of_idle": per(net, rows),
            "cpu_us_per_timeline_add": per(spent, adds),
            "cpu_us_per_timeline_add_net_of_idle": per(net, adds)}


class AppliedPoller:
    """``/healthz`` every ``interval`` on a thread: (monotonic time, tweets' applied offsets)."""

    def __init__(self, api: str, interval: float = 0.05) -> None:
        self.seen: list[tuple[float, dict[int, int]]] = []
        self._client = webclient.client(base_url=api, timeout=5)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            done = applied(self._client)
            if done is not None:
                self.seen.append((time.monotonic(),
                                  {p: o for (t, p), o in done.items() if t == "tweets"}))

    def covers(self, sent: list[tuple[float, int, int]]) -> bool:
        if not self.seen:
            return False
        last = self.seen[-1][1]
        return all(last.get(p, -1) >= offset for _, p, offset in sent)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._client.close()


def freshness(stack: Stack, args: argparse.Namespace, label: str) -> dict[str, Any]:
    """Posts at ``--rate`` for ``--seconds``, open loop; post → visible per post."""
    kafka = KafkaSettings.from_env(stack.env())
    authors = list(range(1, args.users + 1, 7))
    ids, lock = Snowflake(worker=1023), threading.Lock()
    sent: list[tuple[float, int, int]] = []  # (due, partition, offset)
    poller = AppliedPoller(stack.api_url)
    producer = ChangelogProducer(kafka, linger_ms=0)
    producer.start()
    try:
        start = time.monotonic() + 0.5
        for i in range(int(args.rate * args.seconds)):
            due = start + i / args.rate
            time.sleep(max(0.0, due - time.monotonic()))

            def done(_event: object, outcome: Position | Exception, due: float = due) -> None:
                if isinstance(outcome, Position):
                    with lock:
                        sent.append((due, outcome.partition, outcome.offset))

            tweet_id, at = ids.next()
            producer.send(Post(tweet_id, authors[i % len(authors)], at, f"fresh {i}"),
                          on_delivery=done)
            producer.poll(0)
        producer.flush(60)
        say(label, f"{len(sent)} posts acknowledged; waiting until each is visible")
        deadline = time.monotonic() + 300
        while not poller.covers(sent) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        producer.close()
        poller.close()
    lags = visible_after(sent, poller.seen)
    return {"rate": args.rate, "seconds": args.seconds, "posts": len(sent),
            "visible": len(lags), "poll_s": 0.05,
            **{f"{q}_s": round(percentile(lags, p), 3)
               for q, p in (("p50", .5), ("p90", .9), ("p99", .99), ("max", 1.0))}}


def visible_after(sent: list[tuple[float, int, int]],
                  seen: list[tuple[float, dict[int, int]]]) -> list[float]:
    """Per post: the first poll at or after its due time that shows it applied, minus due."""
    out, i = [], 0
    for due, partition, offset in sorted(sent):
        while i < len(seen) and seen[i][0] < due:
            i += 1
        j = i
        while j < len(seen) and seen[j][1].get(partition, -1) < offset:
            j += 1
        if j < len(seen):
            out.append(seen[j][0] - due)
    return out


def tokens(stack: Stack, users: int) -> list[str]:
    """Bearer tokens of users 1..users, minted with the stack's secret (valid a day)."""
    secret = ServingSettings.from_env(stack.env()).secret()
    return [mint(u, secret, 86_400) for u in range(1, users + 1)]


def first_pages(api: str, keys: list[str], n: int, seed: int) -> dict[str, Any]:
    """First pages of ``n`` distinct users, one at a time: none is in a page cache yet."""
    who = random.Random(seed).sample(range(1, len(keys) + 1), min(n, len(keys)))
    times, bad = [], 0
    with webclient.client(base_url=api, timeout=30) as client:
        for user in who:
            t0 = time.perf_counter()
            got = client.get(f"/v1/users/{user}/home", params={"limit": 20},
                             headers={"Authorization": f"Bearer {keys[user - 1]}"})
            times.append((time.perf_counter() - t0) * 1000)
            bad += got.status_code != 200
    return {"reads": len(times), "non200": bad, "p50_ms": round(percentile(times, .5), 2),
            "p99_ms": round(percentile(times, .99), 2)}


WRK_LUA = """
local tokens = {%(tokens)s}""" + WRK_THREADS_LUA + """request = function()
  local u = math.random(1, #tokens)
  return wrk.format("GET", "/v1/users/" .. u .. "/home?limit=20",
                    {["Authorization"] = "Bearer " .. tokens[u]})
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "JSON {\\"requests\\":%%d,\\"errors\\":%%d,\\"non2xx\\":%%d,"
    .. "\\"p50_us\\":%%d,\\"p99_us\\":%%d,\\"max_us\\":%%d}\\n",
    summary.requests, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def closed_loop(api: str, keys: list[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Closed-loop home reads of random users: wrk if installed, else Python threads."""
    seconds = max(1, round(args.read_seconds))
    wrk = shutil.which("wrk")
    if wrk is None:
        return threaded_loop(api, keys, args.connections, seconds, args.seed)
    script = work / "home.lua"
    script.write_text(WRK_LUA % {"tokens": ",".join(f'"{k}"' for k in keys), "seed": args.seed})
    out = subprocess.run([wrk, f"-t{args.wrk_threads}", f"-c{args.connections}",
                          f"-d{seconds}s", "-s", str(script), api], capture_output=True,
                         text=True, check=True, timeout=seconds + 120).stdout
    found = re.search(r"^JSON (\{.*\})$", out, re.M)
    if found is None:
        msg = f"no summary in wrk's output:\n{out[-2000:]}"
        raise BenchError(msg)
    raw = json.loads(found[1])
    return {"client": "wrk", "connections": args.connections, "seconds": seconds,
            "requests": raw["requests"], "errors": raw["errors"], "non2xx": raw["non2xx"],
            "requests_per_s": round(raw["requests"] / seconds),
            **{k.replace("_us", "_ms"): round(raw[k] / 1000, 2)
               for k in ("p50_us", "p99_us", "max_us")}}


def threaded_loop(api: str, keys: list[str], threads: int, seconds: float,
                  seed: int) -> dict[str, Any]:
    """The closed loop without wrk: ``threads`` clients, one connection each."""
    times: list[float] = []
    statuses: list[int] = []
    deadline = time.monotonic() + seconds

    def reader(n: int) -> None:
        draw = random.Random(seed * 1000 + n)
        with webclient.client(base_url=api, timeout=30) as client:
            while time.monotonic() < deadline:
                user = draw.randint(1, len(keys))
                t0 = time.perf_counter()
                got = client.get(f"/v1/users/{user}/home", params={"limit": 20},
                                 headers={"Authorization": f"Bearer {keys[user - 1]}"})
                times.append((time.perf_counter() - t0) * 1000)  # list.append is atomic
                statuses.append(got.status_code)

    pool = [threading.Thread(target=reader, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return {"client": "python threads", "connections": threads, "seconds": seconds,
            "requests": len(times), "non2xx": sum(s != 200 for s in statuses),
            "requests_per_s": round(len(times) / seconds),
            "p50_ms": round(percentile(times, .5), 2), "p99_ms": round(percentile(times, .99), 2),
            "max_ms": round(max(times, default=0.0), 2)}


# -- one stack ----------------------------------------------------------------------------

def up_argv(nodes: int, args: argparse.Namespace) -> list[str]:
    shape = ["--nodes", str(nodes)] if nodes > 1 else (
        ["--store", "cassandra"] + (["--cluster"] if args.one_spark == "cluster" else []))
    return ["up", *shape, "--no-verifier", "--timeout", "900"]


def one_stack(nodes: int, history: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    label, run = f"{nodes} node{'s' if nodes > 1 else ''}", work / f"run-{nodes}"
    say(label, f"fanout {' '.join(up_argv(nodes, args))} in {run}")
    began = time.monotonic()
    try:
        fanout(run, *up_argv(nodes, args), label=label)
        stack = Stack.load(run)
        assert stack is not None
        out: dict[str, Any] = {"nodes": nodes, "up_s": round(time.monotonic() - began, 1),
                               "loadavg_1m_start": round(os.getloadavg()[0], 2),
                               "stack": {"bootstrap": stack.bootstrap, "store": stack.store_url,
                                         "spark_master": stack.spark_master or "local",
                                         "services": sorted(stack.pids)}}
        say(label, f"up in {out['up_s']}s: {', '.join(sorted(stack.pids))}")
        with Census(stack) as census:
            out |= measure(run, stack, census, history, work, args, label)
            rss = census.rss()
            census.note(rss)
            out["rss_mb"] = {k: round(v / MB) for k, v in sorted(rss.items())}
            out["rss_mb_by_kind"] = {k: round(v / MB) for k, v in by_kind(
                {k: float(v) for k, v in rss.items()}).items()}
            out["rss_total_mb"] = round(sum(rss.values()) / MB)
        out["peak_rss_mb"] = {k: round(v / MB) for k, v in sorted(census.peak.items())}
        out["peak_rss_total_mb"] = round(census.peak_total / MB)
        out["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
        return out
    finally:
        say(label, "fanout down")
        try:
            fanout(run, "down", label=label, timeout=600)
        finally:
            left = sweep(run)
            if left:
                say(label, f"killed {len(left)} process(es) left after down: {left}")


def measure(run: Path, stack: Stack, census: Census, history: Path, work: Path,
            args: argparse.Namespace, label: str) -> dict[str, Any]:
    say(label, f"settling for {args.settle_seconds:g}s, then idle for {args.idle_seconds:g}s")
    time.sleep(args.settle_seconds)  # the start's own work: schema, JIT, the first batches
    cpu0 = census.cpu()
    time.sleep(args.idle_seconds)
    idle = {k: v / args.idle_seconds for k, v in delta(census.cpu(), cpu0).items()}
    out: dict[str, Any] = {"idle_cores": {k: round(v, 3) for k, v in idle.items()}}
    say(label, "fanout replay")
    out["replay"] = r = replay(run, history, stack, census, idle, label)
    say(label, f"replay: {r['events']:,} events in {r['seconds']}s = {r['events_per_s']:,} "
               f"events/s; {r['rows_written']:,} rows, Cassandra {r['cassandra']['cpu_s']} "
               f"CPU-s = {r['cassandra']['cpu_us_per_row']} µs a row")
    say(label, f"freshness: {args.rate:g} posts/s for {args.seconds:g}s")
    out["freshness"] = f = freshness(stack, args, label)
    say(label, f"post → visible p50 {f['p50_s']}s, p99 {f['p99_s']}s ({f['visible']} seen)")
    keys = tokens(stack, args.users)
    say(label, f"{args.first_reads} first pages, then {args.read_seconds:g}s closed loop")
    out["first_pages"] = first_pages(stack.api_url, keys, args.first_reads, args.seed)
    out["reads"] = c = closed_loop(stack.api_url, keys, args, work)
    say(label, f"reads: {c['requests_per_s']:,}/s, p50 {c['p50_ms']} ms, p99 {c['p99_ms']} ms")
    return out


def sweep(run: Path) -> list[int]:
    """Kill what still names the run directory after ``fanout down`` (nothing, normally)."""
    mine, killed = str(run), []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid != os.getpid() and any(mine in part for part in proc.info["cmdline"] or ()):
            try:
                proc.kill()
                killed.append(proc.pid)
            except psutil.Error:
                pass
    return killed


# -- the table -----------------------------------------------------------------------------

TABLE = (
    ("stack up, s", ("up_s",)),
    ("replay, events/s", ("replay", "events_per_s")),
    ("replay, producer alone, events/s", ("replay", "producer_events_per_s")),
    ("post → visible p50, s", ("freshness", "p50_s")),
    ("post → visible p99, s", ("freshness", "p99_s")),
    ("first page p50, ms", ("first_pages", "p50_ms")),
    ("first page p99, ms", ("first_pages", "p99_ms")),
    ("home reads/s, closed loop", ("reads", "requests_per_s")),
    ("home read p50, ms", ("reads", "p50_ms")),
    ("home read p99, ms", ("reads", "p99_ms")),
    ("rows written in the replay", ("replay", "rows_written")),
    ("Cassandra CPU-s in the replay", ("replay", "cassandra", "cpu_s")),
    ("Cassandra µs a row", ("replay", "cassandra", "cpu_us_per_row")),
    ("Cassandra µs a row, net of idle", ("replay", "cassandra", "cpu_us_per_row_net_of_idle")),
    ("Cassandra µs a timeline add", ("replay", "cassandra", "cpu_us_per_timeline_add")),
    ("RSS in all, MB", ("rss_total_mb",)),
    ("peak RSS in all, MB", ("peak_rss_total_mb",)),
    *((f"RSS {k}, MB", ("rss_mb_by_kind", k)) for k in ("kafka", "cassandra", "spark", "job", "api")),
)


def pick(result: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = result
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) else None


def table(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Print the figures side by side with 3/1 ratios; return the ratios."""
    one, three = results.get("1", {}), results.get("3", {})
    ratios = {}
    print(f"\n{'':<38} {'1 node':>12} {'3 nodes':>12} {'3 / 1':>8}")
    for name, path in TABLE:
        a, b = pick(one, path), pick(three, path)
        ratio = round(b / a, 3) if a and b is not None else None
        if ratio is not None:
            ratios[".".join(path)] = ratio
        print(f"{name:<38} {_cell(a):>12} {_cell(b):>12} "
              f"{'' if ratio is None else f'{ratio:.2f}x':>8}")
    for n, result in results.items():
        print(f"RSS by service, {n} node(s), MB: {result.get('rss_mb')}")
    return ratios


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.3g}" if isinstance(value, float) and value < 1000 else f"{value:,.0f}"


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="nodes", users=2000, follows=30_000,
                         posts=20_000)
    ap.add_argument("--rate", type=float, default=200.0, help="freshness: posts per second")
    ap.add_argument("--seconds", type=float, default=30.0, help="freshness: seconds of posts")
    ap.add_argument("--first-reads", type=int, default=200, help="first pages, one at a time")
    ap.add_argument("--read-seconds", type=float, default=20.0, help="closed loop of reads")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--wrk-threads", type=int, default=2)
    ap.add_argument("--settle-seconds", type=float, default=30.0,
                    help="wait after up before the idle CPU is measured")
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--nodes", default="1,3", help="stacks to run, in order")
    ap.add_argument("--one-spark", choices=("cluster", "local"), default="cluster",
                    help="the 1-node stack's Spark: a standalone master and worker, or local[2]")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    result: dict[str, Any] = {"args": vars(args), "cores": os.cpu_count()}
    with scratch("fanout-bench-nodes-") as work:
        history = work / "history"
        say("history", f"fanout generate --users {args.users} --follows {args.follows} "
                       f"--tweets {args.posts}")
        made = fanout(work / "gen", "generate", "--users", str(args.users), "--follows",
                      str(args.follows), "--tweets", str(args.posts), "--seed", str(args.seed),
                      "--out", str(history), label="history")
        result["history"] = made.strip().splitlines()[-1]
        runs: dict[str, dict[str, Any]] = {}
        for n in (int(x) for x in args.nodes.split(",")):
            try:
                runs[str(n)] = one_stack(n, history, work, args)
            except BenchError as exc:  # keep the other stack's figures; say what failed
                say(f"{n} node(s)", f"FAILED: {exc}")
                runs[str(n)] = {"nodes": n, "error": str(exc)[-3000:]}
    result |= runs
    result["ratios_3_over_1"] = table(runs)
    print(f"written to {save(args.name, result)}")
    return 1 if any("error" in r for r in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
