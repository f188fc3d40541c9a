"""What a read costs a Cassandra node when reads arrive spaced out, by the node's timer slack.

    .venv/bin/python benchmarks/bench_cassandra_idle.py              # ~4 min

After each burst of requests, the idle workers of Cassandra's shared request pool
poll for more work in ~10 µs sleeps for ~10 ms before they park. Each wake-up costs
CPU, so a read that arrives alone costs the node several times what the same read
costs in a steady stream; how often a sleeping thread wakes is bounded by its *timer
slack* (:func:`infra.services.process.timer_slack`). This starts one local node
(:class:`infra.services.cassandra.LocalCassandra`) at each slack in ``--slacks-us`` (0: the
system's own, Linux's 50 µs), one after the other, and reads one small row
``--requests`` times at each gap in ``--gaps-ms`` (sleeping between reads; first the
node settles for ``--settle-s``), reporting
the node's CPU (``utime + stime`` of its JVM) per read, with its idle CPU over the
same time taken off (measured before), and the read's latency p50/p99 as the client
sees it. Results go to ``benchmarks/results/cassandra_idle.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import ROOT, argument_parser, cpu_seconds, save

sys.path.insert(0, str(ROOT))

from infra.services.cassandra import TIMER_SLACK_NS, LocalCassandra  # noqa: E402


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _one_node(slack_us: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from cassandra.cluster import Cluster

    with LocalCassandra(work / f"node-{slack_us}", heap_mb=args.heap_mb,
                        timer_slack_ns=slack_us * 1000) as node:
        cluster = Cluster([node.hosts.split(":")[0]], port=node.port)
        try:
            session = cluster.connect()
            session.execute("CREATE KEYSPACE IF NOT EXISTS idle WITH replication = "
                            "{'class': 'SimpleStrategy', 'replication_factor': 1}")
            session.execute("CREATE TABLE IF NOT EXISTS idle.t (k int PRIMARY KEY, v int)")
            session.execute("INSERT INTO idle.t (k, v) VALUES (1, 1)")
            read = session.prepare("SELECT v FROM idle.t WHERE k = 1")
            for _ in range(500):  # warm: JIT, prepared statement, connection
                session.execute(read)
            time.sleep(args.settle_s)  # a new node's own start-up work (compactions) ends
            before = cpu_seconds(node.pid)
            time.sleep(args.idle_s)
            idle = (cpu_seconds(node.pid) - before) / args.idle_s
            out: dict[str, Any] = {"slack_us": slack_us, "idle_cores": round(idle, 4),
                                   "gaps": []}
            for gap_ms in args.gaps_ms:
                time.sleep(1)
                latencies = []
                before, start = cpu_seconds(node.pid), time.perf_counter()
                for _ in range(args.requests):
                    began = time.perf_counter()
                    session.execute(read)
                    latencies.append((time.perf_counter() - began) * 1000)
                    if gap_ms:
                        time.sleep(gap_ms / 1000)
                elapsed = time.perf_counter() - start
                used = cpu_seconds(node.pid) - before - idle * elapsed
                row = {"gap_ms": gap_ms, "node_cpu_ms_per_read":
                       round(max(used, 0.0) / args.requests * 1000, 3),
                       "p50_ms": round(_percentile(latencies, 0.5), 3),
                       "p99_ms": round(_percentile(latencies, 0.99), 3)}
                print(f"slack {slack_us} us: {row}", flush=True)
                out["gaps"].append(row)
            return out
        finally:
            cluster.shutdown()


def main() -> None:
    parser = argument_parser(__doc__.splitlines()[0], name="cassandra_idle")
    parser.add_argument("--slacks-us", type=int, nargs="+",
                        default=[0, TIMER_SLACK_NS // 1000])
    parser.add_argument("--gaps-ms", type=float, nargs="+", default=[0, 1, 5, 20, 100])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--settle-s", type=float, default=30.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--heap-mb", type=int, default=512)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fanout-idle-") as tmp:
        nodes = [_one_node(slack, args, Path(tmp)) for slack in args.slacks_us]
    print(save(args.name, {"args": vars(args), "cores": os.cpu_count(), "nodes": nodes}))


if __name__ == "__main__":
    main()
