"""The processor's own work without Spark: per author, and per micro-batch at a given state size.

    .venv/bin/python benchmarks/bench_codec.py [--edges 1000000] [--tweets 60000]
        [--batch 100000]
    .venv/bin/python benchmarks/bench_codec.py --state-users 20000 200000 1000000
        [--steady-authors 150] [--bulk-records 50000] [--processor MODULE:CLASS]
        [--page-bytes N]

**Per author** (the default). The events are ``bench_parts.events(edges, tweets)``,
cut into micro-batches of ``--batch`` events and grouped by key, as the job's
processor gets them. For every author a batch touches, what the processor runs per
author is timed in three parts: :func:`views.codec.decode_state` of the stored bytes,
:func:`views.join.apply_batch`, :func:`views.codec.encode_state` of the result.
Times are split by the author's follower count after the batch (most touched
authors have a handful). The size of the encoded state at the end (what the job's
state store holds, page headers aside) is printed too.

**Per micro-batch** (``--state-users``). For each user count N, a follow graph of
10 N edges (``ingest.generator.popularity``'s Zipf law, as ``bench_freshness.py``'s
``--users N --follows 10N``) is loaded into the processor (``--processor``, the job's
:class:`~views.processor.JoinProcessor` by default) through its own
``handleInputRows``, one bulk call per key bucket, against an in-memory state store
that counts state calls and the bytes they move. Then it runs micro-batches the way
the job hands them over (packed rows per bucket, :mod:`views.packed`): *steady* ones,
a post by each of ``--steady-authors`` authors (every 7th user, as
``bench_freshness.py`` posts), and *bulk* ones, ``--bulk-records`` new follows. Per
batch it reports the processor's Python CPU time (the join, the codec, the layout; the
in-memory store costs next to nothing), the state calls, the bytes read and
written, and what Spark's state store would add for them at DESIGN §10's ~120–260 µs
a call and ~35 ns a byte read and written back (``docs/capacity.md`` V9), plus V9's
fixed cost of a processor call net of its two state calls. Results go to
``benchmarks/results/NAME.json``, stamped with the commit, the machine and the date.
"""

from __future__ import annotations

import argparse
import importlib
import marshal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import pandas as pd
from bench_parts import events
from harness import ROOT, argument_parser, save
from pyspark.sql.streaming.stateful_processor import (
    MapState,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)

sys.path.insert(0, str(ROOT))

from ingest.events import TOPIC_RANK  # noqa: E402
from ingest.generator import popularity  # noqa: E402
from views.codec import decode_state, encode_state  # noqa: E402
from views.join import Change, JoinConfig, apply_batch  # noqa: E402
from views.row import Kind  # noqa: E402

CLASSES = ("< 10", "10–99", "100–999", "≥ 1000")
BUCKETS = 64
#: DESIGN §10: a state call is a round trip to the JVM, ~120–260 µs.
CALL_S = (120e-6, 260e-6)
#: docs/capacity.md V9: ~35 ns a byte of state read and written back, i.e. per byte moved.
BYTE_S = 17.5e-9
#: V9: the fixed wall time of a processor call, which includes two state calls.
PROCESSOR_CALL_S = 0.81e-3
#: Spark's map-state iterator returns this many entries a round trip
#: (``spark.sql.execution.arrow.transformWithStateInPySpark.maxStateRecordsPerBatch``).
ITERATOR_BATCH = 10_000


def size_class(followers: int) -> str:
    return CLASSES[min(3, len(str(followers)) - 1)]


# -- per author ---------------------------------------------------------------------------

def bench_authors(args: argparse.Namespace) -> dict[str, Any]:
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
    return {"events": len(evts), "authors": dict(touched),
            "seconds": {part: dict(spent) for part, spent in seconds.items()},
            "total_seconds": totals,
            "state": {"keys": len(stored), "bytes": state_bytes}}


# -- an in-memory state store that counts what Spark's would be asked ---------------------

class Meter:
    """State calls and the bytes they carry, since the last :meth:`reset`."""

    def __init__(self) -> None:
        self.calls = self.read = self.written = 0

    def reset(self) -> dict[str, int]:
        seen = {"calls": self.calls, "read": self.read, "written": self.written}
        self.calls = self.read = self.written = 0
        return seen


def _bytes(value: tuple) -> int:
    return sum(len(v) if isinstance(v, bytes) else 8 for v in value)


class MeteredHandle(StatefulProcessorHandle):
    """The processor's handle: value and map states in dicts, one per grouping key."""

    def __init__(self) -> None:
        self.key: Any = None
        self.meter = Meter()
        self.values: dict[str, dict[Any, tuple]] = {}
        self.maps: dict[str, dict[Any, dict[tuple, tuple]]] = {}

    def getValueState(self, stateName: str, schema: Any,
                      ttlDurationMs: int | None = None) -> ValueState:
        return MeteredValue(self, self.values.setdefault(stateName, {}))

    def getMapState(self, stateName: str, userKeySchema: Any, valueSchema: Any,
                    ttlDurationMs: int | None = None) -> MapState:
        return MeteredMap(self, self.maps.setdefault(stateName, {}))

    def state_bytes(self) -> int:
        held = sum(_bytes(v) for values in self.values.values() for v in values.values())
        return held + sum(_bytes(k) + _bytes(v) for maps in self.maps.values()
                          for entries in maps.values() for k, v in entries.items())


class MeteredValue(ValueState):
    def __init__(self, handle: MeteredHandle, store: dict[Any, tuple]) -> None:
        self.handle, self.store, self.meter = handle, store, handle.meter

    def exists(self) -> bool:
        self.meter.calls += 1
        return self.handle.key in self.store

    def get(self) -> tuple | None:
        self.meter.calls += 1
        value = self.store.get(self.handle.key)
        self.meter.read += _bytes(value) if value is not None else 0
        return value

    def update(self, newValue: tuple) -> None:
        self.meter.calls += 1
        self.meter.written += _bytes(newValue)
        self.store[self.handle.key] = newValue

    def clear(self) -> None:
        self.meter.calls += 1
        self.store.pop(self.handle.key, None)


class MeteredMap(MapState):
    def __init__(self, handle: MeteredHandle, store: dict[Any, dict[tuple, tuple]]) -> None:
        self.handle, self.store, self.meter = handle, store, handle.meter

    def _map(self) -> dict[tuple, tuple]:
        return self.store.setdefault(self.handle.key, {})

    def exists(self) -> bool:
        self.meter.calls += 1
        return bool(self.store.get(self.handle.key))

    def getValue(self, key: tuple) -> tuple | None:
        self.meter.calls += 1
        value = self._map().get(key)
        self.meter.read += _bytes(value) if value is not None else 0
        return value

    def containsKey(self, key: tuple) -> bool:
        self.meter.calls += 1
        return key in self._map()

    def updateValue(self, key: tuple, value: tuple) -> None:
        self.meter.calls += 1
        self.meter.written += _bytes(value)
        self._map()[key] = value

    def iterator(self) -> Iterator[tuple[tuple, tuple]]:
        entries = list(self._map().items())
        self.meter.calls += 1 + len(entries) // ITERATOR_BATCH
        self.meter.read += sum(_bytes(k) + _bytes(v) for k, v in entries)
        return iter(entries)

    def keys(self) -> Iterator[tuple]:
        return (k for k, _ in self.iterator())

    def values(self) -> Iterator[tuple]:
        return (v for _, v in self.iterator())

    def removeKey(self, key: tuple) -> None:
        self.meter.calls += 1
        self._map().pop(key, None)

    def clear(self) -> None:
        self.meter.calls += 1
        self.store.pop(self.handle.key, None)


# -- per micro-batch ---------------------------------------------------------------------

Keyed = dict[int, list[tuple]]


def _processor(spec: str, config: JoinConfig, page_bytes: int | None) -> StatefulProcessor:
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(config) if page_bytes is None else cls(config, page_bytes=page_bytes)


def _bucket(author: int) -> int:
    """Stands in for Spark's ``pmod(xxhash64(key), 64)``: any hash independent of the pages."""
    return hash((author, BUCKETS)) % BUCKETS


def _by_bucket(keyed: Keyed) -> dict[int, Keyed]:
    out: dict[int, Keyed] = defaultdict(dict)
    for author, changes in keyed.items():
        out[_bucket(author)][author] = changes
    return out


def _follows(rng: np.random.Generator, users: int, n: int, probs: np.ndarray,
             first_offset: int) -> Keyed:
    """``n`` follows (follower uniform, followee by popularity) as the packer keys them."""
    followee = rng.choice(users, n, p=probs) + 1
    follower = rng.integers(1, users + 1, n)
    at = rng.integers(1_600_000_000_000, 1_700_000_000_000, n)
    keyed: Keyed = defaultdict(list)
    rank, kind = TOPIC_RANK["follows"], int(Kind.FOLLOW)
    for i, (g, f, t) in enumerate(zip(followee.tolist(), follower.tolist(), at.tolist(),
                                      strict=True)):
        keyed[g].append((t, rank, first_offset + i, kind, 0, f, 0, None, None))
    return keyed


def _posts(rng: np.random.Generator, users: int, n: int, first_offset: int) -> Keyed:
    """A post by each of ``n`` distinct authors among every 7th user."""
    authors = rng.choice(np.arange(1, users + 1, 7), n, replace=False).tolist()
    rank, kind, now = TOPIC_RANK["tweets"], int(Kind.POST), int(time.time() * 1000)
    return {a: [(now, rank, first_offset + i, kind, 2_000_000_000_000 + first_offset + i,
                 0, 0, f"fresh {i}", None)] for i, a in enumerate(authors)}


def run_batch(processor: StatefulProcessor, handle: MeteredHandle, keyed: Keyed
              ) -> dict[str, Any]:
    """One micro-batch: every bucket's packed row through ``handleInputRows``, timed."""
    buckets = _by_bucket(keyed)
    frames = {b: pd.DataFrame({"rows": [marshal.dumps((k, [], [("tweets", 0, 1, 1)]), 4)]})
              for b, k in buckets.items()}
    handle.meter.reset()
    deltas = 0
    start = time.process_time()  # CPU, not wall: the box may be busy with other work
    for bucket, frame in frames.items():
        handle.key = (bucket,)
        for out in processor.handleInputRows((bucket,), iter([frame]), TimerValues()):
            deltas += sum(map(len, out["deltas"]))
    spent = time.process_time() - start
    seen = handle.meter.reset()
    moved = (seen["read"] + seen["written"]) * BYTE_S
    return {"records": sum(map(len, keyed.values())), "authors": len(keyed),
            "buckets": len(frames), "python_s": spent, **seen, "delta_bytes": deltas,
            "modeled_s": [spent + len(frames) * (PROCESSOR_CALL_S - 2 * c) + seen["calls"] * c
                          + moved for c in CALL_S]}


def bench_state(users: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(11)
    probs = popularity(users, rng, max(1, users // 2000), 0.2, 0.9, 10 * users)
    processor = _processor(args.processor, JoinConfig.with_ratio(800, 1000), args.page_bytes)
    handle = MeteredHandle()
    processor.init(handle)
    load = run_batch(processor, handle, _follows(rng, users, 10 * users, probs, 0))
    state = handle.state_bytes()
    print(f"\n{users:,} users: loaded {load['records']:,} follows in {load['python_s']:.1f} s "
          f"({load['calls']:,} state calls); state {state / 1e6:.1f} MB")
    offset = 10 * users
    runs: dict[str, list[dict[str, Any]]] = {"steady": [], "bulk": []}
    for name, repeat in (("steady", args.repeat), ("bulk", max(1, args.repeat // 3))):
        for _ in range(repeat):
            keyed = (_posts(rng, users, args.steady_authors, offset) if name == "steady"
                     else _follows(rng, users, args.bulk_records, probs, offset))
            offset += sum(map(len, keyed.values()))
            runs[name].append(run_batch(processor, handle, keyed))
            _print_batch(name, runs[name][-1])
    return {"users": users, "follows": 10 * users, "state_bytes": state, "load": load,
            "batches": runs, "median": {name: _medians(r) for name, r in runs.items()}}


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("python_s", "calls", "read", "written", "buckets", "authors")
    out: dict[str, Any] = {k: median(r[k] for r in runs) for k in keys}
    out["modeled_s"] = [median(r["modeled_s"][i] for r in runs) for i in range(len(CALL_S))]
    return out


def _print_batch(name: str, r: dict[str, Any]) -> None:
    lo, hi = r["modeled_s"]
    print(f"  {name:<6} {r['records']:>7,} records {r['authors']:>6,} authors "
          f"{r['buckets']:>3} buckets: python {r['python_s'] * 1e3:8.1f} ms, "
          f"{r['calls']:>6,} calls, read {r['read'] / 1e6:7.2f} MB, "
          f"written {r['written'] / 1e6:7.2f} MB; with Spark's state store "
          f"{lo * 1e3:7.0f}–{hi * 1e3:.0f} ms")


def main() -> None:
    ap = argument_parser(__doc__.split("\n\n")[0], name="codec", tweets=60_000, edges=1_000_000)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--state-users", type=int, nargs="+", default=None, metavar="N",
                    help="time micro-batches at these users' worth of state instead")
    ap.add_argument("--steady-authors", type=int, default=150)
    ap.add_argument("--bulk-records", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=6, help="steady batches (bulk: a third)")
    ap.add_argument("--processor", default="views.processor:JoinProcessor",
                    help="MODULE:CLASS of the processor to run (the job's by default)")
    ap.add_argument("--page-bytes", type=int, default=None,
                    help="the processor's page_bytes (default: its own)")
    args = ap.parse_args()
    result: dict[str, Any]
    if args.state_users:
        result = {"states": [bench_state(n, args) for n in args.state_users]}
    else:
        result = bench_authors(args)
    result |= {"args": vars(args)}
    print(f"written to {save(args.name, result)}")


if __name__ == "__main__":
    main()
