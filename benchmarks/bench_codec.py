"""The processor's per-author work alone: state decode → join → state encode, one process.

    .venv/bin/python benchmarks/bench_codec.py [--edges 1000000] [--tweets 60000]
        [--batch 100000]

The events are ``bench_parts.events(edges, tweets)``, cut into micro-batches of
``--batch`` events and grouped by key, as the job's processor gets them. For every
author a batch touches, what ``JoinProcessor.handleInputRows`` runs per author is
timed in three parts: :func:`views.codec.decode_state` of the stored bytes,
:func:`views.join.apply_batch`, :func:`views.codec.encode_state` of the result.
Times are split by the author's follower count after the batch (most touched
authors have a handful). The size of the encoded state at the end (what the job's
state store holds, bucket headers aside) is printed too. No Spark, no state server:
this is the Python part of the join stage, measured without the cores it shares in
the job. Results go to ``benchmarks/results/NAME.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from bench_parts import events
from pipeline import ROOT, save

sys.path.insert(0, str(ROOT))

from views.codec import decode_state, encode_state  # noqa: E402
from views.join import Change, JoinConfig, apply_batch  # noqa: E402

CLASSES = ("< 10", "10–99", "100–999", "≥ 1000")


def size_class(followers: int) -> str:
    return CLASSES[min(3, len(str(followers)) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--edges", type=int, default=1_000_000)
    ap.add_argument("--tweets", type=int, default=60_000)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--name", default="codec")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fanout-codec-") as work:
        evts = events(args.edges, args.tweets, Path(work))
    config = JoinConfig.with_ratio(800, 1000)
    stored: dict[int, bytes] = {}
    touched: Counter[str] = Counter()
    seconds: dict[str, defaultdict[str, float]] = {
        part: defaultdict(float) for part in ("decode", "join", "encode")}
    clock = time.perf_counter
    offset = 0
    for first in range(0, len(evts), args.batch):
        by_key: dict[int, list[Change]] = defaultdict(list)
        for event in evts[first:first + args.batch]:
            by_key[event.key].append(Change.of(event, offset))
            offset += 1
        for key, changes in by_key.items():
            blob = stored.get(key)
            t0 = clock()
            before = decode_state(blob) if blob is not None else None
            t1 = clock()
            after, _ = apply_batch(before, key, changes, config)
            t2 = clock()
            stored[key] = encode_state(after)
            t3 = clock()
            size = size_class(len(after.followers))
            touched[size] += 1
            for part, spent in (("decode", t1 - t0), ("join", t2 - t1), ("encode", t3 - t2)):
                seconds[part][size] += spent
    print(f"{len(evts):,} events in batches of {args.batch:,}: "
          f"{sum(touched.values()):,} author-batches")
    print(f"{'followers':<10} {'authors':>9} {'decode µs':>10} {'join µs':>8} {'encode µs':>10}")
    for size in CLASSES:
        if touched[size]:
            per = {part: seconds[part][size] / touched[size] * 1e6 for part in seconds}
            print(f"{size:<10} {touched[size]:>9,} {per['decode']:>10.2f} {per['join']:>8.2f} "
                  f"{per['encode']:>10.2f}")
    totals = {part: round(sum(spent.values()), 3) for part, spent in seconds.items()}
    print(f"total s: decode {totals['decode']:.2f}, join {totals['join']:.2f}, "
          f"encode {totals['encode']:.2f}; codec / join {(totals['decode'] + totals['encode']) / totals['join']:.2f}")
    state_bytes = sum(map(len, stored.values()))
    print(f"state at the end: {len(stored):,} keys, {state_bytes:,} bytes encoded, "
          f"{state_bytes / max(1, len(stored)):.0f} bytes a key")
    result = {"args": vars(args), "events": len(evts), "authors": dict(touched),
              "seconds": {part: dict(spent) for part, spent in seconds.items()},
              "total_seconds": totals,
              "state": {"keys": len(stored), "bytes": state_bytes}}
    print(f"written to {save(args.name, result)}")


if __name__ == "__main__":
    main()
