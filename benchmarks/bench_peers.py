"""fanout side by side with the engines a user might pick instead, on the same events.

    .venv/bin/python benchmarks/bench_peers.py [--edges 300000] [--tweets 50000]
        [--engines join,pipeline,pathway,pathway-cap,duckdb,flink,flink-batch] [--name peers]
        [--sizes 100000:20000,300000:50000] [--repeat 3]

The events are ``bench_parts.events(edges, tweets)``: a prefix of the ego-twitter
follow graph with generated profiles and posts (and some deletes), in event-time
order. Each engine builds the home-timeline view of DESIGN §4 from them:

- ``join``: fanout's pure join (``views.local``), one core, no Spark, no store, in
  micro-batches of ``--batch`` events (its deltas are applied to SQLite afterwards,
  untimed, to check the view);
- ``pipeline``: fanout's whole pipeline. The events are produced into Apache Kafka
  first; then the view job (Spark's Kafka source → the join in
  ``transformWithStateInPandas`` → the spooling SQLite sink, ``local[2]``) starts and
  is timed until the store has applied every record, in micro-batches of the job's
  default size (``--max-records``, 200,000). ``startup_s`` is the part of that spent
  before the first micro-batch was applied (Python workers starting, the query
  planned); the ``running`` line is the rate after it;
- ``pipeline-running``: the same pipeline as a job that is already running, the way
  ``bench_replay.py`` measures it (and the issue's own baseline of 15k events/s did):
  the job starts on the first ``--warmup`` events and applies them; then a process of
  its own produces the rest while the job runs, timed from the first of them produced
  to the last applied. Its rate counts only those events;
- ``pathway`` / ``pathway-cap``: Pathway's incremental join without and with the exact
  top-N cap, and ``duckdb``: the capped view recomputed from scratch every 10k events.
  These two are not product dependencies: they run in ``.venv-peers`` through
  ``benchmarks/peers.py`` (made on first use), on the same events written as JSONL;
- ``flink`` / ``flink-batch``: the same view as one Flink SQL job (PyFlink 2.2.1, its
  Kafka SQL connector), streaming (a maintained view, as fanout's) or batch (one
  recompute), reading the same events from fanout's own changelog topics: they are
  produced into a broker of their own first, untimed, as for the cold ``pipeline``.
  Not product dependencies either: ``benchmarks/peers_flink.py`` runs them from
  ``.venv-flink`` (made on first use, ~850 MB) with the connector jar from the jar
  cache (fetched by Maven on first use), ``--flink-parallelism`` (2) and
  ``--flink-heap`` (3g; 1 GB does not finish the default size).

``--sizes EDGES:TWEETS,...`` runs the chosen engines at each size in turn (in place of
``--edges``/``--tweets``) and prints each engine's rate and time at every size, so that
what grows faster than the events shows (DuckDB's recompute of the whole view).

``--repeat N`` runs every engine N times, taking turns (so that a busy spell of the
shared machine falls on each), and reports each engine's run of median time, with the
seconds of every run (``repeats_s``).

Every engine's view is checked: fanout's against the SQL recomputed by
``views.reference`` (``--verify-sample`` users, 0 = all), the peers' against a
brute-force recomputation of the same SQL in ``peers.py``. One table is printed;
everything goes to ``benchmarks/results/NAME.json``. Ratios are what to compare: the
machine is shared, so absolute rates move between runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench_parts import events as parts_events
from harness import ROOT, argument_parser, save
from peers import ensure_venv
from peers_flink import ENGINES as FLINK_MODES
from peers_flink import ensure_connector
from peers_flink import ensure_venv as ensure_flink_venv
from pipeline import pipeline, scratch

from infra.checks.verify import compare  # noqa: E402
from infra.services.broker import KafkaBroker  # noqa: E402
from ingest.events import Delete, Follow, Post
from ingest.producer import ChangelogProducer  # noqa: E402
from ingest.settings import KafkaSettings  # noqa: E402
from ingest.topics import create_topics  # noqa: E402
from views.changelog import Changelog  # noqa: E402
from views.join import JoinConfig  # noqa: E402
from views.local import LocalJoin  # noqa: E402
from views.stores.sqlite import SQLiteStore  # noqa: E402

PEERS = ("pathway", "pathway-cap", "duckdb")
FLINK = tuple(FLINK_MODES)  # flink, flink-batch
PIPELINES = ("pipeline", "pipeline-running")
ENGINES = ("join", *PIPELINES, *PEERS, *FLINK)
CAP = 800
CELEBRITY_THRESHOLD = 1000


class _Collect(SQLiteStore):
    """Keeps each batch's deltas in memory; applied to SQLite after the clock stops."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, cap=CAP)
        self.kept: list[list] = []

    def apply(self, deltas, batch_id=-1):  # type: ignore[override]
        self.kept.append(list(deltas))


def run_join(evts: list, batch: int, work: Path, sample: int) -> dict[str, Any]:
    collect = _Collect(work / "join.sqlite")
    join = LocalJoin(JoinConfig.with_ratio(CAP, CELEBRITY_THRESHOLD), collect)
    start = time.perf_counter()
    for i in range(0, len(evts), batch):
        join.run(evts[i:i + batch])
    seconds = time.perf_counter() - start
    store = collect.open()
    rows = sum(SQLiteStore.apply(store, deltas, n).timeline_adds
               for n, deltas in enumerate(collect.kept))
    check = compare(Changelog(events=evts), store, CAP, sample=sample or None)
    store.close()
    return {"events": len(evts), "seconds": seconds, "timeline_rows": rows,
            "checked": check.users_checked, "divergent": check.divergent,
            "equal": check.divergent == 0}


def run_pipeline(evts: list, sample: int, max_records: int, buckets: int | None,
                 kafka_source: str | None, work: Path, warmup: int = 0) -> dict[str, Any]:
    """The whole pipeline: cold (``warmup`` 0: a backlog, then the job started), or a
    running job handed everything after the first ``warmup`` events."""
    with pipeline(celebrity_threshold=CELEBRITY_THRESHOLD, cap=CAP, max_records=max_records,
                  key_buckets=buckets, kafka_source=kafka_source, start=False) as pipe:
        backlog, timed = (evts, []) if not warmup else (evts[:warmup], evts[warmup:])
        with ChangelogProducer(pipe.kafka) as producer:
            for event in backlog:
                producer.send(event)
            producer.flush(300)
        start = time.perf_counter()
        assert pipe.launch is not None
        pipe.query = pipe.launch()
        seconds = pipe.wait_caught_up(1800)
        result: dict[str, Any] = {}
        if timed:
            warm_batches = len(pipe.batch_log)
            result = {"warmup_events": len(backlog), "warmup_s": seconds,
                      **_produce_while_running(pipe, timed, work)}
            seconds = result["seconds"]
        batches = pipe.batch_log
        first = min(b["finished"] for b in batches) - start if batches else 0.0
        progress = pipe.query.recentProgress
        first_rows = progress[0].numInputRows if progress else 0
        rows = sum(b["timeline_adds"] for b in batches)
        check = compare(Changelog(events=evts), pipe.store, CAP, sample=sample or None)
        common = {"batches": len(batches), "timeline_rows": rows,
                  "peak_rss_mb": round(pipe.peak_rss / 2**20),
                  "kafka_source": pipe.view.kafka_source, "key_buckets": pipe.view.key_buckets,
                  "max_records_per_batch": max_records,
                  # Each batch's time in the sink (spooled, then applied by the writer
                  # thread while the next batch runs) and of that the store's apply.
                  "sink_s": [round(b["seconds"], 3) for b in batches],
                  "store_s": [round(b["store_seconds"], 3) for b in batches],
                  "checked": check.users_checked, "divergent": check.divergent,
                  "equal": check.divergent == 0}
        if timed:
            return {"events": len(timed), **result, **common,
                    "batches": len(batches) - warm_batches}
        # Past the first batch (which also starts the Python workers and plans the
        # query): the rate of a running job.
        steady = (len(evts) - first_rows) / (seconds - first) if seconds > first else 0.0
        return {"events": len(evts), "seconds": seconds, "startup_s": first,
                "first_batch_records": first_rows, "steady_events_per_s": round(steady),
                **common}


def _cold(run: Any, *args: Any) -> dict[str, Any]:
    """``run(*args)`` in a fresh interpreter, so with a JVM of its own.

    PySpark keeps its JVM after ``spark.stop()``: a second pipeline in one process
    would find Spark's classes loaded and its code compiled, ~4 s off a cold start.
    Every Flink run starts a JVM too.
    """
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(run, args)


def _produce_while_running(pipe: Any, evts: list, work: Path) -> dict[str, Any]:
    """Produce ``evts`` from a process of its own while the job runs; time to caught up.

    In its own process, as ``fanout replay`` is in ``bench_replay.py``: the driver
    (which runs the SQLite sink) keeps its interpreter to itself. The clock is
    ``perf_counter``, which is the system's monotonic clock in both processes.
    """
    path = work / "timed.pickle"
    path.write_bytes(pickle.dumps(evts, protocol=pickle.HIGHEST_PROTOCOL))
    kafka = pipe.kafka
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        first, flushed = pool.apply(_produce, (str(path), kafka.bootstrap, kafka.partitions,
                                               kafka.topic_prefix))
    pipe.wait_caught_up(1800)
    done = time.perf_counter()
    return {"seconds": done - first, "produce_s": flushed - first}


def _produce(path: str, bootstrap: str, partitions: int, prefix: str) -> tuple[float, float]:
    evts = pickle.loads(Path(path).read_bytes())
    kafka = KafkaSettings(bootstrap=bootstrap, partitions=partitions, topic_prefix=prefix)
    with ChangelogProducer(kafka) as producer:
        first = time.perf_counter()
        for event in evts:
            producer.send(event)
        producer.flush(300)
        return first, time.perf_counter()


def write_jsonl(evts: list, path: Path) -> None:
    """The events in the peers' plain form (``peers.py``'s input)."""
    with path.open("w") as out:
        for e in evts:
            match e:
                case Follow():
                    row = {"op": "follow" if e.active else "unfollow", "follower": e.follower_id,
                           "followee": e.followee_id, "t": e.created_at}
                case Post():
                    row = {"op": "post", "tweet_id": e.tweet_id, "author": e.author_id,
                           "t": e.created_at}
                case Delete():
                    row = {"op": "delete", "tweet_id": e.tweet_id, "author": e.author_id,
                           "t": e.created_at}
                case _:
                    row = {"op": "other"}
            out.write(json.dumps(row) + "\n")


def run_peer(engine: str, events_file: Path, work: Path, threads: int) -> dict[str, Any]:
    python = ensure_venv(ROOT)
    return _run_script(work / engine, [
        str(python), str(ROOT / "benchmarks" / "peers.py"), "--engine", engine,
        "--events", str(events_file), "--cap", str(CAP), "--threads", str(threads)])


def _run_script(base: Path, command: list[str]) -> dict[str, Any]:
    """A peer's script (killed after an hour), its result read from ``base``.json.

    Its stderr (progress, the JVM's log) is shown as it comes and its last lines kept:
    a script that fails gives ``error``, its exit code and those lines (a Java stack, a
    pip failure), which is what a reader of the results needs.
    """
    out, tail = base.with_suffix(".json"), deque[str](maxlen=5)
    with subprocess.Popen([*command, "--out", str(out)], stderr=subprocess.PIPE, text=True,
                          errors="replace") as proc:
        timer = threading.Timer(3600, proc.kill)
        timer.start()
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                sys.stderr.write(line)
                if line.strip():
                    tail.append(line.rstrip())
        finally:
            timer.cancel()
    if proc.returncode != 0:
        return {"error": f"{Path(command[1]).name} exited {proc.returncode}", "stderr": [*tail]}
    result = json.loads(out.read_text())
    return {**result, "equal": result.get("equal_to_brute", False)}


@contextmanager
def changelog(evts: list, work: Path) -> Iterator[KafkaSettings]:
    """A broker of its own holding ``evts`` in fanout's changelog topics (Flink's input)."""
    with KafkaBroker(work / "kafka-flink") as broker:
        kafka = KafkaSettings(bootstrap=broker.bootstrap, partitions=4, topic_prefix="f_")
        create_topics(kafka)
        with ChangelogProducer(kafka) as producer:
            for event in evts:
                producer.send(event)
            producer.flush(300)
        yield kafka


def run_flink(engine: str, kafka: KafkaSettings, events_file: Path, work: Path,
              parallelism: int, heap: str) -> dict[str, Any]:
    python = ensure_flink_venv(ROOT)
    jar = ensure_connector()
    return _run_script(work / engine, [
        str(python), str(ROOT / "benchmarks" / "peers_flink.py"), "--bootstrap", kafka.bootstrap,
        "--prefix", kafka.topic_prefix, "--mode", FLINK_MODES[engine],
        "--events", str(events_file), "--cap", str(CAP), "--parallelism", str(parallelism),
        "--heap", heap, "--jar", str(jar)])


def sizes(spec: str) -> list[tuple[int, int]]:
    """``EDGES:TWEETS,...`` as pairs (``ValueError`` if malformed)."""
    pairs = []
    for part in spec.split(","):
        edges, _, tweets = part.strip().partition(":")
        pair = (int(edges), int(tweets))
        if min(pair) < 1:
            raise ValueError(f"{part!r}: edges and tweets must be >= 1")
        pairs.append(pair)
    return pairs


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="peers", tweets=50_000, edges=300_000)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--batch", type=int, default=100_000, help="events per pure-join batch")
    ap.add_argument("--max-records", type=int, default=SQLiteStore.catch_up_records,
                    help="the pipeline's records per micro-batch (FANOUT_MAX_RECORDS_PER_BATCH; "
                         "the job's default)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every engine this many times, in turns; each engine's median "
                         "run is reported, with every run's seconds")
    ap.add_argument("--warmup", type=int, default=10_000,
                    help="pipeline-running: events the job applies before the clock starts")
    ap.add_argument("--buckets", type=int, default=None, help="FANOUT_KEY_BUCKETS")
    ap.add_argument("--kafka-source", default=None, choices=("spark", "python"))
    ap.add_argument("--threads", type=int, default=1, help="Pathway's worker threads")
    ap.add_argument("--flink-parallelism", type=int, default=2, help="the Flink job's")
    ap.add_argument("--flink-heap", default="3g", help="the Flink JVM's heap (>= 2g)")
    ap.add_argument("--sizes", default=None, metavar="EDGES:TWEETS,...",
                    help="run at each size in turn, in place of --edges/--tweets")
    ap.add_argument("--verify-sample", type=int, default=2000, help="users checked; 0 = all")
    args = ap.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(engines) - set(ENGINES)
    if unknown:
        ap.error(f"unknown engines {sorted(unknown)}; choose from {', '.join(ENGINES)}")
    try:
        pairs = sizes(args.sizes) if args.sizes else [(args.edges, args.tweets)]
    except ValueError as exc:
        ap.error(f"--sizes: {exc}")
    with scratch("fanout-peers-") as work:
        runs = []
        for edges, tweets in pairs:
            folder = work / f"{edges}-{tweets}" if len(pairs) > 1 else work
            folder.mkdir(exist_ok=True)
            runs.append(_run(args, engines, folder, edges, tweets))
    if len(runs) == 1:
        out = runs[0]
    else:
        out = {"sizes": runs, "settings": vars(args)}
        _print_sizes(runs)
    print(f"written to {save(args.name, out)}")
    return 0


def _run(args: argparse.Namespace, engines: list[str], work: Path, edges: int,
         tweets: int) -> dict[str, Any]:
    evts = parts_events(edges, tweets, work)
    print(f"{len(evts):,} events ({edges:,} edges, {tweets:,} tweets)", file=sys.stderr)
    if any(e in PEERS or e in FLINK for e in engines):
        write_jsonl(evts, work / "events.jsonl")
    runs: dict[str, list[dict[str, Any]]] = {engine: [] for engine in engines}
    order = [engine for _ in range(args.repeat) for engine in engines]
    with ExitStack() as stack:
        kafka: KafkaSettings | None = None
        for at, engine in enumerate(order):
            print(f"--- {engine}", file=sys.stderr, flush=True)
            if engine == "join":
                r = run_join(evts, args.batch, work, args.verify_sample)
            elif engine in PIPELINES:
                r = _cold(run_pipeline, evts, args.verify_sample, args.max_records,
                          args.buckets, args.kafka_source, work,
                          args.warmup if engine == "pipeline-running" else 0)
            elif engine in FLINK:
                if kafka is None:
                    kafka = stack.enter_context(changelog(evts, work))
                r = run_flink(engine, kafka, work / "events.jsonl", work,
                              args.flink_parallelism, args.flink_heap)
                if not any(e in FLINK for e in order[at + 1:]):
                    stack.close()  # the broker, before any engine after the last Flink one
            else:
                r = run_peer(engine, work / "events.jsonl", work, args.threads)
            if "seconds" in r:
                r["events_per_s"] = round(r.get("events", len(evts)) / r["seconds"])
            runs[engine].append(r)
    results = {engine: _median(done) for engine, done in runs.items()}
    out = {"events": len(evts), "edges": edges, "tweets": tweets, "engines": results,
           "settings": vars(args), "load_average_end": os.getloadavg()}
    _print(out)
    return out


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median time (of several, ``--repeat``), with every run's seconds beside."""
    if len(runs) == 1:
        return runs[0]
    timed = sorted((r for r in runs if "seconds" in r), key=lambda r: r["seconds"])
    if len(timed) < len(runs):  # a failed run is what to show
        return next(r for r in runs if "seconds" not in r)
    return {**timed[(len(timed) - 1) // 2], "repeats_s": [round(r["seconds"], 2) for r in runs]}


def _print_sizes(runs: list[dict[str, Any]]) -> None:
    """Each engine's rate at every size, and how its time grew against the events."""
    first, last = runs[0], runs[-1]
    counts = " → ".join(f"{r['events']:,}" for r in runs)
    print(f"\nby size: {counts} events (×{last['events'] / first['events']:.2f}); "
          "events/s at each size, then seconds at the last size ÷ at the first")
    for engine in first["engines"]:
        rates = [r["engines"].get(engine, {}).get("events_per_s") for r in runs]
        a, b = first["engines"][engine], last["engines"].get(engine, {})
        grew = f"×{b['seconds'] / a['seconds']:.2f}" if "seconds" in a and "seconds" in b else "—"
        shown = " ".join(f"{rate:>9,}" if rate else f"{'—':>9}" for rate in rates)
        print(f"{engine:<16} {shown}  {grew}")


def _print(out: dict[str, Any]) -> None:
    results = out["engines"]
    base = results.get("join", {}).get("events_per_s")
    print(f"\n{out['events']:,} events; load average at the end {out['load_average_end']}")
    print(f"{'engine':<16} {'seconds':>8} {'events/s':>9} {'× join':>7}  view")
    for engine, r in results.items():
        if "error" in r:
            print(f"{engine:<16} {r['error']}")
            continue
        ratio = f"{r['events_per_s'] / base:.2f}" if base else "—"
        check = "equal" if r["equal"] else f"NOT EQUAL ({r.get('divergent', r.get('mismatches'))})"
        print(f"{engine:<16} {r['seconds']:8.1f} {r['events_per_s']:9,} {ratio:>7}  {check}")
        if "repeats_s" in r:
            shown = ", ".join(f"{x:.1f}" for x in r["repeats_s"])
            print(f"{'':<16} (the median of {len(r['repeats_s'])} runs: {shown} s)")
        if "submit_s" in r:
            print(f"{'':<16} (Flink SQL, {r['mode']}, parallelism {r['parallelism']}, heap "
                  f"{r['heap']}: {r['submit_s']:.1f} s of it planning and deploying the job)")
        if "warmup_events" in r:
            print(f"{'':<16} (the job running on the first {r['warmup_events']:,} events; "
                  f"the other {r['events']:,} produced in {r['produce_s']:.1f} s while it ran)")
        if "steady_events_per_s" in r:
            steady = r["steady_events_per_s"]
            ratio = f"{steady / base:.2f}" if base else "—"
            print(f"{'  running':<16} {r['seconds'] - r['startup_s']:8.1f} {steady:9,} {ratio:>7}"
                  f"  (after the first batch, {r['startup_s']:.1f} s: {r['first_batch_records']:,}"
                  f" records, worker start and query planning)")


if __name__ == "__main__":
    sys.exit(main())
