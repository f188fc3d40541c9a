"""What the API's celebrity cache costs on the whole ego-twitter graph, under writes.

    .venv/bin/python benchmarks/bench_replay.py          # leaves /tmp/fanout-bench-*/v.sqlite
    .venv/bin/python benchmarks/bench_celebrity_cost.py [--store PATH] [--rate 500]

The store is ``bench_replay.py``'s: ego-twitter (81,306 users, 1.77M follows) plus
130k tweets, celebrity threshold C=500 (151 celebrities, 800 tweets held each). It is
copied, and a writer in this process commits a batch every ``--batch-s`` seconds, as
the view job would: ``--rate`` tweets/s, a ``--celebrity-share`` of them by
celebrities (drawn uniformly), the rest by other users, with the batch's applied
offsets. One API process (``python -m serving``, one worker, no reads) runs on the
copy for ``--seconds`` with the celebrity cache on (refresh every 0.5 s, incremental),
then as long with it off (``FANOUT_CELEBRITY_REFRESH_S=0``); the difference of the
API's CPU is what the cache costs. The writer's CPU is not the API's and is left out.
Also timed in process: one full reload of every celebrity (what a refresh cost before
it was incremental, twice a second) and one incremental refresh.

Results go to ``benchmarks/results/celebrity-cost.json`` (``--name``).
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from harness import ROOT, argument_parser, save
from pipeline import scratch

sys.path.insert(0, str(ROOT))

from infra.services.broker import free_port  # noqa: E402
from serving.celebrities import CelebrityCache  # noqa: E402
from serving.pageversions import page_versions  # noqa: E402
from views.delta import Delta  # noqa: E402
from views.stores.sqlite import SQLiteStore  # noqa: E402


def _default_store() -> Path | None:
    found = sorted(glob.glob("/tmp/fanout-bench-*/v.sqlite"), key=os.path.getmtime)
    return Path(found[-1]) if found else None


class Writer(threading.Thread):
    """Commits a batch of tweets (and offsets) every ``batch_s`` seconds."""

    def __init__(self, store: SQLiteStore, users: list[int], celebrities: list[int],
                 args: argparse.Namespace) -> None:
        super().__init__(name="writer", daemon=True)
        self.store, self.users, self.celebrities, self.args = store, users, celebrities, args
        self.stop = threading.Event()
        self.batches = self.tweets = 0

    def run(self) -> None:
        rng = random.Random(self.args.seed)
        per_batch = max(1, round(self.args.rate * self.args.batch_s))
        tweet_id, offset = 10**15, 0
        while not self.stop.wait(self.args.batch_s):
            now = int(time.time() * 1000)
            deltas = []
            for _ in range(per_batch):
                pool = self.celebrities if rng.random() < self.args.celebrity_share \
                    else self.users
                tweet_id += 1
                deltas.append(Delta.tweet(tweet_id, rng.choice(pool), now, "a new tweet"))
            offset += per_batch
            deltas.append(Delta.source_offset("tweets", 0, offset, now))
            self.store.apply(deltas, batch_id=10**6 + self.batches)
            self.batches += 1
            self.tweets += per_batch


def _api_cpu(store: Path, refresh_s: float, seconds: float, work: Path) -> dict:
    port = free_port()
    env = {**os.environ, "FANOUT_STORE": f"sqlite:///{store}", "FANOUT_AUTH": "off",
           "FANOUT_API_PORT": str(port), "FANOUT_API_HOST": "127.0.0.1",
           "FANOUT_API_WORKERS": "1", "FANOUT_API_ACCESS_LOG": "false",
           "FANOUT_CELEBRITY_REFRESH_S": str(refresh_s), "FANOUT_TIMELINE_CAP": "800",
           "PYTHONPATH": str(ROOT)}
    with (work / f"api-{refresh_s}.log").open("wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "serving"], env=env, cwd=ROOT,
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        time.sleep(8)  # start-up and the first (full) load are not the steady cost
        if server.poll() is not None:
            raise RuntimeError((work / f"api-{refresh_s}.log").read_text()[-2000:])
        proc = psutil.Process(server.pid)
        t0, wall0 = proc.cpu_times(), time.perf_counter()
        time.sleep(seconds)
        t1, wall = proc.cpu_times(), time.perf_counter() - wall0
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(20)
    cpu = (t1.user - t0.user) + (t1.system - t0.system)
    return {"refresh_s": refresh_s, "cpu_s": round(cpu, 3), "wall_s": round(wall, 2),
            "cores": round(cpu / wall, 4)}


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="celebrity-cost", store=_default_store())
    ap.add_argument("--rate", type=float, default=500.0, help="tweets/s written")
    ap.add_argument("--batch-s", type=float, default=1.0, help="seconds between commits")
    ap.add_argument("--celebrity-share", type=float, default=0.1,
                    help="share of the tweets posted by celebrities")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    if args.store is None or not args.store.exists():
        raise SystemExit("no ego-twitter store: run benchmarks/bench_replay.py first "
                         "(it leaves /tmp/fanout-bench-*/v.sqlite), or pass --store")
    with scratch("fanout-celebcost-") as work:
        copy = work / "v.sqlite"
        shutil.copyfile(args.store, copy)
        store = SQLiteStore(copy, cap=800).open()
        celebrities = store.celebrities()
        users = [r[0] for r in store._conn().execute("SELECT user_id FROM users")]
        if not celebrities or not users:
            raise SystemExit(f"{args.store} has {len(celebrities)} celebrities and "
                             f"{len(users)} users: pass bench_replay.py's store with --store")
        print(f"store: {len(users):,} users, {len(celebrities)} celebrities", flush=True)
        cache = CelebrityCache(store, depth=800, version=page_versions(store).position)
        t0 = time.perf_counter()
        cache.refresh(full=True)
        full_s = time.perf_counter() - t0
        out: dict = {"settings": {k: str(v) for k, v in vars(args).items()},
                     "celebrities": len(celebrities), "users": len(users),
                     "full_reload_s": round(full_s, 4)}
        writer = Writer(store, users, celebrities, args)
        writer.start()
        time.sleep(args.batch_s * 1.5)
        t0 = time.perf_counter()
        cache.refresh()
        out["incremental_refresh_s"] = round(time.perf_counter() - t0, 4)
        out["on"] = _api_cpu(copy, 0.5, args.seconds, work)
        print(f"cache on:  {out['on']}", flush=True)
        out["off"] = _api_cpu(copy, 0.0, args.seconds, work)
        print(f"cache off: {out['off']}", flush=True)
        writer.stop.set()
        writer.join(10)
        out["writer"] = {"batches": writer.batches, "tweets": writer.tweets}
        out["cache_cores"] = round(out["on"]["cores"] - out["off"]["cores"], 4)
        out["full_reload_twice_a_second_cores"] = round(2 * full_s, 3)
        out["loadavg_1m"] = round(os.getloadavg()[0], 2)
        store.close()
    print(f"celebrity cache at C=500: {out['cache_cores']:.2%} of a core "
          f"({out['celebrities']} celebrities, {args.rate:g} tweets/s, "
          f"{args.celebrity_share:.0%} by celebrities); one full reload "
          f"{out['full_reload_s'] * 1000:.0f} ms, one incremental refresh "
          f"{out['incremental_refresh_s'] * 1000:.1f} ms")
    print(f"written to {save(args.name, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
