"""A new stack catching up on the demo's history, by shape: SQLite, Cassandra, Cassandra on a cluster.

    .venv/bin/python benchmarks/bench_catchup.py [--shapes sqlite,cassandra,cassandra-cluster] \
        [--rounds 1]                                              # ~10 min → catchup.json

What a user who tries the shapes one after the other sees. For each shape, in turn
(``--rounds`` times): a fresh run directory, ``fanout up`` (``--store cassandra``
starts a local node; ``-cluster`` adds ``--cluster``, a Spark standalone master and
worker), ``fanout replay`` of the demo's history (``fanout generate --users 2000
--follows 30000 --tweets 20000``, the social mix), and the time from the replay's
start to the view having applied every record of the log (its applied offsets, read
from the store every 0.25 s). Then ``fanout verify --sample 200`` (it must find 0
divergent) and ``fanout down``. Reported a shape: ``up_s``, ``replay_s``,
``caught_up_s`` (replay start → caught up), events/s over that, and each shape's
``caught_up_s`` against SQLite's of the same round. With ``--graph`` (an edge list,
e.g. ``../shared/data/ego-twitter/follows.txt.gz``), the history replayed is that graph
with profiles and ``--tweets`` posts by follower-weighted authors (``fanout replay
GRAPH --generate-tweets N``) instead of the generated one. Right after the catch-up (before
the verify; skipped at ``--read-seconds 0``), a fresh API (``--workers`` processes, auth off, its page cache empty, as
after a restart or a switch of views) takes wrk's random home reads (``limit=20``,
``--connections``) for ``--read-seconds``, twice: ``reads_first`` and ``reads_next``.
On a shape with a local Cassandra node, ``node_cpu`` is where the node's CPU went from
the replay's start to the catch-up: seconds per group of its JVM's threads (named as
Linux shows them, numbers dropped), and per timeline row the job wrote. ``peak_rss_mb`` is the stack's peak RSS over the same
span, in all and by service (sampled every 2 s). ``--max-records N`` sets every shape's
``FANOUT_MAX_RECORDS_PER_BATCH`` (unset: each store's own, ``catch_up_records``).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_http import wrk
from bench_nodes import Census
from bench_store_reads import api, fanout
from harness import ROOT, argument_parser, save, threads_cpu
from pipeline import scratch

sys.path.insert(0, str(ROOT))

from infra.checks.verify import end_offsets, wait_caught_up  # noqa: E402
from infra.stack.stack import Stack  # noqa: E402
from ingest.settings import KafkaSettings  # noqa: E402
from views.stores import store_from_url  # noqa: E402

SHAPES = {"sqlite": ("--store", "sqlite"), "cassandra": ("--store", "cassandra"),
          "cassandra-cluster": ("--store", "cassandra", "--cluster")}

ap = argument_parser(__doc__.splitlines()[0], name="catchup", users=2000, follows=30000,
                     tweets=20000, rounds=1)
ap.add_argument("--shapes", default=",".join(SHAPES),
                help="stack shapes, in the order run (default: %(default)s)")
ap.add_argument("--graph", type=Path, default=None,
                help="replay this edge list with --tweets generated posts instead of a "
                     "generated history (--users and --follows are then not used)")
ap.add_argument("--verify-sample", type=int, default=200)
ap.add_argument("--read-seconds", type=float, default=20.0,
                help="each of the two wrk runs on a fresh API after the catch-up")
ap.add_argument("--workers", type=int, default=2, help="the fresh API's processes")
ap.add_argument("--connections", type=int, default=16)
ap.add_argument("--wrk-threads", type=int, default=2)
ap.add_argument("--seed", type=int, default=7)
ap.add_argument("--max-records", type=int, default=None,
                help="FANOUT_MAX_RECORDS_PER_BATCH of every shape's job (default: the store's)")


def node_cpu(before: dict[str, float], after: dict[str, float], rows: int) -> dict[str, Any]:
    """The node's CPU between two :func:`threads_cpu` readings, and its largest thread groups."""
    spent = {k: v - before.get(k, 0.0) for k, v in after.items()}
    total = spent.pop("")
    top = sorted(spent.items(), key=lambda kv: -kv[1])[:8]
    return {"seconds": round(total, 1), "us_per_row": round(total / max(rows, 1) * 1e6, 2),
            "by_threads": {k: round(v, 1) for k, v in top}}


def written_rows(run: Path) -> int:
    """Rows the job's sink logged as written (``batch N: R rows``)."""
    log = run / "logs" / "job.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return sum(int(n) for n in re.findall(r"batch \d+: (\d+) (?:rows|deltas) \(", text))


def one(shape: str, history: list[str], work: Path, args: Any) -> dict[str, Any]:
    run = work / shape
    started = time.perf_counter()
    fanout(run, "up", *SHAPES[shape], "--no-verifier", "--timeout", "900")
    up_s = time.perf_counter() - started
    try:
        stack = Stack.load(run)
        assert stack is not None
        kafka = KafkaSettings.from_env(stack.env())
        node = stack.pids.get("cassandra")
        before = threads_cpu(node) if node else {}
        started = time.perf_counter()
        with Census(stack) as census:
            replayed = fanout(run, "replay", "--no-progress", *history)
            replay_s = time.perf_counter() - started
            counted = re.search(r"replayed ([\d,]+) events", replayed)
            assert counted is not None, replayed[-2000:]
            events = int(counted[1].replace(",", ""))
            with store_from_url(stack.env()["FANOUT_STORE"], cap=60) as store:
                ends = end_offsets(kafka)
                while not wait_caught_up(store, ends, 10):
                    print(f"  [{shape}] catching up: {time.perf_counter() - started:.0f}s",
                          flush=True)
        caught_up_s = time.perf_counter() - started
        peak = {"peak_rss_mb": {"all": round(census.peak_total / 2**20),
                                **{k: round(v / 2**20) for k, v in census.peak.items()}}}
        cpu = {"node_cpu": node_cpu(before, threads_cpu(node), written_rows(run))} if node else {}
        reads = (first_reads(stack.env()["FANOUT_STORE"], work / shape, args)
                 if args.read_seconds > 0 else {})
        out = fanout(run, "verify", "--sample", str(args.verify_sample))
        found = re.search(r"verify: (\d+) users checked, (\d+) divergent", out)
        if found is None or found[2] != "0":
            raise SystemExit(f"[{shape}] verify did not find 0 divergent:\n{out[-2000:]}")
        return {"up_s": round(up_s, 1), "replay_s": round(replay_s, 1),
                "caught_up_s": round(caught_up_s, 1),
                "events": events, "events_per_s": round(events / caught_up_s),
                "verified": int(found[1]), **peak, **cpu, **reads}
    finally:
        fanout(run, "down")


def first_reads(url: str, work: Path, args: Any) -> dict[str, Any]:
    """wrk on a fresh API (its page cache empty, as after a restart or a switch), twice."""
    keep = ("requests_per_s", "p50_ms", "p99_ms", "requests_per_cpu_s", "non2xx")
    out: dict[str, Any] = {}
    with api(url, args.workers, work) as server:
        for label, seed in (("reads_first", args.seed), ("reads_next", args.seed + 1)):
            result = wrk(server, args.connections, args.read_seconds, args, work, seed=seed)
            out[label] = {k: result[k] for k in keep}
    return out


def main() -> int:
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    unknown = set(shapes) - set(SHAPES)
    if unknown:
        raise SystemExit(f"unknown shapes {sorted(unknown)}: expected some of {sorted(SHAPES)}")
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in shapes}
    if args.max_records is not None:
        os.environ["FANOUT_MAX_RECORDS_PER_BATCH"] = str(args.max_records)
    with scratch("fanout-catchup-") as work:
        if args.graph is not None:
            history = [str(args.graph.resolve()), "--generate-tweets", str(args.tweets),
                       "--seed", str(args.seed)]
        else:
            history = [str(work / "history")]
            fanout(work / "gen", "generate", "--users", str(args.users), "--follows",
                   str(args.follows), "--tweets", str(args.tweets), "--out", history[0])
        for round_ in range(args.rounds):
            for shape in shapes:
                print(f"[{shape}] round {round_ + 1}: up, replay, catch up", flush=True)
                runs[shape].append(one(shape, history, work / f"r{round_}", args))
                print(f"[{shape}] {json.dumps(runs[shape][-1])}", flush=True)
    result: dict[str, Any] = {"args": vars(args), "runs": runs}
    if "sqlite" in runs:
        result["against_sqlite"] = {
            s: [round(r["caught_up_s"] / b["caught_up_s"], 2)
                for r, b in zip(rs, runs["sqlite"], strict=True)]
            for s, rs in runs.items() if s != "sqlite"}
        if args.read_seconds > 0:
            result["first_reads_share_of_sqlite"] = {
                s: [round(r["reads_first"]["requests_per_s"]
                          / b["reads_first"]["requests_per_s"], 3)
                    for r, b in zip(rs, runs["sqlite"], strict=True)]
                for s, rs in runs.items() if s != "sqlite"}
    result["median_caught_up_s"] = {s: statistics.median(r["caught_up_s"] for r in rs)
                                    for s, rs in runs.items()}
    print(json.dumps({k: result[k] for k in ("median_caught_up_s", "against_sqlite",
                                             "first_reads_share_of_sqlite") if k in result}))
    print(f"results: {save(args.name, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
