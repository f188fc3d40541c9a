"""Replay throughput of the whole pipeline: the ego-twitter graph, then a tweet burst.

    .venv/bin/python benchmarks/bench_replay.py                 # whole graph (1.77M follows)
    .venv/bin/python benchmarks/bench_replay.py --edges 300000  # a prefix, quicker
    .venv/bin/python benchmarks/bench_replay.py --sources python,spark  # both Kafka sources

Phase 1 replays the real follow graph (../shared/data/ego-twitter) with generated
profiles and tweets merged in event-time order, as fast as possible, through
``fanout replay`` in its own process, while the view job runs continuously; it
reports the time from the first record produced to the last one applied. Phase 2
posts a burst of tweets over that graph (authors weighted by follower count) and
reports tweet events/s and timeline rows/s through the join. Every figure is printed
and written to benchmarks/results/replay.json, with micro-batch duration p50/p99
and the peak memory of the process tree (driver, JVM, Python workers). A sample of
users is then verified against the SQL, so a fast wrong answer does not count.
With ``--sources``, the whole run is repeated for each Kafka source the job can read
with (a fresh broker, session and store each), one after the other in this process.
"""

from __future__ import annotations

import argparse
import gzip
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from harness import ROOT, argument_parser, save
from pipeline import percentile, pipeline, replay_process

sys.path.insert(0, str(ROOT))

from infra.checks.verify import compare  # noqa: E402
from ingest import generator, history  # noqa: E402
from views.changelog import read_changelog  # noqa: E402

EGO = ROOT.parent / "shared" / "data" / "ego-twitter" / "follows.txt.gz"


def _graph(edges: int | None, work: Path) -> Path:
    if edges is None:
        return EGO
    path = work / f"ego-{edges}.txt"
    with gzip.open(EGO, "rt") as src, path.open("w") as out:
        for i, line in enumerate(src):
            if i >= edges:
                break
            out.write(line)
    return path


def _burst(graph: Path, tweets: int, out: Path) -> int:
    """Write a burst of ``tweets`` over ``graph`` (authors by follower count) to ``out``;
    return the graph's edge count."""
    census = history.census(graph)
    burst = generator.for_graph(census.follower_counts, tweets, seed=99,
                                delete_ratio=0.0, start_ms=1_900_000_000_000)
    burst.users = []
    generator.write(burst, out)
    return census.edges


def _phase(pipe, name: str, run) -> dict:
    first = len(pipe.batch_log)
    pipe.peak_rss, pipe.peak_parts = 0, {}  # this phase's peak: replay and catch-up only
    start = time.perf_counter()
    produced = run()
    caught = pipe.wait_caught_up(timeout=1800)
    elapsed = time.perf_counter() - start
    peak = {"peak_rss_mb": round(pipe.peak_rss / 2**20),
            "peak_rss_parts_mb": {k: round(v / 2**20) for k, v in pipe.peak_parts.items()}}
    batches = pipe.batch_log[first:]
    durations = [b["seconds"] for b in batches if b["deltas"]]
    rows = sum(b["timeline_adds"] for b in batches)
    ids = {b["batch_id"] for b in batches}
    spark_ms: dict[str, int] = {}
    for progress in pipe.query.recentProgress:
        if progress["batchId"] in ids:
            for phase, ms in (progress.get("durationMs") or {}).items():
                spark_ms[phase] = spark_ms.get(phase, 0) + ms
    join_s = sum(durations)
    timeline = [(b["batch_id"], round(b["finished"] - start, 2), round(b["seconds"], 2), b["deltas"])
                for b in batches]
    return {"batch_timeline": timeline, "spark_ms": spark_ms,
            "batch_seconds_total": round(join_s, 2), "phase": name, "seconds": round(elapsed, 2),
            "catch_up_after_produce_s": round(caught, 2), "producer": produced,
            "batches": len(durations), "timeline_rows": rows,
            "timeline_rows_per_s": round(rows / elapsed), "batch_p50_s": percentile(durations, .5),
            "batch_p99_s": percentile(durations, .99),
            "store_s": round(sum(b["store_seconds"] for b in batches), 2)} | peak


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="replay", tweets=100_000, edges=None)
    ap.add_argument("--burst", type=int, default=30_000, help="tweets posted in phase 2")
    ap.add_argument("--celebrity-threshold", type=int, default=500)
    ap.add_argument("--max-records", type=int, default=100_000)
    ap.add_argument("--verify-sample", type=int, default=2000)
    ap.add_argument("--buckets", type=int, default=None, help="FANOUT_KEY_BUCKETS")
    ap.add_argument("--sources", default="",
                    help="Kafka sources to run in turn, e.g. python,spark (default: the "
                         "job's default)")
    args = ap.parse_args()
    sources = [s for s in args.sources.split(",") if s] or [None]
    results = {}
    for source in sources:
        result = _run_retrying(args, source)
        _print(result)
        name = args.name if source is None else f"{args.name}-{source}"
        print(f"written to {save(name, result)}")
        results[source] = result
    return 0 if all(r["verify"]["divergent"] == 0 for r in results.values()) else 1


#: Spark waits a fixed 10 s for a new Python worker to connect back; on a loaded
#: 2-core machine a worker started at query start can miss that (either source).
WORKER_TIMEOUT = "Python worker failed to connect back"


def _run_retrying(args: argparse.Namespace, source: str | None, attempts: int = 3) -> dict:
    """:func:`_run`, started again (fresh broker, session, store) when a Python worker
    missed Spark's connect-back timeout; the failed starts are counted in the result."""
    failed: list[str] = []
    while True:
        try:
            return _run(args, source) | {"failed_starts": failed}
        except RuntimeError as exc:
            if WORKER_TIMEOUT not in str(exc) or len(failed) + 1 >= attempts:
                raise
            failed.append(str(exc)[:300])
            print(f"[{source}] query failed to start ({WORKER_TIMEOUT}); starting again",
                  file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, source: str | None) -> dict:
    with pipeline(celebrity_threshold=args.celebrity_threshold, max_records=args.max_records,
                  key_buckets=args.buckets, kafka_source=source) as pipe:
        graph = _graph(args.edges, pipe.workdir)
        one = _phase(pipe, "graph+tweets", lambda: replay_process(
            pipe, [str(graph)], ["--generate-tweets", str(args.tweets)]))
        burst_dir = pipe.workdir / "burst"
        # In a process of its own: the census of the graph is the benchmark's memory,
        # and would stay in this one (the stack's driver) through phase 2.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            edges = pool.submit(_burst, graph, args.burst, burst_dir).result()
        two = _phase(pipe, "tweet burst", lambda: replay_process(pipe, [str(burst_dir)], []))
        two["tweet_events_per_s"] = round(args.burst / two["seconds"])
        two["followers_per_tweet"] = round(two["timeline_rows"] / args.burst, 1)
        events = sum(pipe.ends().values())
        log_ = read_changelog(pipe.kafka)
        check = compare(log_, pipe.store, pipe.view.timeline_cap, sample=args.verify_sample)
        result = {
            "kafka_source": pipe.view.kafka_source,
            "load_average_end": os.getloadavg(),
            "edges": edges, "events": events, "phases": [one, two],
            "events_per_s_phase1": round((events - args.burst) / one["seconds"]),
            "celebrities": len(pipe.store.celebrities()),
            # The stack's peak while it replays and catches up; the census of the graph
            # and the verification that follow in this process are the benchmark's own.
            "peak_rss_mb": max(one["peak_rss_mb"], two["peak_rss_mb"]),
            "peak_rss_parts_mb": max(one, two, key=lambda p: p["peak_rss_mb"])["peak_rss_parts_mb"],
            "verify": {"users": check.users_checked, "divergent": check.divergent},
            "settings": vars(args),
        }
    return result


def _print(r: dict) -> None:
    print(f"\n[{r['kafka_source']} source, load average at end {r['load_average_end']}]")
    print(f"ego-twitter edges {r['edges']:,}, events {r['events']:,}, "
          f"celebrities {r['celebrities']}, peak RSS {r['peak_rss_mb']} MB "
          f"({', '.join(f'{k} {v}' for k, v in r['peak_rss_parts_mb'].items())})")
    for p in r["phases"]:
        extra = (f", {p['tweet_events_per_s']:,} tweets/s wall, "
                 f"{p['followers_per_tweet']} timeline rows per tweet"
                 if "tweet_events_per_s" in p else "")
        print(f"  {p['phase']:<13} {p['seconds']:7.1f}s  {p['timeline_rows_per_s']:>8,} "
              f"timeline rows/s{extra}; batches {p['batches']}, p50 {p['batch_p50_s']:.2f}s, "
              f"p99 {p['batch_p99_s']:.2f}s, store {p['store_s']:.1f}s, "
              f"peak RSS {p['peak_rss_mb']} MB")
    print(f"  phase 1 events/s: {r['events_per_s_phase1']:,}")
    for p in r["phases"]:
        print(f"  spark time by phase ({p['phase']}): {p['spark_ms']}")
    print(f"  verify: {r['verify']['users']} users, {r['verify']['divergent']} divergent")


if __name__ == "__main__":
    sys.exit(main())
