"""The Cassandra schema applied to a fresh keyspace on a ring: the apply against a wait a statement.

    .venv/bin/python benchmarks/run.py run schema                  # ~3 min here → results/schema.json
    .venv/bin/python benchmarks/run.py run schema --rounds 1 --nodes 3 --name schema-smoke

A ring of ``--nodes`` Cassandra nodes (:class:`infra.services.cassandraring.CassandraRing`,
on 127.0.0.1..N) starts in a scratch directory. Each round applies the whole schema to
two fresh keyspaces at RF N, one each way, the order alternating from round to round:

- ``apply``: :func:`views.stores.cassandra.schema.apply_at`, as ``fanout schema apply``
  and ``fanout up --nodes 3`` run it: every statement through one coordinator, the
  nodes asked to agree only where another node must know the schema;
- ``each``: the same statements and data steps, each sent where the driver's load
  balancing sends it and each followed by the driver's own wait for schema agreement
  (its default: what the apply did before).

After each, every node is asked on its own for the keyspace's tables, which must all
be there. Reported: each way's seconds a round, their median and the ratio.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import ROOT, argument_parser, save

sys.path.insert(0, str(ROOT))

from infra.services.cassandraring import CassandraRing, node_cluster  # noqa: E402
from views.stores.cassandra.config import parse_url  # noqa: E402
from views.stores.cassandra.schema import (  # noqa: E402
    DATA_STEPS,
    DDL_TIMEOUT,
    VERSION_TABLE,
    apply_at,
    connect,
    keyspace_cql,
    load_steps,
)


def each(url: str) -> None:
    """Every statement where the driver sends it, each with the driver's agreement wait."""
    config = parse_url(url)
    cluster, session = connect(config, 120)
    try:
        session.execute(keyspace_cql(config.keyspace, config.replication.cql_map()),
                        timeout=DDL_TIMEOUT)
        session.set_keyspace(config.keyspace)
        session.execute(VERSION_TABLE, timeout=DDL_TIMEOUT)
        for step in load_steps():
            for statement in step.statements:
                session.execute(statement, timeout=DDL_TIMEOUT)
            if step.version in DATA_STEPS:
                DATA_STEPS[step.version](session)
            session.execute("INSERT INTO schema_version (version, name, applied_at) "
                            "VALUES (%s, %s, %s)", (step.version, step.name, 0))
    finally:
        cluster.shutdown()


def tables_on_each_node(url: str) -> list[int]:
    """How many tables of the keyspace each node lists, asked alone."""
    config = parse_url(url)
    counts = []
    for host in config.hosts:
        cluster = node_cluster(host, config.port)
        try:
            rows = cluster.connect().execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s",
                (config.keyspace,))
            counts.append(len(list(rows)))
        finally:
            cluster.shutdown()
    return counts


def main() -> None:
    parser = argument_parser(__doc__.splitlines()[0], name="schema", rounds=3)
    parser.add_argument("--nodes", type=int, default=3, help="nodes in the ring "
                        "(default: %(default)s)")
    args = parser.parse_args()
    ways = {"apply": lambda url: apply_at(url, wait=120), "each": each}
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    with tempfile.TemporaryDirectory(prefix="bench-schema-") as scratch:
        ring = CassandraRing(Path(scratch) / "cassandra", Path(scratch) / "logs",
                             nodes=args.nodes)
        began = time.monotonic()
        ring.start()
        print(f"{args.nodes}-node ring up in {time.monotonic() - began:.1f}s", flush=True)
        try:
            for i in range(args.rounds):
                order = list(ways) if i % 2 == 0 else list(reversed(ways))
                for way in order:
                    url = ring.url(f"bench_{way}_{i}")
                    began = time.monotonic()
                    ways[way](url)
                    took = time.monotonic() - began
                    tables = tables_on_each_node(url)
                    assert len(set(tables)) == 1 and tables[0] > 0, (way, tables)
                    seconds[way].append(round(took, 2))
                    print(f"round {i + 1}, {way}: {took:.1f}s; tables on each node {tables}",
                          flush=True)
        finally:
            ring.stop()
    result: dict[str, Any] = {"args": vars(args), "seconds": seconds,
                              "median_s": {w: statistics.median(s) for w, s in seconds.items()}}
    result["each_over_apply"] = round(result["median_s"]["each"] / result["median_s"]["apply"], 2)
    print(f"median: apply {result['median_s']['apply']:.1f}s, a wait a statement "
          f"{result['median_s']['each']:.1f}s ({result['each_over_apply']}x)")
    print(save(args.name, result))


if __name__ == "__main__":
    main()
