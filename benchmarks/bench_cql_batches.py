"""Timeline adds sent a statement each, or batched as the writer batches them.

    .venv/bin/python benchmarks/bench_cql_batches.py              # ~2 min
    .venv/bin/python benchmarks/bench_cql_batches.py --rows 20000 --rounds 1
    .venv/bin/python benchmarks/bench_cql_batches.py --modes columns --per-user 100 \
        --rows 100000 --rounds 4 --commitlog group,batch,periodic --name commitlog

Starts one local Cassandra node (:class:`infra.services.cassandra.LocalCassandra`), makes a
keyspace with the schema, and writes ``--rows`` timeline adds through a
:class:`~views.stores.cassandra.store.CassandraStore` as the sink's tasks open it, in
two shapes: 25 rows per user
(a follow backfill, a busy timeline) and one row per user (a fan-out to many
followers). Each shape is written three ways, alternating for ``--rounds``: one
statement per row (``single``), as ops batched the way the writer batches them
(``batched``: :func:`~views.stores.cassandra.statements.units`, a batch per
partition, small partitions packed per replica set), and as the sink writes timeline
adds (``columns``: the same batches built from int64 columns,
:func:`~views.stores.cassandra.executor.column_requests`). ``--modes chunks`` adds a
fourth way, a layout the store does not have: one row per user holding the user's rows
of the batch as a blob (24 bytes a row) in a table made for it (``home_chunks``), a
statement each — what a timeline kept as a row per user per batch, merged at read,
would cost the node. Reported per way: rows/s, rows
per client CPU-second (this process) and per Cassandra CPU-second (``utime + stime``
of the node's JVM). ``--commitlog`` repeats it all on a fresh node for each way the
node syncs its commit log before acknowledging a write, ``--memtable`` for each
memtable the node's tables default to (``skiplist``, ``trie``), and ``--jit`` for how
far the node's JVM compiles (``c1``, ``c2``); each node's start (seconds to its first
answer, and its CPU-seconds by then) is recorded too. Results go to
``benchmarks/results/cql-batches.json`` (``--name``).
"""

from __future__ import annotations

import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import ROOT, argument_parser, save

sys.path.insert(0, str(ROOT))

from infra.services.cassandra import (  # noqa: E402
    COMMITLOG_SYNC,
    JIT,
    JITS,
    MEMTABLE,
    MEMTABLES,
    LocalCassandra,
)
from views.stores.cassandra import parse_url  # noqa: E402
from views.stores.cassandra import statements as cql  # noqa: E402
from views.stores.cassandra.schema import apply_at  # noqa: E402
from views.stores.cassandra.store import CassandraStore  # noqa: E402


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _adds(rows: int, per_user: int) -> list[cql.Op]:
    base = random.randint(1, 10**12)
    return [("home_add", (user, base + i, base + i * 7 + user, 5, 10**15))
            for user in range(rows // per_user) for i in range(per_user)]


#: The ``chunks`` way's table: a user's rows of one batch in one cell.
CHUNKS = ("CREATE TABLE IF NOT EXISTS home_chunks (user_id bigint, batch_ts bigint, body blob, "
          "PRIMARY KEY ((user_id), batch_ts)) WITH CLUSTERING ORDER BY (batch_ts DESC) "
          "AND compaction = {'class': 'LeveledCompactionStrategy'}")
CHUNK_INSERT = "INSERT INTO home_chunks (user_id, batch_ts, body) VALUES (?, ?, ?) USING TIMESTAMP ?"


def _chunks(session: Any, columns: np.ndarray, concurrency: int) -> None:
    """One statement per user: its rows' (created_at, tweet_id, author_id) as big-endian int64s."""
    from cassandra.concurrent import execute_concurrent

    insert = session.prepare(CHUNK_INSERT)
    order = np.argsort(columns[:, 0], kind="stable")
    users, starts = np.unique(columns[order, 0], return_index=True)
    bodies = np.split(columns[order, 1:4].astype(">i8"), starts[1:])
    ts = int(columns[0, 4])
    execute_concurrent(session, [(insert, (int(u), ts, b.tobytes(), ts))
                                 for u, b in zip(users, bodies, strict=True)],
                       concurrency=concurrency, raise_on_first_error=True)


#: The ``map`` way's table: a user's entries as cells of one map, keyed (created_at, tweet_id).
MAP = ("CREATE TABLE IF NOT EXISTS home_map (user_id bigint, bucket int, "
       "cells map<frozen<tuple<bigint, bigint>>, bigint>, PRIMARY KEY ((user_id), bucket)) "
       "WITH CLUSTERING ORDER BY (bucket DESC) "
       "AND compaction = {'class': 'LeveledCompactionStrategy'}")
MAP_ADD = "UPDATE home_map USING TIMESTAMP ? SET cells = cells + ? WHERE user_id = ? AND bucket = 0"


def _map(session: Any, columns: np.ndarray, concurrency: int) -> None:
    """One statement per user: its rows as cells of the user's map, a cell per row."""
    from cassandra.concurrent import execute_concurrent

    add = session.prepare(MAP_ADD)
    order = np.argsort(columns[:, 0], kind="stable")
    users, starts = np.unique(columns[order, 0], return_index=True)
    ts = int(columns[0, 4])
    statements = []
    for user, part in zip(users, np.split(columns[order, 1:4], starts[1:]), strict=True):
        cells = {(int(c), int(t)): int(a) for c, t, a in part.tolist()}
        statements.append((add, (ts, cells, int(user))))
    execute_concurrent(session, statements, concurrency=concurrency, raise_on_first_error=True)


def _one(writer: CassandraStore, ops: list[cql.Op], mode: str, node_pid: int) -> dict[str, Any]:
    columns = np.array([params for _, params in ops], dtype=np.int64)
    own, node, start = _own_cpu(), _cpu(node_pid), time.perf_counter()
    if mode == "map":
        _map(writer._require(), columns, writer.config.concurrency)
    elif mode == "chunks":
        _chunks(writer._require(), columns, writer.config.concurrency)
    elif mode == "single":  # no PARTITION_KEY statement: each op its own request
        groups = [[i] for i in range(len(ops))]
        writer._run_groups(ops, groups)
    elif mode == "batched":
        writer._run(ops)
    else:  # as the sink writes timeline adds: int64 columns, serialized in bulk
        writer._run([], columns=[("home_add", columns)])
    wall = time.perf_counter() - start
    own, node = _own_cpu() - own, _cpu(node_pid) - node
    return {"mode": mode, "rows": len(ops), "wall_s": round(wall, 2),
            "rows_per_s": round(len(ops) / wall),
            "rows_per_client_cpu_s": round(len(ops) / max(own, 1e-9)),
            "rows_per_node_cpu_s": round(len(ops) / max(node, 1e-9))}


def main() -> None:
    parser = argument_parser(__doc__.splitlines()[0], name="cql-batches", rounds=2)
    parser.add_argument("--rows", type=int, default=30000, help="rows per shape and way")
    parser.add_argument("--heap-mb", type=int, default=512)
    parser.add_argument("--modes", default="single,batched,columns",
                        help="ways to send the rows, in turn: single, batched, columns, chunks, map "
                             "(default the first three, the store's)")
    parser.add_argument("--per-user", default="25,1", help="shapes: rows per user")
    parser.add_argument("--commitlog", default="batch",
                        help="the node's commit-log syncs to compare, a node each: "
                             f"{', '.join(COMMITLOG_SYNC)} (default batch, the stack's)")
    parser.add_argument("--memtable", default=MEMTABLE,
                        help="the node's memtables to compare, a node each: "
                             f"{', '.join(MEMTABLES)} (default {MEMTABLE}, the stack's)")
    parser.add_argument("--jit", default=JIT,
                        help="how far the node's JVM compiles, a node each: "
                             f"{', '.join(JITS)} (default {JIT}, the stack's)")
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    starts: list[dict[str, Any]] = []
    nodes = [(c, m, j) for c in args.commitlog.split(",") for m in args.memtable.split(",")
             for j in args.jit.split(",")]
    for commitlog, memtable, jit in nodes:
        with tempfile.TemporaryDirectory(prefix="fanout-cql-") as tmp, \
                LocalCassandra(Path(tmp) / "node", Path(tmp) / "node.log",
                               heap_mb=args.heap_mb, commitlog=commitlog,
                               memtable=memtable, jit=jit) as node:
            start = {"commitlog": commitlog, "memtable": memtable, "jit": jit,
                     "started_s": round(node.started_in or 0.0, 1),
                     "node_cpu_s_at_start": round(_cpu(node.pid), 1)}
            print(start, flush=True)
            starts.append(start)
            url = node.url("bench_batches")
            apply_at(url)
            writer = CassandraStore.for_tasks(parse_url(url)).open()
            if "chunks" in args.modes.split(","):
                writer._require().execute(CHUNKS)
            if "map" in args.modes.split(","):
                writer._require().execute(MAP)
            try:
                for per_user in map(int, args.per_user.split(",")):
                    for _ in range(args.rounds):
                        for mode in args.modes.split(","):
                            run = _one(writer, _adds(args.rows, per_user), mode, node.pid)
                            run.update(rows_per_user=per_user, commitlog=commitlog,
                                       memtable=memtable, jit=jit)
                            print(run, flush=True)
                            runs.append(run)
            finally:
                writer.close()
    print(save(args.name, {"args": vars(args), "starts": starts, "runs": runs}))


if __name__ == "__main__":
    main()
