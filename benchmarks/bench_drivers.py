"""Client CPU a CQL request, by Python driver: what a read's requests cost the API.

    .venv/bin/python benchmarks/bench_drivers.py                       # cassandra-driver alone
    python3 -m venv /tmp/drivers && /tmp/drivers/bin/pip install acsylla scyllapy
    .venv/bin/python benchmarks/bench_drivers.py --other-python /tmp/drivers/bin/python
                                                                       # ~2 min → drivers.json

One local Cassandra node (as the stack starts it) and a table of 1,000 rows; each
driver, in a process of its own, reads one row by key ``--requests`` times one at a
time, then in runs of 8 at once, through a prepared statement, and reports its process's
CPU a request. ``cassandra-driver`` (the project's, with its Cython build) runs as the
store runs it: synchronous calls and ``execute_concurrent``. ``acsylla`` (the DataStax
C++ driver) and ``scyllapy`` (the Rust driver) are asyncio clients, awaited one at a
time and gathered 8 at once; they are not the project's dependencies, so they run in
the interpreter ``--other-python`` names, where they are installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import ROOT, argument_parser, save

sys.path.insert(0, str(ROOT))

from infra.services.cassandra import LocalCassandra  # noqa: E402

QUERY = "SELECT k, v FROM bench.kv WHERE k = ?"

CLIENT = r'''
import asyncio, json, sys, time
which, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
Q = %(query)r
out = {}

def timed(label, run):
    t = time.process_time(); run(); out[label] = round((time.process_time() - t) / n * 1e6, 1)

if which == "cassandra-driver":
    from cassandra.cluster import Cluster
    from cassandra.concurrent import execute_concurrent_with_args
    cluster = Cluster(["127.0.0.1"], port=port); s = cluster.connect()
    s.execute("CREATE KEYSPACE IF NOT EXISTS bench WITH replication = "
              "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    s.execute("CREATE TABLE IF NOT EXISTS bench.kv (k int PRIMARY KEY, v text)")
    ins = s.prepare("INSERT INTO bench.kv (k, v) VALUES (?, ?)")
    execute_concurrent_with_args(s, ins, [(i, "x" * 40) for i in range(1000)], concurrency=50)
    p = s.prepare(Q)
    for i in range(500): s.execute(p, (i %% 1000,))
    timed("one_at_a_time_us", lambda: [s.execute(p, (i %% 1000,)) for i in range(n)])
    timed("eight_at_once_us", lambda: [execute_concurrent_with_args(
        s, p, [((i + j) %% 1000,) for j in range(8)], concurrency=8) for i in range(0, n, 8)])
    cluster.shutdown()
else:
    async def main():
        if which == "acsylla":
            import acsylla
            session = await acsylla.create_cluster(["127.0.0.1"], port=port).create_session(
                keyspace="bench")
            prepared = await session.create_prepared(Q)
            async def one(k):
                st = prepared.bind(); st.bind_list([k])
                return [r.as_tuple() for r in await session.execute(st)]
        else:
            from scyllapy import Scylla
            session = Scylla([f"127.0.0.1:{port}"], keyspace="bench"); await session.startup()
            prepared = await session.prepare(Q)
            async def one(k):
                return (await session.execute(prepared, [k])).all()
        for i in range(500): await one(i %% 1000)
        t = time.process_time()
        for i in range(n): await one(i %% 1000)
        out["one_at_a_time_us"] = round((time.process_time() - t) / n * 1e6, 1)
        t = time.process_time()
        for i in range(0, n, 8): await asyncio.gather(*(one((i + j) %% 1000) for j in range(8)))
        out["eight_at_once_us"] = round((time.process_time() - t) / n * 1e6, 1)
    asyncio.run(main())
print(json.dumps(out))
''' % {"query": QUERY}


def client(python: str, which: str, port: int, n: int) -> dict[str, float]:
    done = subprocess.run([python, "-c", CLIENT, which, str(port), str(n)], capture_output=True,
                          text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{which} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argument_parser(__doc__.splitlines()[0], name="drivers", rounds=2)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--other-python", default="",
                    help="an interpreter with acsylla and scyllapy installed (default: skip them)")
    args = ap.parse_args()
    drivers = [("cassandra-driver", sys.executable)]
    if args.other_python:
        drivers += [("acsylla", args.other_python), ("scyllapy", args.other_python)]
    result: dict[str, list[dict[str, float]]] = {name: [] for name, _ in drivers}
    with tempfile.TemporaryDirectory(prefix="fanout-drivers-") as work:
        with LocalCassandra(Path(work) / "node", Path(work) / "node.log") as node:
            for round_ in range(args.rounds):
                for name, python in drivers:
                    result[name].append(client(python, name, node.port, args.requests))
                    print(f"round {round_ + 1} {name}: {json.dumps(result[name][-1])}", flush=True)
    print(f"results: {save(args.name, {'args': vars(args), 'drivers': result})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
