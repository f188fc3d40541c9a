"""The executor sink's requests on many users: a request a profile and a merge read, or packed.

    .venv/bin/python benchmarks/bench_sink_requests.py          # ~8 min → sink-requests.json
    .venv/bin/python benchmarks/bench_sink_requests.py --users 2000 --follows 30000 --tweets 20000
    .venv/bin/python benchmarks/bench_sink_requests.py --ways packed --jits c1,c2 --name sink-jit

A history of ``--users`` users (``ingest.generator.generate``) goes through the pure
join (:class:`views.local.LocalJoin`) in batches of ``--batch-events`` events; each
batch's deltas are then written by the sink's two stages as the executors run them
(:func:`~views.stores.cassandra.sink.tweet_stage`, then
:func:`~views.stores.cassandra.sink.user_stage`, two tasks a stage, in this process,
no Spark), into a keyspace of one local node (:class:`infra.services.cassandra.LocalCassandra`),
once for each way, each in a keyspace of its own:

- ``packed``: as the store writes (profiles packed like the other small partitions,
  the partitions a batch merges or wipes read 100 users an ``IN`` read);
- ``single``: a profile a request and a merged or wiped partition a read, as
  ``cql.PARTITION_KEY`` and ``cql.LOOKUP_IN`` stood before they named them.

A way named ``packed+T4`` (or any UCS scaling parameter: ``L4``, ``L10``, ``T8`` …)
writes as ``packed`` into a ``home_chunks`` compacted by Cassandra 5's
UnifiedCompactionStrategy with that parameter, instead of the schema's levelled one::

    .venv/bin/python benchmarks/bench_sink_requests.py --ways packed,packed+T4,packed+L4 \
        --name sink-compaction

``--jits c1,c2`` runs the ways on a fresh node for each JIT
(:data:`infra.services.cassandra.JITS`), to weigh C2's compiled code against its
compiling over a long steady load.

Reported a way and a batch: the requests and round trips of each stage, the ops by
statement, this process's CPU (the driver's threads included) and the node's
(``utime + stime`` of its JVM, by thread group); and over the batches, CPU per timeline
entry added. After a way's last batch the node is left to settle (flushes and the
compactions they start, until it uses under a tenth of a core for 2 s, at most
:data:`SETTLE_S`); ``node_us_per_add_settled`` counts that CPU too. On 20,000 users a batch gives a user tens of entries, as a catch-up of a
large graph does; on the demo's 2,000, hundreds.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from harness import ROOT, argument_parser, save, threads_cpu

sys.path.insert(0, str(ROOT))

from infra.services.cassandra import JIT, JITS, LocalCassandra  # noqa: E402
from ingest.generator import generate  # noqa: E402
from views.delta import Delta  # noqa: E402
from views.join import JoinConfig  # noqa: E402
from views.local import LocalJoin  # noqa: E402
from views.sink import deltas_table  # noqa: E402
from views.stores.cassandra import statements as cql  # noqa: E402
from views.stores.cassandra.schema import apply_at  # noqa: E402
from views.stores.cassandra.sink import ExecutorSink, tweet_stage, user_stage  # noqa: E402
from views.stores.cassandra.store import CassandraStore, close_task_stores  # noqa: E402
from views.stores.contract import BatchStats  # noqa: E402
from views.stores.sqlite import SQLiteStore  # noqa: E402

TASKS = 2
#: Longest a way waits for the node to go idle after its last batch (seconds).
SETTLE_S = 300
#: What ``single`` takes out of the store's tables of packed writes and ``IN`` lookups.
UNPACKED = {"user_set": cql.PARTITION_KEY["user_set"], "user_gone": cql.PARTITION_KEY["user_gone"]}
UNLOOKED = {"home_get": cql.LOOKUP_IN["home_get"]}


class Recording(SQLiteStore):
    """The join's store: SQLite in memory, every batch's deltas kept."""

    def __init__(self, cap: int) -> None:
        super().__init__(":memory:", cap=cap)
        self.recorded: list[list[Delta]] = []

    def apply(self, deltas: Any, batch_id: int = -1) -> BatchStats:
        self.recorded.append(list(deltas))
        return super().apply(self.recorded[-1], batch_id)


class Counted:
    """The store's requests, runs and ops by statement, by the stage that made them."""

    def __init__(self) -> None:
        self.stage = "driver"
        self.ops: Counter[str] = Counter()
        self.runs: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()
        run_groups = CassandraStore._run_groups

        def counting(store: CassandraStore, ops: Any, groups: Any, *args: Any) -> Any:
            if ops:
                self.runs[self.stage] += 1
                self.requests[self.stage] += len(groups)
                self.ops.update(f"{self.stage} {name}" for name, _ in ops)
            return run_groups(store, ops, groups, *args)

        CassandraStore._run_groups = counting  # type: ignore[method-assign,assignment]

    def clear(self) -> None:
        for counter in (self.ops, self.runs, self.requests):
            counter.clear()


def batches(args: Any) -> list[list[Delta]]:
    history = generate(args.users, args.follows, args.tweets, seed=3)
    events = sorted(history.events(), key=lambda e: e.created_at)
    recorded = Recording(args.cap)
    join = LocalJoin(JoinConfig(cap=args.cap, promote_at=1000, demote_below=900),
                     recorded.open())
    for i in range(0, len(events), args.batch_events):
        join.run(events[i:i + args.batch_events])
    print(f"{len(events):,} events in {len(recorded.recorded)} batches", flush=True)
    return recorded.recorded


def one_batch(sink: ExecutorSink, deltas: list[Delta], batch_id: int, counted: Counted,
              node: LocalCassandra) -> dict[str, Any]:
    counted.clear()
    before, cpu, wall = threads_cpu(node.pid), time.process_time(), time.perf_counter()
    counted.stage = "driver"
    ts, digest = sink.begin(batch_id)
    counted.stage = "stage 1"
    routed = pa.Table.from_batches(list(tweet_stage(
        sink.open_store, ts, list(range(TASKS)), iter(deltas_table(deltas).to_batches()))))
    stage1 = time.process_time()
    counted.stage = "stage 2"
    tallies = [SimpleNamespace(**row) for task in range(TASKS)
               for batch in user_stage(sink.open_store, ts, iter(routed.filter(
                   pc.equal(routed.column("route"), task)).to_batches()), 0)
               for row in batch.to_pylist()]
    stage2 = time.process_time()
    counted.stage = "driver"
    stats = sink.finish(batch_id, ts, digest, tallies, 0.0)
    spent = {k: v - before.get(k, 0.0) for k, v in threads_cpu(node.pid).items()}
    node_s = spent.pop("")
    return {"deltas": len(deltas), "timeline_adds": stats.timeline_adds,
            "wall_s": round(time.perf_counter() - wall, 2),
            "client_cpu_s": {"stage 1": round(stage1 - cpu, 2), "stage 2": round(stage2 - stage1, 2),
                             "all": round(time.process_time() - cpu, 2)},
            "node_cpu_s": round(node_s, 2),
            "node_by_threads": {k: round(v, 1) for k, v in
                                sorted(spent.items(), key=lambda kv: -kv[1])[:5]},
            "runs": dict(counted.runs), "requests": dict(counted.requests),
            "ops": dict(counted.ops.most_common(16))}


def way(name: str, url: str, recorded: list[list[Delta]], counted: Counted,
        node: LocalCassandra, cap: int) -> dict[str, Any]:
    if name == "single":
        for key in UNPACKED:
            cql.PARTITION_KEY.pop(key, None)
        for key in UNLOOKED:
            cql.LOOKUP_IN.pop(key, None)
    else:
        cql.PARTITION_KEY.update(UNPACKED)
        cql.LOOKUP_IN.update(UNLOOKED)
    apply_at(url)
    store = CassandraStore.from_url(url, cap=cap)
    store.open()
    _, _, scaling = name.partition("+")
    if scaling:
        store._require().execute(
            "ALTER TABLE home_chunks WITH compaction = {'class': "
            f"'UnifiedCompactionStrategy', 'scaling_parameters': '{scaling}'}}")
    try:
        sink = ExecutorSink(store)
        out = []
        for batch_id, deltas in enumerate(recorded):
            out.append(one_batch(sink, deltas, batch_id, counted, node))
            row = out[-1]
            print(f"[{name}] batch {batch_id}: {row['timeline_adds']:,} adds, "
                  f"{sum(row['requests'].values()):,} requests, client {row['client_cpu_s']['all']} "
                  f"CPU-s, node {row['node_cpu_s']} CPU-s", flush=True)
    finally:
        store.close()
        close_task_stores()
    settle_s, waited = settle(node)
    adds = sum(r["timeline_adds"] for r in out)
    node_s = sum(r["node_cpu_s"] for r in out)
    print(f"[{name}] the node settled in {waited:.0f}s, {settle_s:.1f} CPU-s", flush=True)
    return {"batches": out, "timeline_adds": adds,
            "requests": sum(sum(r["requests"].values()) for r in out),
            "client_us_per_add": round(sum(r["client_cpu_s"]["all"] for r in out) / adds * 1e6, 2),
            "node_us_per_add": round(node_s / adds * 1e6, 2),
            "settle": {"cpu_s": round(settle_s, 1), "waited_s": round(waited, 1)},
            "node_us_per_add_settled": round((node_s + settle_s) / adds * 1e6, 2)}


def settle(node: LocalCassandra) -> tuple[float, float]:
    """Wait for the node to go idle (under a tenth of a core for 2 s, at most
    :data:`SETTLE_S`); the CPU it spent meanwhile, and how long it took."""
    first = last = threads_cpu(node.pid)[""]
    began = time.monotonic()
    while time.monotonic() - began < SETTLE_S:
        time.sleep(2.0)
        now = threads_cpu(node.pid)[""]
        idle, last = now - last < 0.2, now
        if idle:
            break
        if int(time.monotonic() - began) % 10 < 2:
            print(f"  settling: {last - first:.0f} CPU-s so far", flush=True)
    return last - first, time.monotonic() - began


def main() -> int:
    ap = argument_parser(__doc__.splitlines()[0], name="sink-requests", users=20_000,
                         follows=300_000, tweets=40_000)
    ap.add_argument("--batch-events", type=int, default=60_000, help="events a batch")
    ap.add_argument("--cap", type=int, default=800)
    ap.add_argument("--ways", default="single,packed",
                    help="in the order run; packed+T4 (a UCS scaling parameter) compacts "
                         "home_chunks with UCS")
    ap.add_argument("--jits", default=JIT,
                    help=f"how far the node's JVM compiles, one fresh node each in this order "
                         f"({', '.join(JITS)}); with more than one, a result is WAY@JIT")
    args = ap.parse_args()
    recorded = batches(args)
    counted = Counted()
    result: dict[str, Any] = {"args": vars(args)}
    jits = args.jits.split(",")
    for jit in jits:
        with tempfile.TemporaryDirectory(prefix="fanout-sink-requests-") as work:
            node = LocalCassandra(Path(work) / "node", jit=jit).start()
            try:
                for name in args.ways.split(","):
                    key = name if len(jits) == 1 else f"{name}@{jit}"
                    result[key] = way(name, node.url(f"requests_{name.replace('+', '_').lower()}"),
                                      recorded, counted, node, args.cap)
                    print(f"[{key}] {result[key]['requests']:,} requests; client "
                          f"{result[key]['client_us_per_add']} µs, node "
                          f"{result[key]['node_us_per_add']} µs a timeline add", flush=True)
            finally:
                node.stop()
    print(f"results: {save(args.name, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
