"""Read throughput of the API per core: home-timeline first pages at saturation.

    .venv/bin/python benchmarks/bench_api.py [--users 20000] [--seconds 20]

Builds a SQLite store without Spark (views.local.LocalJoin over a synthetic
power-law history from ingest.generator), starts the API as ONE process
(``python -m serving``, auth and access log off, 127.0.0.1), and saturates it from
this process with ``--connections`` keep-alive HTTP/1.1 connections (a minimal
asyncio client, so that the load generator spends little of the machine's CPU),
each reading the first page (limit 20) of a random user's home timeline in a
closed loop. After ``--warmup`` seconds it measures for ``--seconds``: requests/s,
latency p50/p99, and the CPU seconds the API process consumed in that window
(psutil) → requests per CPU-second, i.e. per core. The same is then done with
``FANOUT_READ_MODE=read`` (fan-out on read, the home query evaluated at read time)
on the same store; a sample of users is checked to get identical pages from both.

Modes are interleaved over ``--rounds`` rounds and the round with the median
requests per CPU-second is reported. Also recorded: the API's CPU while idle (the
celebrity cache's refresh, a fixed cost per API process), the same page assembly
and hydration in-process without HTTP (what the store path costs versus the HTTP
stack), and, for the capacity plan, what each celebrity threshold C puts on the
celebrity path in the real graph (../shared/data/ego-twitter): the share of follow
edges whose followee has ≥ C followers and the celebrities followed per reader.

The machine is shared: the JSON also records the load generator's CPU, the whole
machine's busy CPU and the load average during each window, so a noisy run shows.
Results go to benchmarks/results/api.json (``--name`` to change).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from harness import ROOT, argument_parser, save
from pipeline import percentile, scratch

sys.path.insert(0, str(ROOT))

from infra.services.broker import free_port  # noqa: E402
from ingest.generator import generate  # noqa: E402
from serving.settings import ServingSettings  # noqa: E402
from views.join import JoinConfig  # noqa: E402
from views.local import LocalJoin  # noqa: E402
from views.stores.sqlite import SQLiteStore  # noqa: E402

HOST = "127.0.0.1"
CAP = 800
EGO = ROOT.parent / "shared" / "data" / "ego-twitter" / "follows.txt.gz"
THRESHOLDS = (50, 100, 200, 500, 1000, 2000)


# -- the celebrity threshold on the real graph ------------------------------------------


def celebrity_split(path: Path, thresholds: tuple[int, ...] = THRESHOLDS) -> dict:
    """For each threshold C, what the real follow graph puts on the celebrity path.

    ``edge_share``: follow edges whose followee has ≥ C followers — the fan-out rows
    that disappear if every author tweets at the same rate. ``edge_share_by_followers``:
    the same when authors tweet in proportion to their follower count (what
    ingest.generator.for_graph assumes): Σ f² over celebrities / Σ f² over all.
    ``celebs_followed_*``: celebrities in one reader's follow list (the read-time
    merge), over every user of the graph.
    """
    followers: dict[int, int] = {}
    edges: list[tuple[int, int]] = []
    with gzip.open(path, "rb") as lines:
        for line in lines:
            a, b = line.split()
            if a != b:
                edges.append((int(a), int(b)))
                followers[int(b)] = followers.get(int(b), 0) + 1
    users = {u for edge in edges for u in edge}
    total, squares = len(edges), sum(f * f for f in followers.values())
    out: dict = {"graph": path.name, "edges": total, "users": len(users),
                 "mean_followers": round(total / len(users), 1), "thresholds": {}}
    for c in thresholds:
        celebs = {u for u, f in followers.items() if f >= c}
        per_reader: dict[int, int] = {}
        for reader, followee in edges:
            if followee in celebs:
                per_reader[reader] = per_reader.get(reader, 0) + 1
        counts = sorted(per_reader.values())
        counts = [0] * (len(users) - len(counts)) + counts
        out["thresholds"][str(c)] = {
            "celebrities": len(celebs),
            "edge_share": round(sum(followers[u] for u in celebs) / total, 4),
            "edge_share_by_followers": round(sum(followers[u] ** 2 for u in celebs) / squares,
                                             4),
            "celebs_followed_mean": round(sum(counts) / len(counts), 1),
            "celebs_followed_p50": percentile(counts, .5),
            "celebs_followed_p99": percentile(counts, .99),
            "celebs_followed_max": counts[-1],
        }
    return out


# -- the store -----------------------------------------------------------------------


def build(path: Path, args: argparse.Namespace) -> dict:
    """Fill the store through the in-process join; return what it holds."""
    started = time.perf_counter()
    history = generate(args.users, args.follows, args.tweets, seed=args.seed)
    store = SQLiteStore(path, cap=CAP).open()
    join = LocalJoin(JoinConfig.with_ratio(CAP, args.celebrity_threshold), store)
    batch: list = []
    events = 0
    for event in history.events():
        batch.append(event)
        if len(batch) == args.batch:
            join.run(batch)
            events += len(batch)
            batch = []
    if batch:
        join.run(batch)
        events += len(batch)
    followers = sorted((sum(active for _, active in s.followers.values())
                        for s in join.states.values()), reverse=True)
    info = {"events": events, "counts": history.counts(),
            "celebrities": len(store.celebrities()),
            "max_followers": followers[0] if followers else 0,
            "mean_followees": round(sum(followers) / args.users, 1),
            "build_s": round(time.perf_counter() - started, 1)}
    store.close()
    return info


# -- the API process -----------------------------------------------------------------


class Api:
    """``python -m serving`` on a free loopback port; always stopped on exit."""

    def __init__(self, store: Path, read_mode: str, logs: Path) -> None:
        self.port = free_port(HOST)
        self.env = {**os.environ, "FANOUT_STORE": f"sqlite:///{store}", "FANOUT_AUTH": "off",
                    "FANOUT_API_HOST": HOST, "FANOUT_API_PORT": str(self.port),
                    "FANOUT_API_ACCESS_LOG": "false", "FANOUT_READ_MODE": read_mode,
                    "PYTHONPATH": str(ROOT)}
        self.log = logs / f"api-{read_mode}-{self.port}.log"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Api:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "serving"], env=self.env,
                                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + 60
        while not self._healthy():
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the API exited with {self.process.returncode}: {tail}")
            if time.monotonic() > deadline:
                raise TimeoutError("the API did not answer /healthz within 60 s")
            time.sleep(0.2)
        time.sleep(1.0)  # the celebrity cache's first refresh

    def _healthy(self) -> bool:
        try:
            status, _ = asyncio.run(_get_once(self.port, "/healthz"))
        except OSError:
            return False
        return status == 200

    def __exit__(self, *exc: object) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.process = None


# -- the load ------------------------------------------------------------------------


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length body (what uvicorn sends here)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


def _request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()


async def _get_once(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 2)
    try:
        writer.write(_request(path))
        return await asyncio.wait_for(_read_response(reader), 10)
    finally:
        writer.close()


def _cpu(process: psutil.Process) -> float:
    t = process.cpu_times()
    return t.user + t.system


def _busy() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + t.nice + getattr(t, "irq", 0) + getattr(t, "softirq", 0)


async def _load(port: int, server_pid: int, users: list[int], args: argparse.Namespace) -> dict:
    """Closed loop on ``connections`` connections; measure one window after warm-up."""
    server, me = psutil.Process(server_pid), psutil.Process()
    window: dict[str, float] = {}
    latencies: list[float] = []
    counts = {"ok": 0, "errors": 0, "entries": 0}
    stop = asyncio.Event()
    rng = random.Random(args.seed)

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            while not stop.is_set():
                user = users[rng.randrange(len(users))]
                start = time.perf_counter()
                writer.write(_request(f"/v1/users/{user}/home?limit=20"))
                status, body = await _read_response(reader)
                end = time.perf_counter()
                if "start" in window and "end" not in window and start >= window["start"]:
                    if status == 200:
                        counts["ok"] += 1
                        counts["entries"] += body.count(b'"tweet_id"')
                        latencies.append((end - start) * 1000)
                    else:
                        counts["errors"] += 1
        finally:
            writer.close()

    def snapshot() -> dict[str, float]:
        return {"t": time.perf_counter(), "server": _cpu(server), "client": _cpu(me), "busy": _busy()}

    idle_from = (time.perf_counter(), _cpu(server))
    await asyncio.sleep(args.idle)  # background cost alone (the celebrity cache refresh)
    idle_cores = (_cpu(server) - idle_from[1]) / (time.perf_counter() - idle_from[0])
    tasks = [asyncio.create_task(connection()) for _ in range(args.connections)]
    try:
        await asyncio.sleep(args.warmup)
        _check(tasks)
        first = snapshot()
        window["start"] = first["t"]
        load_before = os.getloadavg()[0]
        await asyncio.sleep(args.seconds)
        last = snapshot()
        window["end"] = last["t"]
        _check(tasks)
    finally:
        stop.set()
        done, pending = await asyncio.wait(tasks, timeout=10)
        for task in pending:
            task.cancel()
    wall = last["t"] - first["t"]
    server_cpu = last["server"] - first["server"]
    return {
        "connections": args.connections, "seconds": round(wall, 2),
        "requests": counts["ok"], "errors": counts["errors"],
        "requests_per_s": round(counts["ok"] / wall),
        "p50_ms": round(percentile(latencies, .5), 2),
        "p99_ms": round(percentile(latencies, .99), 2),
        "mean_entries_per_page": round(counts["entries"] / max(counts["ok"], 1), 1),
        "server_cpu_s": round(server_cpu, 2),
        "server_cpu_utilization": round(server_cpu / wall, 2),
        "requests_per_cpu_s": round(counts["ok"] / max(server_cpu, 1e-9)),
        "cpu_ms_per_request": round(server_cpu * 1000 / max(counts["ok"], 1), 3),
        "idle_cpu_cores": round(idle_cores, 3),
        "cpu_ms_per_request_net_of_idle": round(
            max(server_cpu - idle_cores * wall, 0) * 1000 / max(counts["ok"], 1), 3),
        "client_cpu_s": round(last["client"] - first["client"], 2),
        "machine_busy_cores": round((last["busy"] - first["busy"]) / wall, 2),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def in_process(path: Path, users: list[int], n: int, seed: int) -> dict:
    """CPU per first page without HTTP: assembly alone, and with hydration (one thread)."""
    from serving.celebrities import CelebrityCache
    from serving.render import hydrated
    from serving.timeline import home_page, read_time_page

    store = SQLiteStore(path, cap=CAP).open()
    try:
        cache = CelebrityCache(store, depth=CAP)
        start = time.process_time()
        cache.refresh()
        refresh_ms = (time.process_time() - start) * 1000
        sample = random.Random(seed).choices(users, k=n)
        modes = {"fanout": lambda u: home_page(store, u, None, 20, celebrities=cache),
                 "read": lambda u: read_time_page(store, u, None, 20)}
        out: dict = {"pages": n, "celebrity_refresh_cpu_ms": round(refresh_ms, 1),
                     "mean_followees": round(sum(len(store.followees(u)) for u in sample) / n, 1),
                     "mean_celebrities_followed": round(
                         sum(len(store.celebrities_followed(u)) for u in sample) / n, 2)}
        for mode, page in modes.items():
            start = time.process_time()
            for user in sample:
                page(user)
            assembly = time.process_time() - start
            start = time.process_time()
            for user in sample:
                hydrated(store, page(user).entries)
            out[mode] = {"assembly_ms": round(assembly * 1000 / n, 3),
                         "with_hydration_ms": round((time.process_time() - start) * 1000 / n, 3)}
        return out
    finally:
        store.close()


def _check(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        if task.done() and task.exception() is not None:
            raise RuntimeError(f"a load connection failed: {task.exception()!r}")


def _same_pages(ports: dict[str, int], users: list[int]) -> int:
    """Users whose first page is byte-identical in both modes (a sanity check)."""
    same = 0
    for user in users:
        bodies = [asyncio.run(_get_once(port, f"/v1/users/{user}/home?limit=20"))
                  for port in ports.values()]
        same += all(b == bodies[0] for b in bodies)
    return same


def run_mode(store: Path, mode: str, users: list[int], args: argparse.Namespace,
             logs: Path) -> dict:
    with Api(store, mode, logs) as api:
        assert api.process is not None
        pid = api.process.pid
        result = _run_loop(_load(api.port, pid, users, args))
    result["read_mode"] = mode
    return result


def _run_loop(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# -- main ----------------------------------------------------------------------------


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="api", users=20_000, follows=200_000,
                         tweets=200_000, store=None, rounds=3)
    ap.add_argument("--celebrity-threshold", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=50_000, help="events per LocalJoin batch")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--idle", type=float, default=3.0,
                    help="seconds the API's CPU is measured without load first")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--modes", default="fanout,read", help="comma-separated FANOUT_READ_MODEs")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--graph", type=Path, default=EGO,
                    help="real follow graph for the celebrity-threshold split ('' to skip)")
    args = ap.parse_args()
    # SIGTERM (e.g. from `timeout`) unwinds like an error, so the API process is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    with scratch("fanout-api-") as work:
        path = args.store or work / "v.sqlite"
        if path.exists():  # reuse a store built by an earlier run with the same settings
            if not path.with_suffix(".json").exists():
                raise SystemExit(f"{path} exists but was not built by this script (no "
                                 f"{path.with_suffix('.json').name} beside it)")
            store_info = json.loads(path.with_suffix(".json").read_text())
        else:
            store_info = build(path, args)
            path.with_suffix(".json").write_text(json.dumps(store_info))
            gc.collect()
        print(f"store built in {store_info['build_s']}s: {store_info['counts']}, "
              f"{store_info['celebrities']} celebrities", file=sys.stderr)
        users = list(range(1, args.users + 1))
        store_info["in_process"] = in_process(path, users, 3000, args.seed)
        print(f"in process (no HTTP): {store_info['in_process']}")
        rounds: dict[str, list[dict]] = {mode: [] for mode in modes}
        for i in range(args.rounds):  # modes interleaved: a noisy spell hits both
            for mode in modes:
                rounds[mode].append(run_mode(path, mode, users, args, work))
                rounds[mode][-1]["round"] = i
                _print(rounds[mode][-1])
        results = {mode: _median(runs) for mode, runs in rounds.items()}
        checked = random.Random(args.seed).sample(users, 50)
        if len(modes) > 1:
            with Api(path, modes[0], work) as a, Api(path, modes[1], work) as b:
                store_info["same_pages_checked"] = len(checked)
                store_info["same_pages"] = _same_pages({modes[0]: a.port, modes[1]: b.port},
                                                       checked)
    print("medians by requests per CPU-second:")
    for r in results.values():
        _print(r)
    split = celebrity_split(args.graph) if args.graph.name and args.graph.exists() else None
    if split is not None:
        for c, row in split["thresholds"].items():
            print(f"C={c:>5}: {row['celebrities']:>5} celebrities, {row['edge_share']:.1%} of "
                  f"edges ({row['edge_share_by_followers']:.1%} if tweets ∝ followers); "
                  f"celebrities followed per reader mean {row['celebs_followed_mean']}, "
                  f"p99 {row['celebs_followed_p99']}")
    defaults = ServingSettings.model_fields
    result = {"modes": results, "rounds": rounds, "store": store_info, "celebrity_split": split,
              "api": {k: defaults[k].default for k in ("celebrity_refresh_s", "timeline_cap")},
              "machine": {"cpus": os.cpu_count(),
                          "note": "2-core shared machine; other benchmarks may run at the "
                                  "same time (see machine_busy_cores, loadavg_1m)"},
              "settings": vars(args)}
    if "fanout" in results and "read" in results:
        result["read_vs_fanout_cpu_per_request"] = round(
            results["read"]["cpu_ms_per_request"] / results["fanout"]["cpu_ms_per_request"], 2)
        print(f"fan-out on read costs ×{result['read_vs_fanout_cpu_per_request']} the CPU "
              "per request of the materialized view")
    if "same_pages" in store_info:
        print(f"same first page in both modes: {store_info['same_pages']}/"
              f"{store_info['same_pages_checked']} users")
    print(f"written to {save(args.name, result)}")
    ok = all(r["errors"] == 0 for r in results.values())
    return 0 if ok and store_info.get("same_pages") == store_info.get("same_pages_checked") else 1


def _median(runs: list[dict]) -> dict:
    """The round with the median requests per CPU-second (the lower middle if even)."""
    ordered = sorted(runs, key=lambda r: r["requests_per_cpu_s"])
    return ordered[(len(ordered) - 1) // 2]


def _print(r: dict) -> None:
    print(f"{r['read_mode']:>6} #{r['round']}: {r['requests_per_s']:,} req/s over {r['seconds']}s "
          f"({r['connections']} connections), p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms; "
          f"API CPU {r['server_cpu_s']}s ({r['server_cpu_utilization']} cores) → "
          f"{r['requests_per_cpu_s']:,} req per CPU-second ({r['cpu_ms_per_request']} ms/req); "
          f"({r['cpu_ms_per_request_net_of_idle']} ms net of idle); "
          f"idle {r['idle_cpu_cores']} cores; load generator {r['client_cpu_s']} CPU-s; "
          f"machine busy "
          f"{r['machine_busy_cores']} cores, load avg {r['loadavg_1m']}; "
          f"{r['mean_entries_per_page']} entries/page, {r['errors']} errors")


if __name__ == "__main__":
    sys.exit(main())
