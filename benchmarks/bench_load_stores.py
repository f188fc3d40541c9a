"""Home-read latency over HTTP, SQLite stack vs Cassandra stack, at one open-loop rate.

    .venv/bin/python benchmarks/bench_load_stores.py
    .venv/bin/python benchmarks/bench_load_stores.py --rate 50 --duration 60 --order cassandra,sqlite

Runs ``fanout load --start --store S`` once per store, one after the other, with the
same flags: each starts its own stack (``fanout up --store S``: Kafka, the view job,
the API, and for Cassandra a local node), fills it with the same synthetic history,
drives the same open-loop Locust run (latency from the intended send time, in
HdrHistograms), and stops the stack. The figures are taken from each run's
``summary.json``: all reads and first home pages (p50/p99/p99.9), errors, and the
fan-out probe's post → visible latency; for Cassandra, what its node logged (bytes,
warnings, batch size warnings). The load average is recorded before and after
each run; compare the two stores as ratios from one invocation. Results go to
``benchmarks/results/load-stores.json``; the full reports stay in the work directory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import ROOT, argument_parser, save

sys.path.insert(0, str(ROOT))


def _command(store: str, work: Path, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "infra.cli", "--run-dir", str(work / store), "load", "--start",
            "--store", store, "--rate", f"{args.rate:g}", "--duration", f"{args.duration:g}",
            "--warmup", f"{args.warmup:g}", "--users", str(args.users),
            "--profile", args.profile, "--name", store, "--reports", str(work / "reports"),
            "--history-users", str(args.history_users),
            "--history-follows", str(args.history_follows),
            "--history-tweets", str(args.history_tweets), "--seed", str(args.seed)]


def _figures(summary: dict[str, Any]) -> dict[str, Any]:
    mode = summary["modes"]["fanout"]
    home = mode["endpoints"].get("GET home", {})
    keys = ("count", "errors", "rps", "p50", "p99", "p99.9", "max")
    out = {"reads": {k: mode["reads"].get(k) for k in keys},
           "home": {k: home.get(k) for k in keys},
           "writes": {k: mode["writes"].get(k) for k in keys} if "writes" in mode else None,
           "problems": mode["problems"], "store": summary["run"]["store"]}
    probe = mode.get("fanout_latency")
    if probe:
        out["fanout_latency"] = {c: {k: probe[c].get(k) for k in ("count", "p50", "p99")}
                                 for c in probe if isinstance(probe[c], dict)}
    return out


def _run(store: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    log = work / f"{store}.log"
    load0, began = os.getloadavg(), time.monotonic()
    with log.open("wb") as out:
        code = subprocess.run(_command(store, work, args), stdout=out, stderr=subprocess.STDOUT,
                              cwd=ROOT, timeout=args.timeout, check=False).returncode
    result: dict[str, Any] = {"exit": code, "wall_s": round(time.monotonic() - began, 1),
                              "loadavg_1m": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
                              "log": str(log)}
    summary = work / "reports" / store / "summary.json"
    if summary.exists():
        result |= _figures(json.loads(summary.read_text()))
    node_log = work / store / "load" / "logs" / "cassandra.log"
    if node_log.exists():
        result["node_log"] = _node_log(node_log)
    return result


def _node_log(path: Path) -> dict[str, int]:
    """What the Cassandra node logged in the run: bytes, warnings, and of those the
    batch size warnings, which the node logs for each batch past 5 KiB."""
    lines = path.read_text(errors="replace").splitlines()
    warnings = [line for line in lines if line.startswith("WARN")]
    return {"bytes": path.stat().st_size, "warnings": len(warnings),
            "batch_size_warnings": sum("BatchStatement - Batch for" in w for w in warnings)}


def main() -> int:
    parser = argument_parser(__doc__.split("\n\n")[0], name="load-stores")
    parser.add_argument("--rate", type=float, default=50.0, help="open loop: actions/s")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--users", type=int, default=32, help="Locust users (concurrency)")
    parser.add_argument("--profile", default="read-heavy")
    parser.add_argument("--history-users", type=int, default=1000)
    parser.add_argument("--history-follows", type=int, default=10_000)
    parser.add_argument("--history-tweets", type=int, default=5_000)
    parser.add_argument("--order", default="sqlite,cassandra")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0, help="per store, seconds")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fanout-bench-load-"))
    result: dict[str, Any] = {"args": vars(args), "cores": os.cpu_count(), "work": str(work)}
    for store in args.order.split(","):
        print(f"fanout load --start --store {store} ...", file=sys.stderr, flush=True)
        result[store] = _run(store, work, args)
        print(f"  {store}: {json.dumps(result[store])}", file=sys.stderr, flush=True)
    stores = args.order.split(",")
    if all(result[s].get("home", {}).get("p50") for s in stores) and len(stores) == 2:
        a, b = (result[s]["home"] for s in stores)
        result[f"home_ratio_{stores[1]}_over_{stores[0]}"] = {
            p: round(b[p] / a[p], 2) for p in ("p50", "p99") if a.get(p) and b.get(p)}
    print(save(args.name, result))
    return 0 if all(result[s]["exit"] == 0 for s in stores) else 1


if __name__ == "__main__":
    sys.exit(main())
