"""Home-timeline read latency against the number of celebrities a user follows.

    .venv/bin/python benchmarks/bench_celebrity_reads.py [--http]

Builds a store through the in-process join (views.local): 1,000 celebrities (each
past the promotion threshold, 30 tweets each), 200 normal authors, and four groups of
readers following 50 normal authors plus 0, 10, 100 or 1,000 celebrities. Then reads
first pages (limit 20) round-robin over each group's readers and reports p50/p99 per
group and the p99 ratio to the 0-celebrity group, for three read paths:

- ``store``: serving.timeline.home_page reading celebrities' tweets from the store
  (one query per celebrity followed);
- ``cache``: the same with serving.celebrities.CelebrityCache (what the API uses);
- ``http`` (with --http): GET /v1/users/{id}/home on the real API process.

Results go to benchmarks/results/celebrity_reads.json.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

from harness import ROOT, argument_parser, save
from pipeline import built_store, percentile, scratch, timed_ms

from infra import webclient

sys.path.insert(0, str(ROOT))

from infra.services.broker import free_port  # noqa: E402
from ingest.events import Follow, Post  # noqa: E402
from serving.celebrities import CelebrityCache  # noqa: E402
from serving.timeline import home_page  # noqa: E402
from views.join import JoinConfig  # noqa: E402
from views.local import LocalJoin  # noqa: E402
from views.stores.sqlite import SQLiteStore  # noqa: E402

GROUPS = (0, 10, 100, 1000)
CELEBS = range(1, 1001)
NORMAL = range(10_001, 10_201)
PROMOTE_AT = 300


def build(path: Path) -> dict[int, list[int]]:
    """Fill the store; return the readers of each group."""
    store = SQLiteStore(path, cap=800).open()
    join = LocalJoin(JoinConfig.with_ratio(800, PROMOTE_AT), store)
    fans = [Follow(200_000 + i, c, 1) for c in CELEBS for i in range(PROMOTE_AT)]
    readers = {k: [100_000 + k * 1000 + i for i in range(50)] for k in GROUPS}
    follows = [Follow(u, a, 2) for k, users in readers.items() for j, u in enumerate(users)
               for a in [*[NORMAL[(j * 7 + n) % len(NORMAL)] for n in range(50)],
                         *list(CELEBS)[:k]]]
    join.run(fans + follows)
    tweet = iter(range(10**12, 10**13))
    posts = [Post(next(tweet), a, 1_700_000_000_000 + t * 60_000 + a, f"tweet {t} by {a}")
             for t in range(30) for a in [*CELEBS, *NORMAL]]
    join.run(posts)
    assert len(store.celebrities()) == len(CELEBS), "every celebrity must be promoted"
    store.close()
    return readers


def measure(read, readers: dict[int, list[int]], rounds: int) -> dict[int, dict[str, float]]:
    out = {}
    for k, users in readers.items():
        samples = timed_ms(read, users, rounds, warmup=10)
        out[k] = {"p50_ms": round(percentile(samples, .5), 3),
                  "p99_ms": round(percentile(samples, .99), 3)}
    base = out[0]["p99_ms"]
    for k in out:
        out[k]["p99_vs_0"] = round(out[k]["p99_ms"] / base, 2)
    return out


def _http(path: Path, readers, rounds: int) -> dict:
    import httpx

    port = free_port()
    env = {**os.environ, "FANOUT_STORE": f"sqlite:///{path}", "FANOUT_AUTH": "off",
           "FANOUT_API_PORT": str(port), "FANOUT_API_ACCESS_LOG": "false",
           "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, "-m", "serving"], env=env, cwd=ROOT)
    try:
        client = webclient.client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.get("/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the API did not start")
            time.sleep(0.2)
        time.sleep(1.0)  # let the celebrity cache make its first refresh

        def read(user: int) -> None:
            response = client.get(f"/v1/users/{user}/home", params={"limit": 20})
            assert response.status_code == 200, response.text

        return measure(read, readers, rounds)
    finally:
        server.terminate()
        server.wait(10)


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="celebrity_reads", rounds=2000)
    ap.add_argument("--http", action="store_true", help="also measure over HTTP")
    args = ap.parse_args()
    with scratch("fanout-celeb-") as work:
        path = work / "v.sqlite"
        store, readers = built_store(path, build)
        cache = CelebrityCache(store)
        cache.refresh()
        result: dict[str, dict] = {
            "store": measure(lambda u: home_page(store, u, None, 20), readers, args.rounds),
            "cache": measure(functools.partial(_cached, store, cache), readers, args.rounds),
        }
        if args.http:
            result["http"] = _http(path, readers, args.rounds)
    for path_name, groups in result.items():
        print(f"{path_name:>6}: " + "  ".join(
            f"{k:>4} celebs p50 {g['p50_ms']:.2f}ms p99 {g['p99_ms']:.2f}ms "
            f"(×{g['p99_vs_0']})" for k, g in groups.items()))
    print(f"written to {save(args.name, result)}")
    return 0


def _cached(store, cache, user: int) -> None:
    home_page(store, user, None, 20, celebrities=cache)


if __name__ == "__main__":
    sys.exit(main())
