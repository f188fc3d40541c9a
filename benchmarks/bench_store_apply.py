"""The SQLite store's apply of burst-sized micro-batches, alone: seconds and memory.

    .venv/bin/python benchmarks/bench_store_apply.py                  # 4 batches of 27k tweets x 78
    .venv/bin/python benchmarks/bench_store_apply.py --batches 6 --fan 100

Each batch is what the view job hands the sink in a tweet burst on ego-twitter: per
tweet a TWEET delta and a FANOUT delta into ``--fan`` random timelines among
``--users`` users (27k tweets x 78 = 2.1M timeline adds, the burst's batch in
``bench_replay.py``). The batches go one after the other into one store file, so
the later ones write into a B-tree already millions of rows deep. Per batch it
prints the apply's wall time, timeline rows/s, and how far the process's RSS rose
above where it stood before the apply (``VmHWM`` reset through ``clear_refs``).
The deltas are built before the clock starts. The store's content is checked at the
end for 200 users: the cache holds exactly their adds above its horizon, and at least
their newest ``cap`` (or all they got). Results go to
``benchmarks/results/store-apply.json``.
"""

from __future__ import annotations

import gc
import random
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, argument_parser, save

sys.path.insert(0, str(ROOT))

from views.delta import Delta, unpack_longs  # noqa: E402
from views.stores.sqlite import SQLiteStore  # noqa: E402


def _status(key: str) -> int:
    """A ``/proc/self/status`` field in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) // 1024
    raise KeyError(key)


def _users(d: Delta) -> list[int]:
    return unpack_longs(d.raw or b"").tolist()


def _batch(rng: random.Random, number: int, tweets: int, fan: int, users: int) -> list[Delta]:
    start = 1_900_000_000_000 + number * 10_000_000
    population = range(1, users + 1)
    deltas = []
    for i in range(tweets):
        tweet = (number * 10_000_000 + i) << 22
        author = rng.randrange(1, users + 1)
        deltas.append(Delta.tweet(tweet, author, start + i, "hello"))
        deltas.append(Delta.fanout(tweet, author, start + i, rng.sample(population, fan)))
    return deltas


def main() -> None:
    ap = argument_parser(__doc__.split("\n\n")[0], name="store-apply", users=80_000)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--tweets", type=int, default=27_000, help="tweets per batch")
    ap.add_argument("--fan", type=int, default=78, help="timelines each tweet reaches")
    args = ap.parse_args()
    rng = random.Random(1)
    rows = []
    sample = set(range(1, args.users + 1, max(1, args.users // 200)))
    expected: dict[int, list[tuple[int, int]]] = {u: [] for u in sample}
    with tempfile.TemporaryDirectory(prefix="fanout-store-apply-") as work:
        store = SQLiteStore(Path(work) / "v.sqlite").open()
        for number in range(args.batches):
            deltas = _batch(rng, number, args.tweets, args.fan, args.users)
            for d in deltas:
                for user in (d.raw and sample.intersection(_users(d))) or ():
                    expected[user].append((d.created_at, d.tweet_id))
            gc.collect()
            before = _status("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            start = time.perf_counter()
            stats = store.apply(deltas, number)
            seconds = time.perf_counter() - start
            row = {"batch": number, "timeline_adds": stats.timeline_adds,
                   "seconds": round(seconds, 2),
                   "rows_per_s": round(stats.timeline_adds / seconds),
                   "rss_rise_mb": _status("VmHWM") - before}
            rows.append(row)
            print(f"batch {number}: {stats.timeline_adds:,} adds in {seconds:.2f}s "
                  f"({row['rows_per_s']:,} rows/s), RSS +{row['rss_rise_mb']} MB", flush=True)
            del deltas
        for user, keys in expected.items():
            horizon = store.horizon(user) or (-1, -1)
            cached = [e.key for e in store.cached(user, None, len(keys) + 1)]
            above = sorted((k for k in keys if k > horizon), reverse=True)
            if cached != above or len(cached) < min(store.cap, len(keys)):
                raise SystemExit(f"store check failed for user {user}: {len(cached)} cached, "
                                 f"{len(above)} above the horizon of {len(keys)} adds")
        store.close()
        print(f"checked {len(expected)} timelines against their adds")
    print(f"written to {save(args.name, {'args': vars(args), 'batches': rows})}")


if __name__ == "__main__":
    main()
