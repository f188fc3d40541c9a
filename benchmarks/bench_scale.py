"""The job's cost against the size of the graph: the same steady tweets on 20k to 1M users.

    .venv/bin/python benchmarks/run.py run scale                         # 20k, 200k, 1M users
    .venv/bin/python benchmarks/bench_scale.py --users 20000 200000 --rate 500 --seconds 60
    .venv/bin/python benchmarks/bench_scale.py --store cassandra --users 20000 200000 \
        --name scale-cassandra
    .venv/bin/python benchmarks/bench_scale.py --store cassandra --users 200000 \
        --store-options upkeep=1 upkeep=8 --name scale-upkeep

For each size a fresh pipeline (broker, job, store: SQLite through the driver's sink, or
with ``--store cassandra`` a local Cassandra node through the executor sink;
:func:`pipeline.pipeline`)
first takes a generated graph of ``users`` users and ``--degree`` follows a user
(:func:`ingest.generator.generate`: the same Zipf popularity and the same celebrity
share at every size, one celebrity per 2,000 users), produced as fast as the producer
goes while the job runs, in batches of the job's default size (``--max-records``): the
**bulk replay rate** is the graph's events over the time from the first send to the
job caught up. The caught-up job is then left until its executor is idle
(:func:`settle`), and that wait is reported too. Then ``--rate`` tweets a second, first
for ``--warmup-seconds`` that are not measured (:func:`warm_up`: the first steady
batches after a bulk run on code the JVM has not compiled yet, and the smaller the
graph, the shorter the bulk that went before), then for ``--seconds`` (open loop, as
in ``bench_freshness.py``), and per size it reports:
micro-batch p50/p99, post → visible p50/p99/max, the executor's CPU per tweet (the
Python workers and the Spark JVM, which in ``local`` mode holds the executor) and the
Cassandra node's, the
join's state (rows and bytes from Spark's state store, and the checkpoint's state
directory on disk), and the peak RSS of the whole tree. A figure per size is plotted
against the user count (``results/scale.png``) and the ratios to the smallest size
are printed: what the state layout is judged by is how these grow with the graph
while the input stays the same. With ``--store-options`` each Cassandra URL option
string is a series of its own (every size each), in the order given.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from bench_freshness import lags, posts, produce, record_commits
from harness import RESULTS, ROOT, argument_parser, save
from pipeline import STORES, cpu_by_kind, percentile, pipeline

sys.path.insert(0, str(ROOT))

from ingest.generator import generate  # noqa: E402
from ingest.producer import ChangelogProducer  # noqa: E402
from views.settings import DEFAULT_TRIGGER_SECONDS  # noqa: E402

#: The processes that do the executor's work in ``local`` mode.
EXECUTOR = ("python workers", "spark jvm")


def state_figures(query: Any, checkpoint: Path) -> dict[str, Any]:
    """The join's state: Spark's state-store metrics and the checkpoint's bytes on disk."""
    progress = query.lastProgress or {}
    operators = progress.get("stateOperators") or []
    disk = sum(f.stat().st_size for f in checkpoint.rglob("*")
               if f.is_file() and "state" in f.relative_to(checkpoint).parts)
    custom: dict[str, int] = {}
    for op in operators:
        for name, value in (op.get("customMetrics") or {}).items():
            custom[name] = custom.get(name, 0) + int(value)
    return {"rows": sum(int(op.get("numRowsTotal", 0)) for op in operators),
            "memory_bytes": sum(int(op.get("memoryUsedBytes", 0)) for op in operators),
            "sst_bytes": custom.get("rocksdbSstFileSize", 0),
            "checkpoint_state_bytes": disk}


def executor_seconds(before: dict[str, float], after: dict[str, float]) -> float:
    """The executor's CPU-seconds between two :func:`cpu_by_kind` readings."""
    return sum(after.get(k, 0.0) - before.get(k, 0.0) for k in EXECUTOR)


def settle(window: float, idle: float, timeout: float) -> dict[str, Any]:
    """Wait until the caught-up job's executor is idle, so the steady figures start clean.

    Whatever the job still does after the bulk's last batch (RocksDB compacting what
    the bulk wrote, the maintenance thread uploading a snapshot) would run on the
    cores the steady batches need. Steady figures are taken once the executor uses
    less than ``idle`` cores over a ``window``; how long that took, and the CPU it
    used meanwhile, are figures of their own.
    """
    start = time.perf_counter()
    trace: list[float] = []
    while time.perf_counter() - start < timeout:
        before = cpu_by_kind()
        time.sleep(window)
        trace.append(round(executor_seconds(before, cpu_by_kind()) / window, 2))
        if trace[-1] < idle:
            break
    return {"seconds": round(time.perf_counter() - start, 1), "cores": trace,
            "settled": bool(trace) and trace[-1] < idle}


def spark_setting(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` as a pair (``argparse`` reports the ``ValueError``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.startswith("spark."):
        raise ValueError(text)
    return key, value


def bulk(pipe: Any, users: int, degree: int) -> dict[str, Any]:
    """Produce the graph while the job runs; the rate at which the job caught up with it."""
    history = generate(users, users * degree, 0, seed=11)
    events = list(history.events())
    start = time.perf_counter()
    with ChangelogProducer(pipe.kafka) as producer:
        for event in events:
            producer.send(event)
        producer.flush(600)
    produced = time.perf_counter() - start
    pipe.wait_caught_up(timeout=3600)
    seconds = time.perf_counter() - start
    return {"events": len(events), "produce_s": round(produced, 1),
            "caught_up_s": round(seconds, 1), "events_per_s": round(len(events) / seconds)}


def one_size(users: int, args: argparse.Namespace, options: str = "") -> dict[str, Any]:
    with pipeline(celebrity_threshold=1000, max_records=args.max_records,
                  trigger_seconds=args.trigger_seconds, conf=dict(args.conf),
                  store=args.store, store_options=options) as pipe:
        print(f"\n== {users:,} users, {users * args.degree:,} follows, into {args.store}"
              + (f"?{options}" if options else ""), flush=True)
        graph = bulk(pipe, users, args.degree)
        print(f"graph: {graph['events']:,} events caught up in {graph['caught_up_s']} s "
              f"({graph['events_per_s']:,}/s)", flush=True)
        graph["peak_rss_mb"] = round(pipe.peak_rss / 2**20)
        settled = settle(args.settle_window, args.idle_cores, args.settle_timeout)
        print(f"settled in {settled['seconds']} s (executor cores a {args.settle_window:g} s "
              f"window: {settled['cores']})", flush=True)
        authors = list(range(1, users + 1, 7))
        warm = warm_up(pipe, args.rate, args.warmup_seconds, authors)
        if warm["tweets"]:
            print(f"warm-up: {warm['tweets']:,} tweets, batch p50 {warm['batch_s']['p50']} s "
                  f"p99 {warm['batch_s']['p99']} s (not measured)", flush=True)
        pipe.peak_rss, pipe.peak_parts = 0, {}
        commits = record_commits(pipe)
        first_batch = len(pipe.batch_log)
        cpu_before = cpu_by_kind()
        sent = produce(pipe, args.rate, posts(args.rate, args.seconds, authors,
                                              first=warm["tweets"]))
        pipe.wait_caught_up(timeout=600, progress=False)
        cpu_after = cpu_by_kind()
        batches = pipe.batch_log[first_batch:]
        state = state_figures(pipe.query, pipe.view.checkpoint_dir)
        peak_rss, peak_parts = pipe.peak_rss, dict(pipe.peak_parts)
        # What the environment may set (FANOUT_KEY_BUCKETS, FANOUT_STATE_PAGE_BYTES).
        job = {"key_buckets": pipe.view.key_buckets,
               "state_page_bytes": pipe.view.state_page_bytes}
    seen = lags(sent, commits)
    durations = [b["seconds"] for b in batches]
    stored = [b["store_seconds"] for b in batches]
    executor_s = executor_seconds(cpu_before, cpu_after)
    node_s = cpu_after.get("cassandra", 0.0) - cpu_before.get("cassandra", 0.0)
    result = {
        "store": args.store, "store_options": options,
        "users": users, "follows": users * args.degree, "job": job, "graph": graph,
        "settle": settled,
        "warmup": warm,
        "tweets": len(sent), "visible": len(seen),
        "batch_s": {"p50": round(percentile(durations, .5), 3),
                    "p99": round(percentile(durations, .99), 3), "count": len(durations),
                    "series": [round(d, 3) for d in durations]},
        # Of each batch, the store's apply (SQLite, in the driver's writer thread).
        "store_s": {"p50": round(percentile(stored, .5), 3),
                    "p99": round(percentile(stored, .99), 3),
                    "series": [round(d, 3) for d in stored]},
        "visible_s": {q: round(percentile(seen, p), 3)
                      for q, p in (("p50", .5), ("p99", .99), ("max", 1.0))},
        "executor_cpu_ms_per_tweet": round(executor_s / max(1, len(sent)) * 1000, 3),
        "node_cpu_ms_per_tweet": round(node_s / max(1, len(sent)) * 1000, 3),
        "state": state,
        "peak_rss_mb": round(peak_rss / 2**20),
        "peak_rss_parts_mb": {k: round(v / 2**20) for k, v in peak_parts.items()},
    }
    v, b = result["visible_s"], result["batch_s"]
    node = (f" (the Cassandra node {result['node_cpu_ms_per_tweet']} ms)"
            if args.store == "cassandra" else "")
    print(f"{len(sent):,} tweets at {args.rate}/s: batch p50 {b['p50']} s p99 {b['p99']} s; "
          f"visible p50 {v['p50']} p99 {v['p99']} max {v['max']} s; executor "
          f"{result['executor_cpu_ms_per_tweet']} ms CPU a tweet{node}; state "
          f"{state['rows']:,} rows "
          f"{state['checkpoint_state_bytes'] / 2**20:,.0f} MB on disk; peak RSS "
          f"{result['peak_rss_mb']:,} MB", flush=True)
    return result


def warm_up(pipe: Any, rate: float, seconds: float, authors: list[int]) -> dict[str, Any]:
    """``seconds`` of the steady tweets before the measured ones, and their batches.

    After a bulk replay the job's steady path (a page read per touched page instead of
    a scan, small batches) runs on code the JVM has not compiled yet: with a 20k-user
    graph, whose bulk lasts ~13 s, the first ~15 steady batches took 0.8-1.3 s and the
    rest 0.3-0.7 s. Every size gets the same warm-up, so the sizes compare like with like.
    """
    first = len(pipe.batch_log)
    sent = produce(pipe, rate, posts(rate, seconds, authors)) if seconds > 0 else []
    if sent:
        pipe.wait_caught_up(timeout=600, progress=False)
    durations = [b["seconds"] for b in pipe.batch_log[first:]]
    return {"seconds": seconds, "tweets": len(sent), "batches": len(durations),
            "batch_s": {"p50": round(percentile(durations, .5), 3),
                        "p99": round(percentile(durations, .99), 3)}}


#: (label, how to read it from a size's result) of every plotted figure.
FIGURES = (
    ("micro-batch p50 (s)", lambda r: r["batch_s"]["p50"]),
    ("micro-batch p99 (s)", lambda r: r["batch_s"]["p99"]),
    ("post → visible p50 (s)", lambda r: r["visible_s"]["p50"]),
    ("post → visible p99 (s)", lambda r: r["visible_s"]["p99"]),
    ("executor CPU a tweet (ms)", lambda r: r["executor_cpu_ms_per_tweet"]),
    ("state on disk (MB)", lambda r: r["state"]["checkpoint_state_bytes"] / 2**20),
    ("peak RSS (MB)", lambda r: r["peak_rss_mb"]),
    ("bulk replay (events/s)", lambda r: r["graph"]["events_per_s"]),
)


def ratios(sizes: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each figure at each size over its value at the smallest size."""
    out = {}
    for label, read in FIGURES:
        base = read(sizes[0])
        out[label] = [round(read(r) / base, 2) if base else 0.0 for r in sizes]
    return out


def plot(sizes: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    users = [r["users"] for r in sizes]
    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    for ax, (label, read) in zip(axes.flat, FIGURES, strict=True):
        ax.plot(users, [read(r) for r in sizes], marker="o")
        ax.set_xscale("log")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("users")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.suptitle("the same steady tweets on a growing graph")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="scale")
    ap.add_argument("--users", type=int, nargs="+", default=[20_000, 200_000, 1_000_000])
    ap.add_argument("--degree", type=int, default=10, help="follows a user")
    ap.add_argument("--rate", type=float, default=500.0, help="tweets per second")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--store", choices=STORES, default="sqlite")
    ap.add_argument("--max-records", type=int, default=None,
                    help="records a micro-batch at most (default: the store's own, as the job)")
    ap.add_argument("--trigger-seconds", type=float, default=DEFAULT_TRIGGER_SECONDS,
                    help="the micro-batch trigger (the job's default; 0: back to back)")
    ap.add_argument("--warmup-seconds", type=float, default=20.0,
                    help="steady tweets before the measured ones (not measured; 0: none)")
    ap.add_argument("--settle-window", type=float, default=5.0,
                    help="seconds a CPU sample of the settle wait lasts")
    ap.add_argument("--idle-cores", type=float, default=0.3,
                    help="below this the caught-up executor counts as settled")
    ap.add_argument("--settle-timeout", type=float, default=600.0)
    ap.add_argument("--conf", type=spark_setting, action="append", default=[],
                    metavar="KEY=VALUE", help="a Spark setting over the job's (repeatable)")
    ap.add_argument("--store-options", nargs="+", default=[""], metavar="OPTIONS",
                    help="Cassandra URL options, a series each (e.g. upkeep=1 upkeep=8)")
    args = ap.parse_args()
    sizes: list[dict[str, Any]] = []
    for options in args.store_options:
        for users in sorted(args.users):
            sizes.append(one_size(users, args, options))
            # each size is saved as it ends: a 1M-user size runs for most of an hour
            save(args.name, {"args": vars(args), "sizes": sizes, "ratios": ratios(sizes)})
    grown = ratios(sizes)
    def named(r: dict[str, Any]) -> str:
        return f"{r['users']:,}" + (f" ({r['store_options']})" if r["store_options"] else "")

    print(f"\nagainst {named(sizes[0])} users, at " + ", ".join(map(named, sizes)) + " users:")
    for label, values in grown.items():
        print(f"  {label:<28} " + "  ".join(f"{v:5.2f}x" for v in values))
    RESULTS.mkdir(parents=True, exist_ok=True)
    print(f"plot: {plot(sizes, RESULTS / f'{args.name}.png')}")
    print(f"written to {save(args.name, {'args': vars(args), 'sizes': sizes, 'ratios': grown})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
