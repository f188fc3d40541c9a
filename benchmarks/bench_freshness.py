"""Freshness under steady load: tweets at a fixed rate, post → visible p50/p99.

    .venv/bin/python benchmarks/bench_freshness.py --rate 200 --seconds 60

A synthetic graph is loaded first (not timed). Then tweets are produced at a fixed
rate by an open-loop schedule (each has an intended send time; a late send is not
forgiven). A tweet is *visible* when the micro-batch that applied its offset has
committed to the store: the sink's callback snapshots the applied offsets after each
commit, so visibility is known exactly per tweet, with no polling. Reports
p50/p90/p99/max of (visible − intended send time), the micro-batch durations, and
writes benchmarks/results/freshness.json.
"""

from __future__ import annotations

import bisect
import sys
import threading
import time
from collections.abc import Iterable, Iterator

from harness import ROOT, argument_parser, save
from pipeline import percentile, pipeline

sys.path.insert(0, str(ROOT))

from ingest.events import Event, Post  # noqa: E402
from ingest.generator import generate  # noqa: E402
from ingest.producer import ChangelogProducer  # noqa: E402


def _load_graph(pipe, users: int, follows: int) -> None:
    history = generate(users, follows, 0, seed=11)
    with ChangelogProducer(pipe.kafka) as producer:
        for event in history.events():
            producer.send(event)
        producer.flush(120)
    pipe.wait_caught_up(timeout=900)


def record_commits(pipe) -> list[tuple[float, dict]]:
    """(time, applied offsets) after each batch the sink applies, from now on."""
    commits: list[tuple[float, dict]] = []
    previous = pipe.sink.on_batch

    def snapshot(stats, total):
        previous(stats, total)
        commits.append((time.perf_counter(), pipe.store.applied_offsets()))

    pipe.sink.on_batch = snapshot
    return commits


def produce(pipe, rate: float, writes: Iterable[Event]) -> list[tuple]:
    """Open loop: write i is due at start + i/rate; returns (due, partition, offset)."""
    sent: list[tuple] = []
    lock = threading.Lock()
    producer = ChangelogProducer(pipe.kafka, linger_ms=0)
    producer.start()
    start = time.perf_counter() + 0.5
    for i, event in enumerate(writes):
        due = start + i / rate
        time.sleep(max(0.0, due - time.perf_counter()))

        def done(_event, outcome, due=due):
            if not isinstance(outcome, Exception):
                with lock:
                    sent.append((due, outcome.partition, outcome.offset))

        producer.send(event, on_delivery=done)
        producer.poll(0)
    producer.flush(60)
    producer.close()
    return sent


def posts(rate: float, seconds: float, authors: list[int], first: int = 0) -> Iterator[Post]:
    """Posts by ``authors`` in turn, stamped when they are made (just before sending).

    Their ids count from ``first`` (past the ids of an earlier call's posts).
    """
    for i in range(first, first + int(rate * seconds)):
        yield Post(2_000_000_000_000 + i, authors[i % len(authors)], int(time.time() * 1000),
                   f"fresh {i}")


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="freshness", users=20_000,
                         follows=200_000)
    ap.add_argument("--rate", type=float, default=200.0, help="tweets per second")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--trigger", type=float, default=0.0, help="processing-time trigger, s")
    ap.add_argument("--max-records", type=int, default=20_000)
    ap.add_argument("--buckets", type=int, default=None, help="FANOUT_KEY_BUCKETS")
    args = ap.parse_args()
    with pipeline(celebrity_threshold=1000, max_records=args.max_records,
                  trigger_seconds=args.trigger, key_buckets=args.buckets) as pipe:
        _load_graph(pipe, args.users, args.follows)
        commits = record_commits(pipe)
        first_batch = len(pipe.batch_log)
        sent = produce(pipe, args.rate, posts(args.rate, args.seconds,
                                               list(range(1, args.users + 1, 7))))
        pipe.wait_caught_up(timeout=300, progress=False)
        batches = pipe.batch_log[first_batch:]
        ids = {b["batch_id"] for b in batches}
        phases: dict[str, list[int]] = {}
        for progress in pipe.query.recentProgress:
            if progress["batchId"] in ids:
                for phase, ms in (progress.get("durationMs") or {}).items():
                    phases.setdefault(phase, []).append(ms)
    lags_s = lags(sent, commits)
    durations = [b["seconds"] for b in batches]
    result = {
        "rate": args.rate, "seconds": args.seconds, "tweets": len(sent),
        "visible": len(lags_s),
        "freshness_s": {q: round(percentile(lags_s, p), 3) for q, p in
                        (("p50", .5), ("p90", .9), ("p99", .99), ("max", 1.0))},
        "batches": len(durations),
        "batch_s": {"p50": round(percentile(durations, .5), 3),
                    "p99": round(percentile(durations, .99), 3)},
        "spark_ms_p50": {k: percentile(v, .5) for k, v in sorted(phases.items())},
        "store_s_p50": round(percentile([b["store_seconds"] for b in batches], .5), 3),
        "settings": vars(args),
    }
    f = result["freshness_s"]
    print(f"\n{len(sent)} tweets at {args.rate}/s: post → visible p50 {f['p50']}s, "
          f"p90 {f['p90']}s, p99 {f['p99']}s, max {f['max']}s; {len(durations)} batches, "
          f"p50 {result['batch_s']['p50']}s, p99 {result['batch_s']['p99']}s")
    print(f"  per batch, p50: spark {result['spark_ms_p50']} ms; store {result['store_s_p50']}s")
    print(f"written to {save(args.name, result)}")
    return 0


def lags(sent: list[tuple], commits: list[tuple[float, dict]]) -> list[float]:
    """Per tweet: first commit whose applied offset covers it, minus its due time."""
    out = []
    times = [t for t, _ in commits]
    for due, partition, offset in sent:
        i = bisect.bisect_left(times, due)
        while i < len(commits) and commits[i][1].get(("tweets", partition), -1) < offset:
            i += 1
        if i < len(commits):
            out.append(commits[i][0] - due)
    return out


if __name__ == "__main__":
    sys.exit(main())
