"""An uncached first home page: requests and client CPU a page, by the size of the first batch.

    .venv/bin/python benchmarks/bench_first_page.py [--stores sqlite,cassandra] \
        [--shares 1.5,2,2.5] [--rounds 3] [--pages 800]     # ~4 min → first_page.json

A page reads its candidates in batches (``serving.timeline._first_batch``, then as
many more as the filter's share says; the bench sets the first one's size), and each batch costs a round of reads (the
candidates' rows, then their originals, profiles and reposts). On a networked store
a round is several requests, and each costs the driver far more CPU than a row does,
so the first batch's size decides most of what an uncached page costs there.

For each store, ``fanout up --store STORE`` in a scratch run directory and the
demo's history (``fanout generate --users 2000 --follows 30000 --tweets 20000``, the
social mix) replayed; once the view has caught up, with the job idle, this process
reads first pages (limit 20) of distinct random users through the API's own path
(``serving.reads.Read``: assemble, filter, hydrate, render; no page cache), with the
first batch at ``limit × share + 1`` for each share, in turns for ``--rounds``
rounds. Reported a share: the median over rounds of the process's CPU a page (the
driver's I/O thread included), split into the reading thread's (the read path, and the
driver's work to send) and the other threads' (the driver's I/O thread: receiving and
decoding), the wall time a page, and the driver's requests a page (Cassandra) with the
statements they ran.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psutil
from bench_store_reads import caught_up, fanout
from harness import ROOT, argument_parser, save
from pipeline import scratch

sys.path.insert(0, str(ROOT))

import serving.timeline as timeline  # noqa: E402
from infra.stack.stack import Stack  # noqa: E402
from serving.reads import Read, home_fn  # noqa: E402
from views.stores import store_from_url  # noqa: E402
from views.stores.contract import TimelineReader  # noqa: E402

ap = argument_parser(__doc__.splitlines()[0], name="first_page", users=2000, follows=30000,
                     tweets=20000, rounds=3)
ap.add_argument("--stores", default="sqlite,cassandra")
ap.add_argument("--shares", default="1.5,2,2.5",
                help="first batches to weigh, as pages' worth (default: %(default)s)")
ap.add_argument("--pages", type=int, default=800, help="pages a share a round")
ap.add_argument("--limit", type=int, default=20)


class Requests:
    """The driver's requests, counted by statement (Cassandra; nothing on SQLite)."""

    def __init__(self) -> None:
        self.by = Counter[str]()
        try:
            from cassandra.cluster import Session
        except ImportError:
            return
        sent = Session.execute_async

        def counting(session: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            text = getattr(getattr(query, "prepared_statement", query), "query_string", "")
            self.by[" ".join(str(text).split()[:6])] += 1
            return sent(session, query, *args, **kwargs)

        Session.execute_async = counting  # type: ignore[method-assign]


def first_batch(share: float) -> Callable[[int, TimelineReader], int]:
    """A first batch of ``limit × share + 1`` candidates, whatever the store."""

    def size(limit: int, _store: TimelineReader) -> int:
        return int(limit * share) + 1

    return size


def read_pages(store: Any, users: list[int], limit: int) -> None:
    page_fn = home_fn(True, None, None)
    for user in users:
        try:
            Read(store, user, None, limit, None).body(page_fn, None)
        except Exception:  # noqa: BLE001 - a deleted account's 404 is a page read too
            pass


def threads_now() -> dict[int, float]:
    """CPU-seconds of each live thread of this process, by native id."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}


def weigh(url: str, args: Any, requests: Requests) -> dict[str, Any]:
    shares = [float(s) for s in args.shares.split(",")]
    users = list(range(1, args.users + 1))
    rng = random.Random(args.seed)
    runs: dict[float, list[dict[str, float]]] = {s: [] for s in shares}
    with store_from_url(url, cap=800) as store:
        read_pages(store, rng.sample(users, 200), args.limit)  # connections, prepared
        for round_ in range(args.rounds):
            for share in shares:
                timeline._first_batch = first_batch(share)  # type: ignore[assignment]
                sample = rng.sample(users, min(args.pages, len(users)))
                requests.by.clear()
                before = threads_now()
                cpu, wall = time.process_time(), time.perf_counter()
                read_pages(store, sample, args.limit)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                after = threads_now()
                me = threading.get_native_id()
                reading = after.get(me, 0.0) - before.get(me, 0.0)
                n = len(sample)
                runs[share].append({"cpu_ms": cpu / n * 1e3, "wall_ms": wall / n * 1e3,
                                    "reading_thread_ms": reading / n * 1e3,
                                    "other_threads_ms": (cpu - reading) / n * 1e3,
                                    "requests": sum(requests.by.values()) / n,
                                    **{f"requests {k}": v / n for k, v in requests.by.items()}})
                print(f"  round {round_ + 1}, first batch {int(args.limit * share) + 1}: "
                      f"{runs[share][-1]['cpu_ms']:.2f} ms CPU, "
                      f"{runs[share][-1]['requests']:.1f} requests a page", flush=True)
    return {str(share): {k: round(statistics.median(r[k] for r in rs if k in r), 3)
                         for k in sorted({k for r in rs for k in r})}
            for share, rs in runs.items()}


def main() -> int:
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    requests = Requests()
    result: dict[str, Any] = {"args": vars(args)}
    with scratch("fanout-first-page-") as work:
        history = work / "history"
        fanout(work / "gen", "generate", "--users", str(args.users), "--follows",
               str(args.follows), "--tweets", str(args.tweets), "--out", str(history))
        for store in args.stores.split(","):
            run = work / f"run-{store}"
            print(f"[{store}] fanout up, replay, catch up", flush=True)
            fanout(run, "up", "--store", store, "--no-verifier", "--timeout", "600")
            try:
                fanout(run, "replay", "--no-progress", str(history))
                caught_up(run)
                stack = Stack.load(run)
                assert stack is not None
                result[store] = weigh(stack.env()["FANOUT_STORE"], args, requests)
                print(f"[{store}] {json.dumps(result[store])}", flush=True)
            finally:
                fanout(run, "down")
    print(f"results: {save(args.name, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
