"""Cassandra writes and reads per Cassandra CPU-second, through the project's own statements.

    .venv/bin/python benchmarks/bench_cassandra.py                 # 3 phases x 60 s
    .venv/bin/python benchmarks/bench_cassandra.py --seconds 30 --clients 1

Starts a local Cassandra 5.0 node (:class:`infra.services.cassandra.LocalCassandra`) unless
``FANOUT_CASSANDRA_HOSTS`` names one, makes a fresh keyspace with the schema (RF 1),
then runs three phases, each with ``--clients`` client *processes* (this script with
``--client``), so that the node and the load generator are separate processes:

- ``sink``: what a user-stage and a tweet-stage task of the executor sink do
  (:class:`views.stores.cassandra.tasks.TaskWriter`: ``begin``, ``write_tweets``,
  ``write_users``) on synthetic micro-batches of posts fanned out to followers: the
  tweet rows, the ``timeline_meta`` reads and writes, the timeline adds;
- ``adds``: timeline adds alone, as the sink writes them (``cql.add_ops``, a
  ``home_chunks`` row a user a batch, through the writer's bounded requests);
- ``reads``: the API's home read: :func:`serving.timeline.home_page` (limit 20) and
  :func:`serving.render.hydrated` on a :class:`~views.stores.cassandra.CassandraStore`,
  from ``--threads`` threads per client as the API's threadpool runs them.

Each client counts the statements it ran, by name, and its own CPU time in its
measured window (after ``--warmup`` seconds). The node's CPU is ``utime + stime`` of
its JVM from ``/proc/<pid>/stat`` over the same window, so the figures are operations
per Cassandra CPU-second (per core used), which holds better than wall-clock rates on
a shared machine. Statements per client CPU-second is the driver's cost. The load
average and the machine's busy cores are recorded per phase. Results go to
``benchmarks/results/cassandra.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from harness import ROOT, argument_parser, cpu_seconds, save
from pipeline import percentile, scratch

sys.path.insert(0, str(ROOT))

from views.stores.base import ProfileRow, TweetRow, WritePlan  # noqa: E402
from views.stores.cassandra import rows as rows_mod  # noqa: E402
from views.stores.cassandra import statements as cql  # noqa: E402
from views.stores.cassandra.config import parse_url  # noqa: E402
from views.stores.cassandra.schema import apply_at  # noqa: E402
from views.stores.cassandra.store import CassandraStore  # noqa: E402
from views.stores.cassandra.tasks import TaskWriter  # noqa: E402

PHASES = ("sink", "adds", "reads")
#: Statements that write (everything else the store prepares is a SELECT).
WRITES = frozenset(n for n, text in cql.STATEMENTS.items()
                   if not text.lstrip().upper().startswith("SELECT"))
#: Reader threads announce their windows on one stdout: one whole line at a time.
_PRINT = threading.Lock()
#: created_at bases: the pure adds sort below the sink's posts, so first pages are
#: the sink's rows, whose tweets and authors exist (hydration reads find them).
_SINK_BASE, _ADDS_BASE = 1_700_000_000_000, 1_000_000_000_000


# -- the client processes ----------------------------------------------------------------
class _Counted:
    """Counts statements by name around a store's ``_run`` and ``_rows``."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def add(self, names: list[str]) -> None:
        with self.lock:
            self.counts.update(names)


class _Counting:
    """Counts the statements a store runs, by name (mixed in before the store class)."""

    counted: _Counted

    def _run(self, ops: list[cql.Op], profile: object = None) -> list[rows_mod.Rows]:
        self.counted.add([name for name, _ in ops])
        run = super()._run  # type: ignore[misc]
        return run(ops) if profile is None else run(ops, profile)

    def _rows(self, name: str, params: tuple[Any, ...] = (), **kw: Any) -> rows_mod.Rows:
        self.counted.add([name])
        return super()._rows(name, params, **kw)  # type: ignore[misc]


class _Written(_Counting, CassandraStore):
    counted = _Counted()


class _Reader(_Counting, CassandraStore):
    counted = _Counted()


def _plan(rng: random.Random, args: argparse.Namespace, next_id: list[int], base: int,
          with_tweets: bool) -> WritePlan:
    """One micro-batch: ``--batch-tweets`` posts, each to ``--fanout`` random followers."""
    plan = WritePlan()
    for _ in range(args.batch_tweets):
        next_id[0] += 1
        tweet, author = next_id[0], rng.randint(1, args.users)
        created = base + tweet
        if with_tweets:
            plan.tweets[tweet] = TweetRow(tweet, author, created, f"tweet {tweet} " + "x" * 80,
                                          False)
        plan.adds += [(u, created, tweet, author)
                      for u in rng.sample(range(1, args.users + 1), args.fanout)]
    return plan


def _profiles(args: argparse.Namespace) -> WritePlan:
    return WritePlan(users={u: ProfileRow(u, f"u{u}", f"User {u}", 1)
                            for u in range(1, args.users + 1)})


def _client(args: argparse.Namespace) -> int:
    """One load process: warm up, say ``start``, measure, print the result as JSON."""
    rng = random.Random(args.seed * 1000 + args.index)
    config = parse_url(args.url)
    if args.client == "reads":
        reader = _Reader(config)
        reader.open()
        out = _reads(reader, rng, args)()
        reader.close()
    else:
        store = _Written.for_tasks(config)
        store.open()
        out = _writes(TaskWriter(store), rng, args)()
        store.close()
    print(json.dumps({"event": "result", **out}), flush=True)
    return 0


def _window(step: Any, args: argparse.Namespace, counted: _Counted) -> dict[str, Any]:
    """Run ``step`` (returns units of work done) for warmup, then for the measured window."""
    deadline = time.monotonic() + args.warmup
    while time.monotonic() < deadline:
        step()
    with _PRINT:
        print(json.dumps({"event": "start"}), flush=True)  # one per reader thread
    with counted.lock:
        counted.counts.clear()
    cpu0, t0, units = _self_cpu(), time.monotonic(), 0
    deadline = t0 + args.seconds
    while time.monotonic() < deadline:
        units += step()
    wall, cpu = time.monotonic() - t0, _self_cpu() - cpu0
    with counted.lock:
        counts = dict(counted.counts)
    return {"wall_s": wall, "client_cpu_s": cpu, "units": units, "statements": counts}


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _writes(writer: TaskWriter, rng: random.Random, args: argparse.Namespace) -> Any:
    next_id = [(args.index + 1) * 10**12 + args.seed * 10**10]
    batch = [args.index * 10**6 + args.seed * 10**8]
    if args.client == "sink" and args.index == 0:
        writer.write_users(_profiles(args), writer.begin(batch[0], "profiles"))

    def sink_step() -> int:
        batch[0] += 1
        plan = _plan(rng, args, next_id, _SINK_BASE, with_tweets=True)
        ts = writer.begin(batch[0], uuid.uuid4().hex)
        writer.write_tweets(plan, ts)
        return writer.write_users(plan, ts).adds

    def adds_step() -> int:
        batch[0] += 1
        plan = _plan(rng, args, next_id, _ADDS_BASE, with_tweets=False)
        ts = writer.begin(batch[0], uuid.uuid4().hex)
        writer.store._run(cql.add_ops(np.array(list(plan.adds)), ts + cql.ADD, {}))
        return len(plan.adds)

    step = sink_step if args.client == "sink" else adds_step
    return lambda: _window(step, args, _Written.counted)


def _reads(store: _Reader, rng: random.Random, args: argparse.Namespace) -> Any:
    from serving.render import hydrated
    from serving.timeline import home_page

    latencies: list[float] = []
    lock = threading.Lock()

    def one() -> int:
        user = rng.randint(1, args.users)
        began = time.perf_counter()
        page = home_page(store, user, None, 20)
        hydrated(store, page.entries)
        with lock:
            latencies.append(time.perf_counter() - began)
        return 1

    def threaded() -> dict[str, Any]:
        results: list[dict[str, Any]] = []
        threads = [threading.Thread(target=lambda: results.append(
            _window(one, args, store.counted))) for _ in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Every thread shares one counter: take the first thread's window as the client's.
        first = results[0]
        first["units"] = sum(r["units"] for r in results)
        ms = sorted(x * 1000 for x in latencies)
        first["page_ms"] = {"p50": round(percentile(ms, 0.5), 2),
                            "p99": round(percentile(ms, 0.99), 2)}
        return first

    return threaded


# -- the coordinator ------------------------------------------------------------------------
def _busy_cores() -> tuple[float, float]:
    """(busy jiffies, all jiffies) of the machine so far, from /proc/stat."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + parts[4]
    return float(sum(parts) - idle), float(sum(parts))


def _phase(phase: str, url: str, pid: int, idle: float,
           args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--client", phase, "--url", url,
           "--seconds", str(args.seconds), "--warmup", str(args.warmup),
           "--users", str(args.users), "--fanout", str(args.fanout),
           "--batch-tweets", str(args.batch_tweets), "--threads", str(args.threads),
           "--seed", str(args.seed)]
    procs = [subprocess.Popen([*cmd, "--index", str(i)], stdout=subprocess.PIPE, text=True)
             for i in range(args.clients)]
    deadline = time.monotonic() + args.warmup + args.seconds + 300
    for p in procs:
        _expect(p, "start", deadline)
    cpu0, t0, busy0, load0 = cpu_seconds(pid), time.monotonic(), _busy_cores(), os.getloadavg()
    results = [_expect(p, "result", deadline) for p in procs]
    cpu, wall, busy1 = cpu_seconds(pid) - cpu0, time.monotonic() - t0, _busy_cores()
    for p in procs:
        p.wait(60)
    out = _figures(phase, results, cpu, wall, (busy0, busy1), (load0, os.getloadavg()))
    net = max(cpu / wall - idle, 1e-6)
    for what in ("writes", "reads", "statements"):
        out[f"{what}_per_cassandra_cpu_s_net_of_idle"] = round(out[f"{what}_per_s"] / net)
    return out


def _expect(proc: subprocess.Popen[str], event: str, deadline: float) -> dict[str, Any]:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            msg = f"client pid {proc.pid} exited (code {proc.wait()}) before {event!r}"
            raise RuntimeError(msg)
        try:
            found = json.loads(line) if line.startswith("{") else {}
        except ValueError:
            continue  # not one of ours
        if isinstance(found, dict) and found.get("event") == event:
            return found
    proc.kill()
    msg = f"client pid {proc.pid}: no {event!r} before the deadline"
    raise TimeoutError(msg)


def _figures(phase: str, results: list[dict[str, Any]], cpu: float, wall: float,
             busy: tuple[tuple[float, float], tuple[float, float]],
             loads: tuple[tuple[float, ...], tuple[float, ...]]) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    for r in results:
        counts.update(r["statements"])
    rate = sum(sum(r["statements"].values()) / r["wall_s"] for r in results)
    writes = sum(n for name, n in counts.items() if name in WRITES)
    total = sum(counts.values())
    write_rate, read_rate = rate * writes / total, rate * (total - writes) / total
    units = sum(r["units"] / r["wall_s"] for r in results)
    client_cpu = sum(r["client_cpu_s"] / r["wall_s"] for r in results)
    node_cores = cpu / wall
    (b0, a0), (b1, a1) = busy
    out = {
        "statements": dict(sorted(counts.items())),
        "statements_per_s": round(rate), "writes_per_s": round(write_rate),
        "reads_per_s": round(read_rate), "units_per_s": round(units, 1),
        "cassandra_cpu_cores": round(node_cores, 3),
        "statements_per_cassandra_cpu_s": round(rate / node_cores),
        "writes_per_cassandra_cpu_s": round(write_rate / node_cores),
        "reads_per_cassandra_cpu_s": round(read_rate / node_cores),
        "units_per_cassandra_cpu_s": round(units / node_cores, 1),
        "statements_per_unit": round(total / sum(r["units"] for r in results), 3),
        "client_cpu_cores": round(client_cpu, 3),
        "statements_per_client_cpu_s": round(rate / client_cpu),
        "machine_busy_cores": round((b1 - b0) / max(a1 - a0, 1.0) * (os.cpu_count() or 1), 2),
        "loadavg_1m": [round(loads[0][0], 2), round(loads[1][0], 2)],
        "window_s": round(wall, 1), "clients": len(results),
    }
    if phase == "reads":
        out["unit"] = "home page (limit 20) + hydration"
        out["page_ms_per_client"] = [r["page_ms"] for r in results]
    else:
        out["unit"] = "timeline row added"
    return out


def _idle(pid: int, seconds: float) -> float:
    """The node's own CPU with no client (gossip, compaction, JIT): cores, over ``seconds``."""
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return round((cpu_seconds(pid) - cpu0) / (time.monotonic() - t0), 3)


def _keyspace(hosts: str) -> str:
    url = f"cassandra://{hosts}/bench_{uuid.uuid4().hex[:10]}"
    apply_at(url)
    return url


def main() -> int:
    parser = argument_parser(__doc__.split("\n\n")[0], name="cassandra", users=2000)
    parser.add_argument("--seconds", type=float, default=60.0, help="measured s per phase")
    parser.add_argument("--warmup", type=float, default=20.0, help="unmeasured s per phase")
    parser.add_argument("--idle-seconds", type=float, default=15.0,
                        help="the node's idle CPU is measured this long before the phases")
    parser.add_argument("--clients", type=int, default=2, help="client processes per phase")
    parser.add_argument("--threads", type=int, default=8, help="reader threads per client")
    parser.add_argument("--fanout", type=int, default=20, help="followers per post")
    parser.add_argument("--batch-tweets", type=int, default=100, help="posts per batch")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--heap-mb", type=int, default=768)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--client", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        return _client(args)
    result: dict[str, Any] = {"args": vars(args), "cores": os.cpu_count()}
    with ExitStack() as stack:
        hosts = os.environ.get("FANOUT_CASSANDRA_HOSTS")
        if hosts:
            msg = "set no FANOUT_CASSANDRA_HOSTS: the node's JVM must be local to read its CPU"
            raise SystemExit(msg)
        from infra.services.cassandra import LocalCassandra

        work = stack.enter_context(scratch("fanout-bench-cassandra-"))  # removed after the node
        node = stack.enter_context(LocalCassandra(work / "cassandra", heap_mb=args.heap_mb))
        result["node"] = {"started_in_s": round(node.started_in or 0, 1),
                          "heap_mb": args.heap_mb, "version": "5.0 (infra.services.jars pin)"}
        url = _keyspace(node.hosts)
        result["node"]["idle_cpu_cores"] = _idle(node.pid, args.idle_seconds)
        for phase in args.phases.split(","):
            print(f"phase {phase}: {args.clients} client(s), {args.warmup:g}+{args.seconds:g}s",
                  file=sys.stderr, flush=True)
            result[phase] = _phase(phase, url, node.pid, result["node"]["idle_cpu_cores"], args)
            print(f"  {phase}: {json.dumps(result[phase])}", file=sys.stderr, flush=True)
        result["node"]["rss_mb"] = round(node.rss_bytes() / 2**20)
    print(save(args.name, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
