"""The job's decode alone: Kafka records → source rows → packed buckets, one process.

    .venv/bin/python benchmarks/bench_decode.py [--edges 300000] [--tweets 50000]

The records are ``bench_parts.events(edges, tweets)`` encoded as the producer writes
them (``ingest.events.encode``). Each round runs what the job's ``mapInArrow`` runs per
record, :func:`views.source.event_row` then :meth:`views.packed.Packer.add`, and packs
the lot once (:meth:`~views.packed.Packer.batch`). No Spark and no Kafka: this is the
Python part of the decode stage, measured without the cores it shares in the job.
Prints the best of ``--rounds`` in µs a record; results go to
``benchmarks/results/NAME.json``.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from bench_parts import events
from harness import ROOT, argument_parser, save

sys.path.insert(0, str(ROOT))

from ingest.events import encode  # noqa: E402
from ingest.history import topic_of  # noqa: E402
from views.packed import Packer  # noqa: E402
from views.source import event_row  # noqa: E402


def records(edges: int, tweets: int) -> list[tuple[str, int, int, bytes, bytes, int]]:
    """(topic, partition, offset, key, value, bucket) of every event, as the job sees them."""
    with tempfile.TemporaryDirectory(prefix="fanout-decode-") as work:
        made = events(edges, tweets, Path(work))
    out = []
    for offset, event in enumerate(made):
        key, value = encode(event)
        out.append((topic_of(json.loads(value)), offset % 4, offset, key, value, int(key) % 64))
    return out


def main() -> None:
    ap = argument_parser(__doc__.split("\n\n")[0], name="decode", tweets=50_000, edges=300_000,
                         rounds=3)
    args = ap.parse_args()
    recs = records(args.edges, args.tweets)
    seconds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        packer = Packer()
        for topic, partition, offset, key, value, bucket in recs:
            packer.add(bucket, event_row(topic, partition, offset, key, value))
        packed = packer.batch()
        seconds.append(time.perf_counter() - start)
        if packed.num_rows != 64:
            raise SystemExit(f"packed {packed.num_rows} buckets, expected 64")
    best = min(seconds)
    print(f"{len(recs):,} records: best of {args.rounds} {best:.2f} s, "
          f"{best / len(recs) * 1e6:.1f} µs a record ({len(recs) / best:,.0f} records/s)")
    print(f"written to {save(args.name, {'args': vars(args), 'records': len(recs), 'seconds': seconds, 'us_per_record': round(best / len(recs) * 1e6, 2)})}")


if __name__ == "__main__":
    main()
