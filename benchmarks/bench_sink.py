"""Timeline rows/s through the join: Cassandra from the executors vs SQLite from the driver.

    .venv/bin/python benchmarks/bench_sink.py                    # defaults below
    .venv/bin/python benchmarks/bench_sink.py --users 5000 --tweets 40000
    .venv/bin/python benchmarks/bench_sink.py --users 2000 --follows 30000 --tweets 20000 \
        --mix social --celebrity-threshold 300 --name sink-demo   # the demo's history
    ... --commitlog group --name sink-demo-group                  # the node syncing per 10 ms
    FANOUT_CASSANDRA_HOSTS=127.0.0.1:9042 .venv/bin/python benchmarks/bench_sink.py

One broker, one synthetic history produced once, one SparkSession; then the view
query drains the same topics (``availableNow``, a fresh checkpoint each) once per
store: SQLite through the driver sink (``views.sink.Sink``: the batch collected to
the driver, one transaction) and Cassandra through the executor sink
(``views.stores.cassandra.sink``: two stages of Spark tasks, no batch on the driver), in
the order ``--order`` gives. Each figure is timeline rows written (adds, after the
horizon filter) over the wall time of the drain, Spark's join included, and over
the time spent in the sink calls alone, and the CPU the drain took by kind of process
(``pipeline.process_kind``): the client's (the driver, the Spark JVM and its Python
workers: everything but the broker and the node) and the local node's, each in all and
a timeline row (a process that ends during the drain loses its CPU). A local Cassandra
node is started unless ``FANOUT_CASSANDRA_HOSTS`` names one; its RSS is reported. A sample of users is
verified against the SQL so that a fast wrong answer does not count. Results go to
``benchmarks/results/sink.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from contextlib import ExitStack
from typing import Any

from harness import ROOT, argument_parser, save
from pipeline import cassandra_keyspace, cpu_by_kind, percentile, scratch

sys.path.insert(0, str(ROOT))

from infra.checks.verify import verify  # noqa: E402
from infra.services.broker import KafkaBroker  # noqa: E402
from infra.services.spark import build_session  # noqa: E402
from ingest.generator import generate  # noqa: E402
from ingest.producer import ChangelogProducer  # noqa: E402
from ingest.settings import KafkaSettings  # noqa: E402
from ingest.social import POSTS_ONLY, SOCIAL  # noqa: E402
from ingest.topics import create_topics  # noqa: E402
from views.job import job_sink, start_query  # noqa: E402
from views.settings import ViewSettings  # noqa: E402
from views.stores import store_from_url  # noqa: E402


def _produce(kafka: KafkaSettings, args: argparse.Namespace) -> int:
    mix = SOCIAL if args.mix == "social" else POSTS_ONLY
    history = generate(args.users, args.follows, args.tweets, seed=args.seed, mix=mix)
    events = list(history.events())
    with ChangelogProducer(kafka) as producer:
        for event in events:
            producer.send(event)
        assert producer.flush(120) == 0
    return len(events)


def _cpu(before: defaultdict[str, float], after: defaultdict[str, float], rows: int) -> dict[str, Any]:
    used = {k: round(after[k] - before[k], 2) for k in after if after[k] - before[k] > 0}
    client = sum(v for k, v in used.items() if k not in ("broker", "cassandra"))
    node = used.get("cassandra", 0.0)
    return {"cpu_s": used, "client_cpu_s": round(client, 2),
            "client_us_per_row": round(client / max(rows, 1) * 1e6, 2),
            "node_cpu_s": node, "node_us_per_row": round(node / max(rows, 1) * 1e6, 2)}


def _drain(spark: Any, kafka: KafkaSettings, view: ViewSettings, args: argparse.Namespace,
           label: str) -> dict[str, Any]:
    with store_from_url(view.store_url, cap=view.timeline_cap) as store:
        sink = job_sink(view, store, spool=False)
        before = cpu_by_kind()
        start = time.perf_counter()
        query = start_query(spark, kafka, view, store, available_now=True, sink=sink)
        if not query.awaitTermination(args.timeout):
            query.stop()
            raise TimeoutError(f"{label}: not drained within {args.timeout}s")
        if query.exception() is not None:
            raise RuntimeError(f"{label}: {query.exception()}")
        wall = time.perf_counter() - start
        after = cpu_by_kind()
        batches = [s for _, _, s in sink.history]
        sink_s = sum(seconds for _, seconds, _ in sink.history)
        adds = sum(s.timeline_adds for s in batches)
        checked = verify(kafka, store, view.timeline_cap, sample=args.verify_sample)
    seconds = [s for _, s, _ in sink.history]
    return {"sink": type(sink).__name__, "wall_s": round(wall, 2),
            "sink_s": round(sink_s, 2), "batches": len(batches), "timeline_rows": adds,
            "timeline_rows_per_s": round(adds / wall), "rows_per_sink_s": round(adds / sink_s),
            "batch_p50_s": round(percentile(seconds, 0.5), 2),
            "batch_p99_s": round(percentile(seconds, 0.99), 2), **_cpu(before, after, adds),
            "verify": checked.render().splitlines()[0], "verify_ok": checked.ok}


def main() -> int:
    parser = argument_parser(__doc__.split("\n\n")[0], name="sink", users=3000, follows=40_000,
                             tweets=12_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-records", type=int, default=None,
                        help="records a micro-batch at most (default: each store's own)")
    parser.add_argument("--mix", choices=("posts", "social"), default="posts",
                        help="the history's records: posts and follows, or the demo's mix")
    parser.add_argument("--celebrity-threshold", type=int, default=1000)
    parser.add_argument("--heap-mb", type=int, default=768,
                        help="the local Cassandra node's heap (the stack's)")
    parser.add_argument("--commitlog", default="batch",
                        help="the local node's commitlog_sync: batch (the stack's), group, "
                             "periodic")
    parser.add_argument("--order", default="sqlite,cassandra")
    parser.add_argument("--verify-sample", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    result: dict[str, Any] = {"args": vars(args)}
    with ExitStack() as stack:
        work = stack.enter_context(scratch("fanout-bench-sink-"))  # removed last
        broker = stack.enter_context(KafkaBroker(work / "kafka"))
        hosts = os.environ.get("FANOUT_CASSANDRA_HOSTS")
        node = None
        if not hosts:
            from infra.services.cassandra import LocalCassandra

            node = stack.enter_context(LocalCassandra(work / "cassandra", heap_mb=args.heap_mb,
                                                      commitlog=args.commitlog))
            hosts = node.hosts
        kafka = KafkaSettings(bootstrap=broker.bootstrap, partitions=4, topic_prefix="s_")
        create_topics(kafka)
        result["events"] = _produce(kafka, args)
        spark = build_session("fanout-bench-sink", shuffle_partitions=2)
        stack.callback(spark.stop)
        for label in args.order.split(","):
            url = (f"sqlite:///{work / 'v.sqlite'}" if label == "sqlite" else cassandra_keyspace(hosts))
            view = ViewSettings(store_url=url, checkpoint_dir=work / f"ck-{label}",
                                max_records_per_batch=args.max_records, shuffle_partitions=2,
                                celebrity_threshold=args.celebrity_threshold)
            print(f"draining into {label} ...", file=sys.stderr, flush=True)
            result[label] = _drain(spark, kafka, view, args, label)
            print(f"  {label}: {result[label]}", file=sys.stderr, flush=True)
        if node is not None:
            result["cassandra_rss_mb"] = round(node.rss_bytes() / 2**20)
    result["cores"] = os.cpu_count()
    print(save(args.name, result))
    return 0 if all(result[k]["verify_ok"] for k in args.order.split(",")) else 1


if __name__ == "__main__":
    sys.exit(main())
