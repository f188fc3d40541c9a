"""Inactive users: timeline writes saved, and what a returning user's first read costs.

    .venv/bin/python benchmarks/bench_inactive.py --users 20000 --follows 300000 \\
        --tweets 60000 --readers 0.1 --days 90 --inactive-days 30

One history, replayed twice through the join into a SQLite store (``views.local``:
what the Spark job does per micro-batch, with the same store code), once with
``FANOUT_INACTIVE_DAYS`` off and once at ``--inactive-days``. Everyone reads once
after signing up and only a share (``--readers``) keeps reading (``fanout generate
--readers``), over a span longer than the threshold: most users end up inactive, as
on Twitter, where most accounts do not come back every month.

Reported, from the same run:

- timeline rows written with and without the inactive-user rule (fan-out writes and
  regenerations), and their ratio;
- a returning user's first read (page 1, 20 entries, evaluated at read time because
  their cache is dormant) against an active user's read (from the cache), p50/p99;
- what regenerating a returning user's cache costs when their read record arrives;
- that both stores serve the same pages (and equal the SQL on a sample).

Writes benchmarks/results/inactive.json.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

from harness import ROOT, argument_parser, save
from pipeline import percentile, scratch, timed_ms

sys.path.insert(0, str(ROOT))

from ingest.events import Activity  # noqa: E402
from ingest.generator import DEFAULT_START_MS, add_reads, generate  # noqa: E402
from ingest.social import SOCIAL  # noqa: E402
from serving.timeline import home_page, home_top  # noqa: E402
from views.join import JoinConfig  # noqa: E402
from views.local import LocalJoin  # noqa: E402
from views.reference import Reference  # noqa: E402
from views.stores.base import DORMANT  # noqa: E402
from views.stores.sqlite import SQLiteStore  # noqa: E402


def _replay(events: list, config: JoinConfig, path: Path, inactive_days: float,
            batch: int) -> tuple[LocalJoin, SQLiteStore, float]:
    store = SQLiteStore(path, cap=config.cap, inactive_days=inactive_days).open()
    join = LocalJoin(config, store)
    start = time.perf_counter()
    for i in range(0, len(events), batch):
        join.run(events[i:i + batch])
    return join, store, time.perf_counter() - start


def _read_ms(store: SQLiteStore, users: list[int], limit: int = 20) -> list[float]:
    return timed_ms(lambda user: home_page(store, user, None, limit), users)


def _quantiles(values: list[float]) -> dict[str, float]:
    return {q: round(percentile(values, p), 3) for q, p in (("p50", .5), ("p99", .99),
                                                           ("max", 1.0))}


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="inactive", users=20_000, follows=300_000,
                         tweets=60_000)
    ap.add_argument("--readers", type=float, default=0.1,
                    help="share of users who keep reading (about daily)")
    ap.add_argument("--days", type=int, default=90, help="span of the history")
    ap.add_argument("--inactive-days", type=float, default=30.0)
    ap.add_argument("--cap", type=int, default=800)
    ap.add_argument("--batch", type=int, default=20_000, help="events per micro-batch")
    ap.add_argument("--sample", type=int, default=300, help="users read and compared")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    with scratch("fanout-inactive-") as work:
        return _bench(args, work)


def _bench(args: argparse.Namespace, work: Path) -> int:
    span = args.days * 86_400_000
    history = add_reads(generate(args.users, args.follows, args.tweets, seed=args.seed,
                                 span_ms=span, mix=SOCIAL), args.readers, DEFAULT_START_MS,
                        span)
    events = list(history.events())
    print(f"history: {len(events):,} events ({history.counts()})", flush=True)
    config = JoinConfig.with_ratio(args.cap, 1000)
    _, off_store, off_s = _replay(events, config, work / "off.sqlite", 0.0, args.batch)
    print(f"inactive rule off: {off_store.rows_written:,} timeline rows in {off_s:.1f}s",
          flush=True)
    on, on_store, on_s = _replay(events, config, work / "on.sqlite", args.inactive_days,
                                 args.batch)
    on_rows = on_store.rows_written
    print(f"inactive after {args.inactive_days:g} days: {on_store.rows_written:,} timeline "
          f"rows in {on_s:.1f}s", flush=True)
    gone = {u for u, row in on_store.users(on_store.home_users()).items() if row.deleted}
    users = [u for u in on_store.home_users() if u not in gone]  # deleted accounts: 404
    dormant = [u for u in users if on_store.horizon(u) == DORMANT]
    active = [u for u in users if on_store.horizon(u) != DORMANT]
    rng = random.Random(args.seed)
    returning = rng.sample(dormant, min(args.sample, len(dormant)))
    staying = rng.sample(active, min(args.sample, len(active)))
    first_read = _read_ms(on_store, returning)
    cached_read = _read_ms(on_store, staying)
    same = sum(home_top(on_store, u, 50) == home_top(off_store, u, 50)
               for u in returning + staying)
    ref = Reference().add(events)
    checked = rng.sample(returning + staying, min(60, len(returning + staying)))
    exact = sum([(e.tweet_id, e.created_at, e.author_id, e.original_id, e.original_author)
                 for e in home_top(on_store, u, 50)] == [tuple(r) for r in ref.home(u, 50)]
                for u in checked)
    # The returning users' reads arrive: one micro-batch of their records.
    now = max(e.created_at for e in events) + 1
    before = on_store.rows_written
    start = time.perf_counter()
    on.run([Activity(u, now) for u in returning])
    regen_s = time.perf_counter() - start
    regenerated = sum(on_store.horizon(u) != DORMANT for u in returning)
    after_read = _read_ms(on_store, returning)
    result: dict[str, Any] = {
        "events": len(events), "counts": history.counts(), "users_with_followees": len(users),
        "dormant_users": len(dormant),
        "rows_written": {"off": off_store.rows_written, "on": on_rows},
        "rows_ratio": round(on_rows / max(1, off_store.rows_written), 3),
        "replay_s": {"off": round(off_s, 1), "on": round(on_s, 1)},
        "first_read_ms": _quantiles(first_read), "cached_read_ms": _quantiles(cached_read),
        "read_after_regeneration_ms": _quantiles(after_read),
        "regeneration": {"users": len(returning), "regenerated": regenerated,
                         "rows": on_store.rows_written - before,
                         "ms_per_user": round(regen_s * 1000 / max(1, len(returning)), 3)},
        "same_pages_on_and_off": f"{same}/{len(returning) + len(staying)}",
        "equal_to_the_sql": f"{exact}/{len(checked)}",
        "settings": vars(args),
    }
    print(f"\n{len(dormant):,} of {len(users):,} users inactive at the end; timeline rows "
          f"written: {off_store.rows_written:,} → {on_rows:,} "
          f"(×{result['rows_ratio']})")
    f, c, a = result["first_read_ms"], result["cached_read_ms"], result["read_after_regeneration_ms"]
    print(f"first read of a returning user (read time): p50 {f['p50']} ms, p99 {f['p99']} ms; "
          f"an active user's (cache): p50 {c['p50']} ms, p99 {c['p99']} ms; after the cache "
          f"is regenerated: p50 {a['p50']} ms, p99 {a['p99']} ms")
    r = result["regeneration"]
    print(f"regenerating {r['regenerated']}/{r['users']} caches: {r['rows']:,} rows, "
          f"{r['ms_per_user']} ms per user; same pages with the rule on and off: "
          f"{result['same_pages_on_and_off']}; equal to the SQL: {result['equal_to_the_sql']}")
    print(f"written to {save(args.name, result)}")
    return 0 if same == len(returning) + len(staying) and exact == len(checked) else 1


if __name__ == "__main__":
    sys.exit(main())
