"""The hybrid's point as a curve: home-read p99 of both read modes against the rate.

    .venv/bin/python benchmarks/bench_compare.py
    .venv/bin/python benchmarks/bench_compare.py --rates 100,200,300,400 --history-follows 300000

Starts one stack with ``fanout load --start --keep`` (Kafka, the view job, the API
and an SQLite store, filled with one synthetic history: by default 3,000 users with
50 followees each), then runs ``fanout load --compare`` against it once per rate,
lowest first: the same open-loop load (read-heavy by default, fan-out probe on, so
the view job works as it does under real use) on fan-out on write and on fan-out on
read in turn. The stack is stopped at the end, whatever happened.

Per rate it takes, from each run's ``summary.json``, the first home page's p50, p99
and p99.9 per mode, the API's cores and the load generator's, and the p99 ratio
(read over write) from that one run, and the fan-out probe's post → visible latency
(the view job's freshness while it serves the load). It prints the table and plots
p99 against the rate (``compare-sweep.png``). Results go to ``benchmarks/results/compare-sweep.json``;
the full reports stay in the work directory.
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

from harness import RESULTS, ROOT, argument_parser, save

sys.path.insert(0, str(ROOT))

from infra.load.prep import STARTED  # noqa: E402

MODES = ("fanout", "read")


def _fanout(*argv: str) -> list[str]:
    return [sys.executable, "-m", "infra.cli", *argv]


def _load(work: Path, rate: float, first: bool, args: argparse.Namespace) -> list[str]:
    common = ["load", "--compare", "--rate", f"{rate:g}", "--duration", f"{args.duration:g}",
              "--warmup", f"{args.warmup:g}", "--users", str(args.users),
              "--profile", args.profile, "--seed", str(args.seed),
              "--name", f"rate-{rate:g}", "--reports", str(work / "reports")]
    if not first:  # the stack --start --keep left in <run-dir>/load
        return _fanout("--run-dir", str(work / STARTED), *common)
    return _fanout("--run-dir", str(work), *common, "--start", "--keep",
                   "--history-users", str(args.history_users),
                   "--history-follows", str(args.history_follows),
                   "--history-tweets", str(args.history_tweets),
                   "--celebrity-threshold", str(args.celebrity_threshold))


def _figures(summary: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        row = next(r for r in summary["compare"] if r["mode"] == mode)
        figures = summary["modes"][mode]
        out[mode] = {k: row.get(k) for k in ("reads", "read_errors", "home p50", "home p99",
                                             "home p99.9", "read p99", "api cores")}
        out[mode]["client cores"] = (figures.get("client") or {}).get("cores")
        out[mode]["problems"] = figures["problems"]
        probe = figures.get("fanout_latency") or {}
        out[mode]["post to visible"] = {c: {k: probe[c].get(k) for k in ("count", "p50", "p99")}
                                        for c in ("normal", "celebrity") if c in probe}
    write, read = out["fanout"]["home p99"], out["read"]["home p99"]
    out["home p99 ratio"] = round(read / write, 1) if write and read else None
    return out


def _run(work: Path, rate: float, first: bool, args: argparse.Namespace) -> dict[str, Any]:
    log = work / f"rate-{rate:g}.log"
    load0, began = os.getloadavg(), time.monotonic()
    with log.open("wb") as out:
        code = subprocess.run(_load(work, rate, first, args), stdout=out,
                              stderr=subprocess.STDOUT, cwd=ROOT, timeout=args.timeout,
                              check=False).returncode
    result: dict[str, Any] = {"rate": rate, "exit": code,
                              "wall_s": round(time.monotonic() - began, 1),
                              "loadavg_1m": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
                              "log": str(log)}
    summary = work / "reports" / f"rate-{rate:g}" / "summary.json"
    if summary.exists():
        result |= _figures(json.loads(summary.read_text()))
    return result


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["rate/s  write p50 / p99 / p99.9 ms    read p50 / p99 / p99.9 ms     p99 ratio"
             "  API cores write / read"]
    for r in rows:
        if "fanout" not in r:
            lines.append(f"{r['rate']:6g}  failed (exit {r['exit']}): see {r['log']}")
            continue
        w, d = r["fanout"], r["read"]
        lines.append(f"{r['rate']:6g}  {_ms(w, 'home p50')} / {_ms(w, 'home p99')} / "
                     f"{_ms(w, 'home p99.9')}    {_ms(d, 'home p50')} / {_ms(d, 'home p99')} / "
                     f"{_ms(d, 'home p99.9')}   {_ms(r, 'home p99 ratio')}x  "
                     f"{w['api cores']} / {d['api cores']}")
    return "\n".join(lines)


def _ms(figures: dict[str, Any], key: str) -> str:
    value = figures.get(key)
    return f"{value:7.2f}" if value is not None else "      -"


def _plot(rows: list[dict[str, Any]], title: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if "fanout" in r]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode, label, marker, color in (("fanout", "fan-out on write", "o", "tab:blue"),
                                       ("read", "fan-out on read", "s", "tab:red")):
        rates = [r["rate"] for r in done]
        ax.plot(rates, [r[mode]["home p99"] or float("nan") for r in done], marker + "-",
                color=color, label=f"{label}, home p99")
        ax.plot(rates, [r[mode]["home p50"] or float("nan") for r in done], marker + ":",
                color=color, alpha=0.5, label=f"{label}, home p50")
    ax.set_yscale("log")
    ax.set_xlabel("open-loop rate (actions/s)")
    ax.set_ylabel("latency (ms, log)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> int:
    parser = argument_parser(__doc__.split("\n\n")[0], name="compare-sweep")
    parser.add_argument("--rates", default="100,200,300,400", help="open loop: actions/s, each")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds per mode")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--users", type=int, default=32, help="Locust users (concurrency)")
    parser.add_argument("--profile", default="read-heavy")
    parser.add_argument("--history-users", type=int, default=3_000)
    parser.add_argument("--history-follows", type=int, default=150_000)
    parser.add_argument("--history-tweets", type=int, default=150_000)
    parser.add_argument("--celebrity-threshold", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1_200.0, help="per rate, seconds")
    args = parser.parse_args()
    rates = sorted(float(r) for r in args.rates.split(","))
    work = Path(tempfile.mkdtemp(prefix="fanout-bench-compare-"))
    result: dict[str, Any] = {"args": vars(args), "cores": os.cpu_count(), "work": str(work),
                              "followees_per_user": args.history_follows / args.history_users,
                              "rates": []}
    try:
        for i, rate in enumerate(rates):
            print(f"fanout load --compare --rate {rate:g} ...", file=sys.stderr, flush=True)
            row = _run(work, rate, i == 0, args)
            result["rates"].append(row)
            print(f"  {json.dumps(row)}", file=sys.stderr, flush=True)
            if i == 0 and row["exit"] != 0 and "fanout" not in row:
                break  # the stack did not come up: the other rates have nothing to load
    finally:
        subprocess.run(_fanout("--run-dir", str(work / STARTED), "down"), cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, check=False)
    title = (f"{args.history_users:,} users, {result['followees_per_user']:g} followees each, "
             f"threshold {args.celebrity_threshold}, {args.profile}: home first page")
    saved = save(args.name, result)
    print(_table(result["rates"]))
    print(_plot(result["rates"], title, RESULTS / f"{args.name}.png"))
    print(saved)
    return 0 if all(r["exit"] == 0 for r in result["rates"]) else 1


if __name__ == "__main__":
    sys.exit(main())
