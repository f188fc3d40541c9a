"""Idle CPU of one API process — its background work, the celebrity cache — before and after.

    .venv/bin/python benchmarks/bench_api_idle.py [--store /tmp/fanout14/v.sqlite] [--before REV]

Starts ``python -m serving`` (one worker) on ``bench_api.py``'s store, once as of git
revision ``--before`` (full celebrity reload every 0.5 s) and once as checked out
(incremental refresh, skipped while the store's version stands still), and measures
the process's CPU over ``--seconds`` with no requests and the job idle. Results go to
``benchmarks/results/api-idle.json``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bench_http import _tree_cpu, api, checkout
from harness import ROOT, argument_parser, save
from pipeline import scratch


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="api-idle",
                         store=Path("/tmp/fanout14/v.sqlite"))
    ap.add_argument("--before", default="0d21c7e")
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    out: dict = {"store": str(args.store), "seconds": args.seconds}
    with scratch("fanout-idle-") as work:
        for label, root in (("before", checkout(args.before, work)), ("after", None)):
            with api(args.store, 1, 64, work, ROOT if root is None else root) as s:
                assert s.process is not None
                time.sleep(2)  # past the first (full) refresh
                cpu, start = _tree_cpu(s.process.pid), time.perf_counter()
                time.sleep(args.seconds)
                out[label] = {"idle_cores": round((_tree_cpu(s.process.pid) - cpu)
                                                  / (time.perf_counter() - start), 4),
                              "loadavg_1m": round(os.getloadavg()[0], 2)}
            print(label, out[label], flush=True)
    out["before"]["rev"] = args.before
    print(f"written to {save(args.name, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
