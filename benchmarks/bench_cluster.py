"""Graph-phase replay rate: the job on a Spark standalone cluster vs local[2], one run.

    .venv/bin/python benchmarks/bench_cluster.py                       # 50k edges
    .venv/bin/python benchmarks/bench_cluster.py --edges 100000 --tweets 20000
    .venv/bin/python benchmarks/bench_cluster.py --executor-cores 1   # two executor JVMs

Phase 1 of bench_replay (a prefix of the ego-twitter follow graph with generated
tweets merged in, replayed by ``fanout replay`` as fast as possible while the job runs)
is run twice, each time in a process of its own (one SparkContext per JVM: a second
one in the same driver JVM failed to start its Python source runner) on a fresh
broker, store and SparkSession: first in local mode (``local[2]``), then on a master
and worker started here from pyspark's launcher (``infra.services.sparkcluster``), executors in
their own JVMs. It prints
events/s of each, the cluster's start time and the peak RSS of the master, worker,
executor JVM and the executor's Python workers, verifies a sample of users against the
SQL, and writes benchmarks/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

from bench_replay import _graph, _phase
from harness import ROOT, argument_parser, save
from pipeline import pipeline, replay_process, scratch

sys.path.insert(0, str(ROOT))

from infra.checks.verify import compare  # noqa: E402
from infra.services.sparkcluster import LocalSparkCluster  # noqa: E402
from views.changelog import read_changelog  # noqa: E402

MB = 2**20


def _run(args: argparse.Namespace, master: str) -> dict:
    os.environ["FANOUT_SPARK_MASTER"] = master  # build_session reads it
    # On a loaded machine (load average 10-25 on 2 cores here) the driver's Python
    # source runner took longer than the default 15 s to connect back and the query
    # failed at start; allow it more.
    conf = {"spark.python.authenticate.socketTimeout": "120s"}
    if args.executor_cores and not master.startswith("local"):
        # The worker splits its cores into executors of this many cores each.
        conf |= {"spark.executor.cores": str(args.executor_cores),
                 "spark.executor.memory": "768m"}
    chosen = {"kafka_source": args.source} if args.source else {}
    with pipeline(celebrity_threshold=args.celebrity_threshold,
                  max_records=args.max_records, conf=conf, **chosen) as pipe:
        graph = _graph(args.edges, pipe.workdir)
        phase = _phase(pipe, "graph+tweets", lambda: replay_process(
            pipe, [str(graph)], ["--generate-tweets", str(args.tweets)]))
        events = sum(pipe.ends().values())
        check = compare(read_changelog(pipe.kafka), pipe.store, pipe.view.timeline_cap,
                        sample=args.verify_sample)
        return {"master": master, "kafka_source": pipe.view.kafka_source, "events": events, "seconds": phase["seconds"],
                "events_per_s": round(events / phase["seconds"]),
                "batches": phase["batches"], "batch_p50_s": phase["batch_p50_s"],
                "batch_p99_s": phase["batch_p99_s"], "timeline_rows": phase["timeline_rows"],
                "driver_tree_peak_rss_mb": round(pipe.peak_rss / MB),
                "load_average_end": os.getloadavg(),
                "verify": {"users": check.users_checked, "divergent": check.divergent}}


class PeakRss:
    """Peak RSS of each part of the cluster, sampled every half second."""

    def __init__(self, cluster: LocalSparkCluster) -> None:
        self.cluster = cluster
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            for name, value in self.cluster.rss().items():
                self.peak[name] = max(self.peak.get(name, 0), value)


def _child(args: argparse.Namespace, master: str) -> dict:
    """One measurement in a fresh process; its result is a JSON line on stdout."""
    argv = [sys.executable, __file__, "--master", master, "--edges", str(args.edges),
            "--tweets", str(args.tweets), "--celebrity-threshold", str(args.celebrity_threshold),
            "--max-records", str(args.max_records), "--verify-sample", str(args.verify_sample),
            "--executor-cores", str(args.executor_cores),
            *(["--source", args.source] if args.source else [])]
    out = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"the {master} run failed (exit {out.returncode})")
    lines = [line for line in out.stdout.splitlines() if line.startswith('{"master"')]
    return json.loads(lines[-1])


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="cluster", tweets=10_000, edges=50_000)
    ap.add_argument("--celebrity-threshold", type=int, default=500)
    ap.add_argument("--max-records", type=int, default=20_000)
    ap.add_argument("--verify-sample", type=int, default=1000)
    ap.add_argument("--cores", type=int, default=2, help="cores the worker offers")
    ap.add_argument("--executor-cores", type=int, default=0,
                    help="cores per executor (1 with --cores 2: two executor JVMs); "
                         "0: one executor with all of the worker's cores")
    ap.add_argument("--source", default="", help="Kafka source, python or spark (default: "
                    "the job's default)")
    ap.add_argument("--master", help=argparse.SUPPRESS)  # internal: one measurement
    args = ap.parse_args()
    if args.master:
        print(json.dumps(_run(args, args.master)))
        return 0

    local = _child(args, "local[2]")
    print(f"local[2]: {local['events']:,} events in {local['seconds']:.1f}s = "
          f"{local['events_per_s']:,} events/s; {local['verify']}")
    started = time.perf_counter()
    with (scratch("fanout-bench-cluster-") as work,
          LocalSparkCluster(work, cores=args.cores, memory="2g") as cluster):
        start_s = time.perf_counter() - started
        idle = cluster.rss()
        with PeakRss(cluster) as rss:
            remote = _child(args, cluster.master_url)
    remote |= {"cluster_start_s": round(start_s, 1),
               "idle_rss_mb": {k: round(v / MB) for k, v in idle.items()},
               "peak_rss_mb": {k: round(v / MB) for k, v in rss.peak.items()}}
    executors = args.cores // args.executor_cores if args.executor_cores else 1
    remote["executors"] = executors
    print(f"cluster ({args.cores} cores, {executors} executor(s), started in {start_s:.1f}s): "
          f"{remote['events']:,} "
          f"events in {remote['seconds']:.1f}s = {remote['events_per_s']:,} events/s; "
          f"{remote['verify']}")
    print(f"  idle RSS MB {remote['idle_rss_mb']}; peak RSS MB {remote['peak_rss_mb']}")
    print(f"  cluster / local rate: {remote['events_per_s'] / local['events_per_s']:.2f}")
    result = {"local": local, "cluster": remote, "settings": vars(args)}
    print(f"written to {save(args.name, result)}")
    ok = all(r["verify"]["divergent"] == 0 for r in (local, remote))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
