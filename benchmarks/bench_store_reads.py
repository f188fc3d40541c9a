"""Home reads on a running stack, SQLite against Cassandra, before and after, in one run.

    apt-get install -y wrk
    .venv/bin/python benchmarks/bench_store_reads.py [--before REV] [--stores sqlite,cassandra]

For each store, ``fanout up --store STORE`` in a scratch run directory, a generated
history (``fanout generate --users 2000 --follows 30000 --tweets 20000``, the default
social mix) replayed with ``fanout replay``; once the view has caught up, ``fanout
verify`` checks every user's full timeline (its users/s, the whole command's, is the
verify rate). With the job idle, an API (``python -m serving``, ``--workers``
processes, auth off) of this tree and one of ``--before`` (``git archive``) are
started in turn on the same store, and each is measured:

- closed loop: wrk, ``GET /v1/users/{random 1..users}/home?limit=20``, ``--wrk-threads``
  threads, ``--connections`` connections, ``--seconds`` (after ``--warmup``-second wrk
  rounds, each asking for other users, until the rate stops rising: the page caches
  as after a while of serving with the job idle);
  reads/s, p50/p99, and reads per CPU-second of the API processes and of the
  Cassandra node;
- the 200-entry page: ``--deep`` reads of distinct users, one at a time (first
  reads: not in any page cache), p50/p99;
- open loop at half the closed loop's rate (``openloop.c``: each request timed from
  its intended send time), p50/p99.

Then this tree's API again with its page cache off (every read assembled, hydrated
and serialized: what a read costs while writes invalidate pages), closed loop.
Last, with writes: ``fanout load --rate R`` (the load mix, writes included) against
one API process of this tree, and its page cache's hit rate from ``/metrics``. The
results go to ``benchmarks/results/store_reads.json`` (``--name``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from bench_http import Server, checkout, open_loop, warm_up, wrk
from harness import ROOT, argument_parser, save
from pipeline import percentile, scratch

from infra import webclient

sys.path.insert(0, str(ROOT))

from infra.load.run import cpu_of  # noqa: E402
from infra.services.broker import free_port  # noqa: E402
from infra.stack.stack import Stack  # noqa: E402

HOST = "127.0.0.1"
FANOUT = [sys.executable, "-m", "infra.cli"]


def fanout(run: Path, *argv: str, root: Path = ROOT, timeout: float = 1800) -> str:
    """A ``fanout`` command of the tree at ``root`` on the stack in ``run``; its output."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([*FANOUT, "--run-dir", str(run), *argv], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"fanout {' '.join(argv)} failed:\n{done.stdout[-2000:]}"
                         f"\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def api(url: str, workers: int, work: Path, root: Path = ROOT, cache_mb: int = 256) -> Server:
    """``python -m serving`` of the tree at ``root`` on ``url``, auth and access log off."""
    port = free_port(HOST)
    env = {**os.environ, "FANOUT_STORE": url, "FANOUT_AUTH": "off", "FANOUT_API_HOST": HOST,
           "FANOUT_API_PORT": str(port), "FANOUT_API_ACCESS_LOG": "false",
           "FANOUT_API_WORKERS": str(workers), "FANOUT_API_PAGE_CACHE_MB": str(cache_mb),
           "PYTHONPATH": str(root)}
    return Server([sys.executable, "-m", "serving"], env, port, work / f"api-{port}.log",
                  cwd=root)


def cassandra_node() -> psutil.Process | None:
    """The local Cassandra JVM, if one runs (its CPU is counted beside the API's)."""
    for proc in psutil.process_iter(["cmdline"]):
        if any("CassandraDaemon" in part for part in proc.info["cmdline"] or ()):
            return proc
    return None


def deep_pages(port: int, users: int, n: int, seed: int) -> dict[str, Any]:
    """``n`` first reads of distinct users' 200-entry pages, one at a time."""
    who = random.Random(seed).sample(range(1, users + 1), min(n, users))
    times, entries = [], []
    with webclient.client(base_url=f"http://{HOST}:{port}", timeout=30) as client:
        for user in who:
            t0 = time.perf_counter()
            got = client.get(f"/v1/users/{user}/home", params={"limit": 200})
            times.append((time.perf_counter() - t0) * 1000)
            if got.status_code == 200:
                entries.append(len(got.json()["entries"]))
    return {"reads": len(times), "p50_ms": round(percentile(times, .5), 2),
            "p99_ms": round(percentile(times, .99), 2),
            "mean_entries": round(sum(entries) / max(1, len(entries)), 1)}


def measure_api(server: Server, node: psutil.Process | None, args: argparse.Namespace,
                work: Path) -> dict[str, Any]:
    """Warm-up rounds, closed loop with CPU split, the deep pages, open loop at half."""
    warm_up(server, args.connections, args, work, seconds=args.warmup, rounds=15, least=3)
    closed = closed_loop(server, node, args, work, args.seed + 1)
    assert server.process is not None
    deep = deep_pages(server.port, args.users, args.deep, args.seed + 2)
    half = open_loop(server, max(1.0, closed["requests_per_s"] / 2), args)
    return {"closed": closed, "page_200": deep, "open_half": half}


def uncached(url: str, node: psutil.Process | None, args: argparse.Namespace,
             work: Path) -> dict[str, Any]:
    """Closed loop with the page cache off: every read assembled, hydrated, serialized."""
    with api(url, args.workers, work, cache_mb=0) as server:
        wrk(server, args.connections, args.warmup, args, work)
        return closed_loop(server, node, args, work, args.seed + 3)


def closed_loop(server: Server, node: psutil.Process | None, args: argparse.Namespace,
                work: Path, seed: int) -> dict[str, Any]:
    """One measured wrk run, the Cassandra node's CPU beside the API's."""
    node_cpu = cpu_of([node]) if node else 0.0
    closed = wrk(server, args.connections, args.seconds, args, work, seed=seed)
    if node is not None:
        spent = cpu_of([node]) - node_cpu
        closed["cassandra_cpu_s"] = round(spent, 2)
        closed["requests_per_cassandra_cpu_s"] = round(closed["requests"] / max(spent, 1e-9))
    return closed


def hit_rate(run: Path, url: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``fanout load`` with writes against one API process; its page cache's hit rate."""
    with api(url, 1, work) as server:
        target = f"http://{HOST}:{server.port}"
        out = fanout(run, "load", "--target", target, "--rate", str(args.load_rate),
                     "--duration", str(args.load_seconds), "--warmup", "5",
                     "--name", f"store-reads-{int(time.time())}", "--reports", str(work))
        metrics = webclient.get(f"{target}/metrics", timeout=10).text
    counts = {o: sum(float(v) for v in re.findall(
        rf'^fanout_page_cache_reads_total{{[^}}]*outcome="{o}"[^}}]*}} ([0-9.e+]+)$',
        metrics, re.M)) for o in ("hit", "miss")}
    total = counts["hit"] + counts["miss"]
    return {"rate": args.load_rate, "seconds": args.load_seconds, **counts,
            "hit_rate": round(counts["hit"] / total, 3) if total else None,
            "load_summary": out.strip().splitlines()[-12:]}


def caught_up(run: Path) -> None:
    """Wait until the view has applied the whole log (a one-user verify that waits)."""
    fanout(run, "verify", "--wait", "900", "--sample", "1")


def verify_rate(run: Path, root: Path = ROOT, sample: int | None = None) -> dict[str, Any]:
    """``fanout verify`` of a caught-up view: users checked per second."""
    argv = ["verify"] + (["--sample", str(sample)] if sample else [])
    out = fanout(run, *argv, root=root)
    found = re.search(r"verify: (\d+) users checked, (\d+) divergent .*?([\d.]+)s\)", out)
    if found is None:
        raise SystemExit(f"no verify summary in:\n{out[-2000:]}")
    users, divergent, seconds = int(found[1]), int(found[2]), float(found[3])
    return {"users": users, "divergent": divergent, "seconds": seconds,
            "users_per_s": round(users / max(seconds, 1e-9), 1)}


def one_store(store: str, history: Path, before: Path | None, args: argparse.Namespace,
              work: Path) -> dict[str, Any]:
    run = work / f"run-{store}"
    print(f"[{store}] fanout up", flush=True)
    fanout(run, "up", "--store", store, "--timeout", "600")
    try:
        fanout(run, "replay", "--no-progress", str(history))
        caught_up(run)
        out: dict[str, Any] = {}
        if not args.no_verify:
            out["verify"] = verify_rate(run)
            print(f"[{store}] verify: {out['verify']}", flush=True)
        if before is not None and not args.no_verify:
            out["verify_before"] = verify_rate(run, before, args.verify_before_sample)
            print(f"[{store}] verify before: {out['verify_before']}", flush=True)
        stack = Stack.load(run)
        assert stack is not None
        url = stack.env()["FANOUT_STORE"]
        node = cassandra_node() if store == "cassandra" else None
        for label, root in (("after", ROOT), ("before", before)):
            if root is None:
                continue
            with api(url, args.workers, work, root) as server:
                out[label] = measure_api(server, node, args, work)
            print(f"[{store}] {label}: {json.dumps(out[label])}", flush=True)
        out["uncached"] = uncached(url, node, args, work)
        print(f"[{store}] page cache off: {json.dumps(out['uncached'])}", flush=True)
        out["with_writes"] = hit_rate(run, url, args, work)
        print(f"[{store}] with writes: {out['with_writes']['hit_rate']}", flush=True)
        return out
    finally:
        fanout(run, "down")


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="store_reads", users=2000, follows=30_000,
                         tweets=20_000)
    ap.add_argument("--stores", default="sqlite,cassandra")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--wrk-threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=4.0, help="seconds per warm-up round")
    ap.add_argument("--deep", type=int, default=60, help="200-entry pages read")
    ap.add_argument("--open-client", choices=("c", "python"), default="c")
    ap.add_argument("--open-processes", type=int, default=2)
    ap.add_argument("--open-connections", type=int, default=32)
    ap.add_argument("--load-rate", type=float, default=200.0)
    ap.add_argument("--load-seconds", type=float, default=30.0)
    ap.add_argument("--verify-before-sample", type=int, default=60,
                    help="users the before's verify checks (it is slow on Cassandra)")
    ap.add_argument("--before", default="", metavar="REV")
    ap.add_argument("--no-verify", action="store_true", help="skip the verify rates")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    result: dict[str, Any] = {"args": vars(args), "cores": os.cpu_count()}
    with scratch("fanout-store-reads-") as work:
        history = work / "history"
        fanout(work / "gen", "generate", "--users", str(args.users), "--follows",
               str(args.follows), "--tweets", str(args.tweets), "--out", str(history))
        before = checkout(args.before, work) if args.before else None
        for store in args.stores.split(","):
            result[store] = one_store(store, history, before, args, work)
    print(f"results: {save(args.name, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
