"""Timeline adds by layout: a row an entry, a map cell an entry, a blob a user a batch.

    .venv/bin/python benchmarks/bench_cql_batches.py              # ~2 min
    .venv/bin/python benchmarks/bench_cql_batches.py --rows 20000 --rounds 1
    .venv/bin/python benchmarks/bench_cql_batches.py --modes rows,map,chunks --per-user 100,1000 \
        --rows 200000 --rounds 2 --name map-cells-1000
    .venv/bin/python benchmarks/bench_cql_batches.py --per-user 100 --rows 100000 --rounds 4 \
        --commitlog group,batch,periodic --name commitlog
    .venv/bin/python benchmarks/bench_cql_batches.py --modes dead-if,dead --per-user 200 \
        --rows 400 --rounds 3 --name dead-letters

Starts one local Cassandra node (:class:`infra.services.cassandra.LocalCassandra`), makes a
keyspace with the schema, and writes ``--rows`` timeline adds in each shape of
``--per-user`` (rows per user: 25, a follow backfill or a busy timeline; 1, a fan-out
to many followers), each of the ``--modes`` in turn, alternating for ``--rounds``:

- ``rows``: a row an entry, in a table made for it (``home_rows``: the clustering
  ``(created_at, tweet_id)``, ``author_id``), an unlogged batch a user (at most 256
  rows), run concurrently: the layout the store kept before ``home_chunks``;
- ``map``: a cell an entry of a map a user (``home_map``, keyed ``(created_at,
  tweet_id)``), one ``UPDATE`` a user;
- ``dead`` and ``dead-if``: the rows as dead letters instead, ``--per-user`` letters a
  ``dead_letters`` partition: as the store writes them (an upsert at a timestamp that
  falls as the sighting's time grows, :func:`~views.stores.cassandra.statements.first_seen_ts`),
  or as the conditional inserts (``IF NOT EXISTS``, a Paxos round each) it wrote before;
- ``chunks``: as the store writes them (:func:`~views.stores.cassandra.statements.add_ops`
  through :class:`~views.stores.cassandra.store.CassandraStore`): a ``home_chunks`` row a
  user a batch, the user's entries one blob;
- ``chunks+meta``: the same with each user's ``timeline_meta`` row
  (:func:`~views.stores.cassandra.statements.meta_ops`) in the user's one request;
- ``chunks-then-meta``: the same as two runs, a request each: the adds, then the meta;
- ``chunks+blob``: as ``chunks+meta``, each user's meta one blob cell of a table made for
  it (``meta_blob``) instead of ``timeline_meta``'s five cells;
- ``chunks+static``: each user's adds and meta as one insert into a table made for it
  (``home_static``: ``home_chunks`` with the meta as static columns), one partition
  mutation a user;
- ``meta-read``: the read before those writes, the users' ``timeline_meta`` rows 100 an
  ``IN`` (``meta_get_in``), of the users the ways before it wrote.

``chunks`` and the ways after it weigh a user's batch on the sink's steady shape, a few
entries a user::

    .venv/bin/python benchmarks/bench_cql_batches.py \
        --modes chunks,chunks-then-meta,chunks+meta,chunks+blob,chunks+static,meta-read \
        --per-user 4 --rows 100000 --rounds 5 --name user-batch

Reported per way: rows/s, rows per client CPU-second (this process) and per Cassandra
CPU-second (``utime + stime`` of the node's JVM). ``--commitlog`` repeats it all on a
fresh node for each way the node syncs its commit log before acknowledging a write,
``--memtable`` for each memtable the node's tables default to (``skiplist``,
``trie``), and ``--jit`` for how far the node's JVM compiles (``c1``, ``c2``); each
node's start (seconds to its first answer, and its CPU-seconds by then) is recorded
too. Results go to ``benchmarks/results/cql-batches.json`` (``--name``).
"""

from __future__ import annotations

import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import ROOT, argument_parser, cpu_seconds, save

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
from views.stores.rows import DeadRow  # noqa: E402


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _adds(rows: int, per_user: int) -> np.ndarray:
    """``(user, created_at, tweet, author, ts)`` rows: ``per_user`` a user, a fresh ``ts``."""
    base = random.randint(1, 10**12)
    return np.array([(user, base + i * 7 + user, base + i, 5, 10**15 + base)
                     for user in range(rows // per_user) for i in range(per_user)], np.int64)


#: The ``rows`` way's table: a row an entry.
ROWS = ("CREATE TABLE IF NOT EXISTS home_rows (user_id bigint, created_at bigint, tweet_id bigint, "
        "author_id bigint, PRIMARY KEY ((user_id), created_at, tweet_id)) "
        "WITH CLUSTERING ORDER BY (created_at DESC, tweet_id DESC) "
        "AND compaction = {'class': 'LeveledCompactionStrategy'}")
ROW_INSERT = ("INSERT INTO home_rows (user_id, created_at, tweet_id, author_id) "
              "VALUES (?, ?, ?, ?) USING TIMESTAMP ?")
#: The ``map`` way's table: a user's entries as cells of one map, keyed (created_at, tweet_id).
MAP = ("CREATE TABLE IF NOT EXISTS home_map (user_id bigint, bucket int, "
       "cells map<frozen<tuple<bigint, bigint>>, bigint>, PRIMARY KEY ((user_id), bucket)) "
       "WITH CLUSTERING ORDER BY (bucket DESC) "
       "AND compaction = {'class': 'LeveledCompactionStrategy'}")
MAP_ADD = "UPDATE home_map USING TIMESTAMP ? SET cells = cells + ? WHERE user_id = ? AND bucket = 0"
#: The ``chunks+static`` way's table: ``home_chunks`` with timeline_meta's values static.
HOME_STATIC = ("CREATE TABLE IF NOT EXISTS home_static (user_id bigint, batch_ts bigint, "
               "adds blob, horizon_created_at bigint static, horizon_tweet_id bigint static, "
               "size int static, read_at bigint static, chunks int static, "
               "PRIMARY KEY ((user_id), batch_ts)) WITH CLUSTERING ORDER BY (batch_ts DESC) "
               "AND compaction = {'class': 'LeveledCompactionStrategy'}")
HOME_STATIC_SET = ("INSERT INTO home_static (user_id, batch_ts, adds, horizon_created_at, "
                   "horizon_tweet_id, size, read_at, chunks) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                   "USING TIMESTAMP ?")
#: The ``chunks+blob`` way's meta: a user's five timeline_meta values as one blob cell.
META_BLOB = "CREATE TABLE IF NOT EXISTS meta_blob (user_id bigint PRIMARY KEY, meta blob)"
META_BLOB_SET = "INSERT INTO meta_blob (user_id, meta) VALUES (?, ?) USING TIMESTAMP ?"


def _by_user(columns: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """The ``(user, created_at, tweet, author, ts)`` rows split by user."""
    order = np.argsort(columns[:, 0], kind="stable")
    users, starts = np.unique(columns[order, 0], return_index=True)
    return list(zip(users.tolist(), np.split(columns[order], starts[1:]), strict=True))


def _rows(session: Any, columns: np.ndarray, concurrency: int) -> None:
    """An unlogged batch a user (at most 256 rows), a row an entry."""
    from cassandra.concurrent import execute_concurrent
    from cassandra.query import BatchStatement, BatchType

    insert = session.prepare(ROW_INSERT)
    batches = []
    for _, part in _by_user(columns):
        for start in range(0, len(part), 256):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for row in part[start:start + 256].tolist():
                batch.add(insert, row)
            batches.append((batch, ()))
    execute_concurrent(session, batches, concurrency=concurrency, raise_on_first_error=True)


def _map(session: Any, columns: np.ndarray, concurrency: int) -> None:
    """One statement a user: its rows as cells of the user's map, a cell a row."""
    from cassandra.concurrent import execute_concurrent

    add = session.prepare(MAP_ADD)
    ts = int(columns[0, 4])
    statements = [(add, (ts, {(c, t): a for _, c, t, a, _ in part.tolist()}, user))
                  for user, part in _by_user(columns)]
    execute_concurrent(session, statements, concurrency=concurrency, raise_on_first_error=True)


#: The ``dead-if`` way: a dead letter as a conditional insert (a Paxos round a letter).
DEAD_IF = ("INSERT INTO dead_letters (topic, kafka_partition, kafka_offset, reason, raw, "
           "seen_at) VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS")


def _dead(writer: CassandraStore, columns: np.ndarray, conditional: bool) -> None:
    """A row a dead letter, its user the Kafka partition (a ``dead_letters`` partition)
    and its tweet the offset: as the store writes them, or as conditional inserts."""
    letters = [DeadRow("bench", user, tweet, "bad", b"x") for user, _, tweet, *_ in
               columns.tolist()]
    ops = cql.dead_ops(letters, int(time.time() * 1000))
    if conditional:
        ops = [("dead_if", params[:-1]) for _, params in ops]
    writer._run(ops)


def _one(writer: CassandraStore, columns: np.ndarray, mode: str, node_pid: int
         ) -> dict[str, Any]:
    own, node, start = _own_cpu(), cpu_seconds(node_pid), time.perf_counter()
    if mode == "rows":
        _rows(writer._require(), columns, writer.config.concurrency)
    elif mode == "map":
        _map(writer._require(), columns, writer.config.concurrency)
    elif mode in ("dead", "dead-if"):
        _dead(writer, columns, mode == "dead-if")
    elif mode == "meta-read":
        writer._lookup({"meta_get": np.unique(columns[:, 0]).tolist()})
    else:  # as the store writes a batch's adds (and its users' meta)
        meta: dict[int, cql.Meta] = {}
        if mode != "chunks":
            users, added = np.unique(columns[:, 0], return_counts=True)
            meta = {u: cql.Meta(size=n) for u, n in zip(users.tolist(), added.tolist(),
                                                         strict=True)}
        ts = int(columns[0, 4])
        if mode == "chunks+static":
            ops = []
            for _, (user, at, adds, stamp) in cql.add_ops(columns[:, :4], ts, meta):
                m = meta[user]
                ops.append(("home_static_set", (user, at, adds, m.horizon[0], m.horizon[1],
                                                m.size, m.read_at, m.chunks, stamp)))
            writer._run(ops)
        elif mode == "chunks+blob":
            blobs = [("meta_blob_set", (u, np.array([m.horizon[0], m.horizon[1], m.size,
                                                     m.read_at, m.chunks], ">i8").tobytes(), ts))
                     for u, m in sorted(meta.items())]
            writer._run(cql.add_ops(columns[:, :4], ts, meta) + blobs)
        elif mode == "chunks-then-meta":
            writer._run(cql.add_ops(columns[:, :4], ts, meta))
            writer._run(cql.meta_ops(meta, ts))
        else:
            writer._run(cql.add_ops(columns[:, :4], ts, meta) + cql.meta_ops(meta, ts))
    wall = time.perf_counter() - start
    own, node = _own_cpu() - own, cpu_seconds(node_pid) - node
    return {"mode": mode, "rows": len(columns), "wall_s": round(wall, 2),
            "rows_per_s": round(len(columns) / wall),
            "rows_per_client_cpu_s": round(len(columns) / max(own, 1e-9)),
            "rows_per_node_cpu_s": round(len(columns) / max(node, 1e-9))}


def main() -> None:
    parser = argument_parser(__doc__.splitlines()[0], name="cql-batches", rounds=2)
    parser.add_argument("--rows", type=int, default=30000, help="rows per shape and way")
    parser.add_argument("--heap-mb", type=int, default=512)
    parser.add_argument("--modes", default="rows,chunks",
                        help="layouts to write the rows in, in turn: rows, map, chunks (the "
                             "store's), chunks+meta (with the users' timeline_meta), "
                             "chunks-then-meta (the same, a request each), chunks+blob (the "
                             "meta one blob cell), chunks+static (the meta static), "
                             "meta-read (the read before them); or the rows as dead letters: "
                             "dead (the store's), dead-if (conditional inserts); default "
                             "rows,chunks")
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
                     "node_cpu_s_at_start": round(cpu_seconds(node.pid), 1)}
            print(start, flush=True)
            starts.append(start)
            url = node.url("bench_batches")
            apply_at(url)
            writer = CassandraStore.for_tasks(parse_url(url)).open()
            writer._require().execute(ROWS)
            writer._require().execute(MAP)
            writer._statements["dead_if"] = writer._require().prepare(DEAD_IF)
            writer._require().execute(META_BLOB)
            writer._statements["meta_blob_set"] = writer._require().prepare(META_BLOB_SET)
            cql.PARTITION_KEY["meta_blob_set"] = ("meta_blob", 0)
            writer._require().execute(HOME_STATIC)
            writer._statements["home_static_set"] = writer._require().prepare(HOME_STATIC_SET)
            cql.PARTITION_KEY["home_static_set"] = ("home_static", 0)
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
