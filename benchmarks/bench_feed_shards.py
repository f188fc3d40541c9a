"""What an API process's change feed costs it per batch: all feed shards, or some.

    .venv/bin/python benchmarks/bench_feed_shards.py                  # ~1 min, one node
    .venv/bin/python benchmarks/bench_feed_shards.py --homes 40000 --batches 40 \
        --hosts 127.0.0.1:9042                                         # an existing node

Starts one local Cassandra node (:class:`infra.services.cassandra.LocalCassandra`; ``--hosts``:
use a running one instead), makes a keyspace with the schema, and writes ``--batches``
batches' change rows as the job's writers do (``Changes.ops``, then the batch marked
committed): each batch names ``--homes`` random users' home pages out of ``--users``,
spread over ``--writers`` writers (a row per feed shard each touched), and
``--tweets`` tweets with as many authors, a tenth as many profiles and originals (the
rows shard). Then an API process's tokens take the batches in, one committed batch at
a time as :class:`serving.pageversions.FeedVersions` does (``feed.since`` and the
take-in of each batch), reading every shard (``all``, the default) or a quarter of them
(``quarter``: ``FANOUT_FEED_SHARDS=1/4``), the two alternating for ``--rounds``.
Reported per reading: feed rows and ids decoded per batch, this process's CPU per batch
(the read, the decode and the take-in) and its wall time, and the node's CPU per batch
(``utime + stime`` of its JVM, when it is the local one). Results go to
``benchmarks/results/feed-shards.json`` (``--name``).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from harness import ROOT, argument_parser, cpu_seconds, save

sys.path.insert(0, str(ROOT))

from infra.services.cassandra import LocalCassandra  # noqa: E402
from serving.pageversions import FeedVersions  # noqa: E402
from serving.settings import parse_shards  # noqa: E402
from views.stores.cassandra.changes import CassandraFeed, Changes, committed_op  # noqa: E402
from views.stores.cassandra.schema import apply_at  # noqa: E402
from views.stores.cassandra.store import CassandraStore  # noqa: E402

READINGS = {"all": "all", "quarter": "1/4"}


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _write(store: CassandraStore, args: argparse.Namespace) -> list[int]:
    """The batches' change rows and commits; their timestamps, oldest first."""
    rng = random.Random(args.seed)
    stamps, ts = [], int(time.time() * 1_000_000)
    tweet = 10**15
    for _ in range(args.batches):
        ts += 1_000_000
        homes = rng.sample(range(1, args.users + 1), args.homes)
        authors = rng.sample(range(1, args.users + 1), args.tweets)
        tweets = range(tweet, tweet + args.tweets)
        tweet += args.tweets
        ops = []
        for w in range(args.writers):  # a tweet stage's rows and a user stage's, as tasks do
            share = slice(w * len(homes) // args.writers, (w + 1) * len(homes) // args.writers)
            part = slice(w * args.tweets // args.writers, (w + 1) * args.tweets // args.writers)
            ops += Changes(frozenset(homes[share]), frozenset(authors[part]),
                           frozenset(tweets[part]), frozenset(authors[part][::10]),
                           originals=frozenset(tweets[part][::10])).ops(ts)
        store._run(ops)
        store._run([committed_op(ts)])
        stamps.append(ts)
    return stamps


def _read(store: CassandraStore, stamps: list[int], reading: str, node_pid: int | None
          ) -> dict[str, Any]:
    """Take every batch in, one at a time, as an API process of ``reading``'s shards."""
    shards = parse_shards(READINGS[reading])
    feed = CassandraFeed(store, store._rows).for_shards(shards)
    versions = FeedVersions(store, feed, shards=shards)
    own, node, start = _own_cpu(), cpu_seconds(node_pid), time.perf_counter()
    seen = stamps[0] - 1
    for ts in stamps:
        batches = feed.since(seen, ts)
        assert batches is not None and len(batches) == 1
        with versions._lock:
            versions._take_in(ts, batches)
        seen = ts
    wall, own, node = time.perf_counter() - start, _own_cpu() - own, cpu_seconds(node_pid) - node
    n = len(stamps)
    return {"reading": reading, "shards": READINGS[reading], "batches": n,
            "rows_per_batch": round(feed.rows_read / n, 1),
            "ids_per_batch": round(feed.ids_read / n),
            "pages_indexed": len(versions._touched),
            "cpu_ms_per_batch": round(own * 1000 / n, 2),
            "wall_ms_per_batch": round(wall * 1000 / n, 2),
            "node_cpu_ms_per_batch": round(node * 1000 / n, 2) if node_pid else None}


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    parser = argument_parser(__doc__.splitlines()[0], name="feed-shards", users=1_000_000,
                             rounds=3)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--homes", type=int, default=20_000, help="home pages a batch names")
    parser.add_argument("--tweets", type=int, default=200, help="tweets (and authors) a batch")
    parser.add_argument("--writers", type=int, default=4, help="writers (tasks) of a batch")
    parser.add_argument("--seed", type=int, default=54)
    parser.add_argument("--hosts", default="", help="a running node (host:port) instead")
    parser.add_argument("--heap-mb", type=int, default=512)
    args = parser.parse_args()
    print("command: .venv/bin/python benchmarks/bench_feed_shards.py " + " ".join(sys.argv[1:]),
          flush=True)
    runs: list[dict[str, Any]] = []
    with ExitStack() as stack:
        node_pid = None
        if args.hosts:
            url = f"cassandra://{args.hosts}/bench_feed_shards_{os.getpid()}"
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fanout-feed-")))
            node = stack.enter_context(LocalCassandra(tmp / "node", tmp / "node.log",
                                                      heap_mb=args.heap_mb))
            url, node_pid = node.url("bench_feed_shards"), node.pid
        apply_at(url)
        store = CassandraStore.from_url(url).open()
        try:
            stamps = _write(store, args)
            for _ in range(args.rounds):
                for reading in READINGS:
                    run = _read(store, stamps, reading, node_pid)
                    print(run, flush=True)
                    runs.append(run)
            if args.hosts:
                store._require().execute(f"DROP KEYSPACE IF EXISTS {store.config.keyspace}",
                                         timeout=120)
        finally:
            store.close()
    summary = {r: {k: _median([x[k] for x in runs if x["reading"] == r])
                   for k in ("rows_per_batch", "ids_per_batch", "cpu_ms_per_batch",
                             "wall_ms_per_batch", "node_cpu_ms_per_batch")
                   if runs[0][k] is not None}
               for r in READINGS}
    print("median per reading:", summary)
    print(save(args.name, {"args": vars(args), "runs": runs, "median": summary}))


if __name__ == "__main__":
    main()
