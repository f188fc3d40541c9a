"""Home reads over HTTP keep-alive against the nginx ceiling, closed and open loop.

    apt-get install -y nginx wrk        # Debian packages this benchmark drives
    .venv/bin/python benchmarks/bench_http.py --store /tmp/fanout-api/v.sqlite [--before REV]
    .venv/bin/python benchmarks/bench_http.py --doors middleware,off --name http-doors

The store is ``bench_api.py``'s (20,000 users, 200,000 follows and tweets, built in
process without Spark; built here if ``--store`` does not exist yet). The API runs as
``python -m serving`` with ``--workers`` processes (default: one per core), auth and
access log off, the job idle. wrk (Debian's, closed loop, ``--wrk-threads``) reads
``GET /v1/users/{random 1..users}/home?limit=20``, a hydrated first page, at each of
``--connections``, ``--seconds`` each, after warm-up rounds until the rate stops
rising (the page caches full, as after a while of serving with the job idle). Per run: requests/s,
wrk's p50/p99, the CPU of every API process (psutil over the process tree) → reads
per API CPU-second, wrk's own CPU, and the load average.

Beside it, in the same run: the same API with its page cache off (every read
assembled, hydrated and serialized: what a read costs while writes keep
invalidating pages), conditional GETs (``If-None-Match`` → 304) on one page, and
nginx (``--workers`` worker processes) answering every path with a byte-identical
copy of one page's body — the ceiling of the box for this response. Our throughput
is reported as a fraction of it.

Last, open loop: ``openloop.c`` (compiled with the system's ``cc`` on first use;
``--open-client python`` for ``--open-processes`` asyncio processes instead) sends at
half the measured saturation rate (cache on, the highest connection count), then at
``--open-rates``, over ``--open-connections`` connections, each request timed from its
intended send time, so queueing is not hidden (coordinated omission); the client's
CPU is reported too. Results go to
``benchmarks/results/http.json`` (``--name``).

``--doors`` measures only where a cached page read is answered
(``FANOUT_API_FAST_READS``): in the ASGI middleware or by the FastAPI route alone; each door's API is warmed up and read at the highest
connection count, the doors in turns ``--rounds`` times, and each door's best reads
per API CPU-second are compared with the route's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import psutil
from bench_api import HOST, _get_once, _read_response, _request, build
from harness import ROOT, WRK_THREADS_LUA, argument_parser, save
from pipeline import percentile, scratch

sys.path.insert(0, str(ROOT))

from infra.load.run import children_cpu, cpu_of  # noqa: E402
from infra.services.broker import free_port  # noqa: E402

WRK_LUA = WRK_THREADS_LUA + """request = function()
  return wrk.format("GET", "/v1/users/" .. math.random(1, %(users)d) .. "/home?limit=20")
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "JSON {\\"requests\\":%%d,\\"duration_us\\":%%d,\\"errors\\":%%d,\\"non2xx\\":%%d,"
    .. "\\"p50_us\\":%%d,\\"p99_us\\":%%d,\\"p999_us\\":%%d,\\"max_us\\":%%d}\\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout,
    e.status, latency:percentile(50), latency:percentile(99), latency:percentile(99.9),
    latency.max))
end
"""

NGINX_CONF = """
worker_processes %(workers)d;
daemon off;
pid %(dir)s/nginx.pid;
error_log %(dir)s/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 300s;
  client_body_temp_path %(dir)s/body; proxy_temp_path %(dir)s/proxy;
  fastcgi_temp_path %(dir)s/fastcgi; uwsgi_temp_path %(dir)s/uwsgi; scgi_temp_path %(dir)s/scgi;
  server {
    listen %(host)s:%(port)d reuseport;
    location / { root %(dir)s; default_type application/json; try_files /body.json =404; }
  }
}
"""


def _tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its children (the API's workers)."""
    root = psutil.Process(pid)
    return cpu_of([root, *root.children(recursive=True)])


class Server:
    """A server process (the API or nginx) on a free loopback port; stopped on exit."""

    def __init__(self, argv: list[str], env: dict[str, str], port: int, log: Path,
                 cwd: Path = ROOT) -> None:
        self.argv, self.env, self.port, self.log, self.cwd = argv, env, port, log, cwd
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=log,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                if asyncio.run(_get_once(self.port, "/v1/users/1/home?limit=20"))[0] == 200:
                    break
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"{self.argv[0]} did not come up: "
                                   + self.log.read_text(errors="replace")[-1500:])
            time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
            self.process = None


def api(store: Path, workers: int, cache_mb: int, work: Path, root: Path = ROOT,
        doors: str = "middleware") -> Server:
    port = free_port(HOST)
    env = {**os.environ, "FANOUT_STORE": f"sqlite:///{store}", "FANOUT_AUTH": "off",
           "FANOUT_API_HOST": HOST, "FANOUT_API_PORT": str(port),
           "FANOUT_API_ACCESS_LOG": "false", "FANOUT_API_WORKERS": str(workers),
           "FANOUT_API_PAGE_CACHE_MB": str(cache_mb), "FANOUT_API_FAST_READS": doors,
           "PYTHONPATH": str(root)}
    if root != ROOT:  # the before: without the C HTTP parser and uvloop it did not install
        shadow = work / "shadow"
        shadow.mkdir(exist_ok=True)
        for module in ("httptools", "uvloop"):
            (shadow / f"{module}.py").write_text("raise ImportError('not in the before')\n")
        env["PYTHONPATH"] = f"{shadow}{os.pathsep}{root}"
    return Server([sys.executable, "-m", "serving"], env, port, work / f"api-{port}.log",
                  cwd=root)


def checkout(rev: str, work: Path) -> Path:
    """The project's tree at ``rev`` (git archive), to measure the API as it was."""
    root = work / f"tree-{rev}"
    root.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


def nginx(body: bytes, workers: int, work: Path) -> Server:
    port = free_port(HOST)
    work.chmod(0o755)  # nginx's workers run as an unprivileged user: they must read it
    (work / "body.json").write_bytes(body)
    (work / "body.json").chmod(0o644)
    conf = work / "nginx.conf"
    conf.write_text(NGINX_CONF % {"workers": workers, "dir": work, "host": HOST, "port": port})
    return Server([_need("nginx"), "-c", str(conf), "-e", str(work / "nginx-error.log")],
                  dict(os.environ), port, work / "nginx.log")


def _need(tool: str) -> str:
    path = shutil.which(tool) or (f"/usr/sbin/{tool}" if Path(f"/usr/sbin/{tool}").exists()
                                  else None)
    if path is None:
        raise SystemExit(f"{tool} is not installed: apt-get install -y nginx wrk")
    return path


def wrk(server: Server, connections: int, seconds: float, args: argparse.Namespace,
        work: Path, headers: tuple[str, ...] = (), path: str | None = None,
        seed: int | None = None) -> dict:
    """One closed-loop wrk run; the server's and wrk's CPU over it."""
    seconds = max(1, round(seconds))  # wrk takes whole seconds
    script = work / "home.lua"
    script.write_text(WRK_LUA % {"seed": args.seed if seed is None else seed,
                                 "users": args.users})
    argv = [_need("wrk"), f"-t{min(args.wrk_threads, connections)}", f"-c{connections}",
            f"-d{seconds}s", "--latency", "-s", str(script)]
    for h in headers:
        argv += ["-H", h]
    if path is not None:  # a fixed path: drop the script's random one
        argv = [a for a in argv if a not in ("-s", str(script))]
    argv.append(f"http://{HOST}:{server.port}{path or '/'}")
    assert server.process is not None
    load = os.getloadavg()[0]
    cpu0, client0, t0 = _tree_cpu(server.process.pid), children_cpu(), time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    server_cpu = _tree_cpu(server.process.pid) - cpu0
    result = _parse_wrk(out)
    result.update({
        "connections": connections, "requests_per_s": round(result["requests"] / seconds),
        "server_cpu_s": round(server_cpu, 2),
        "server_cores": round(server_cpu / wall, 2),
        "requests_per_cpu_s": round(result["requests"] / max(server_cpu, 1e-9)),
        "client_cpu_s": round(children_cpu() - client0, 2),
        "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)]})
    return result


def _parse_wrk(out: str) -> dict:
    found = re.search(r"^JSON (\{.*\})$", out, re.M)
    if found:
        raw = json.loads(found.group(1))
        return {"requests": raw["requests"], "errors": raw["errors"], "non2xx": raw["non2xx"],
                **{k.replace("_us", "_ms"): round(raw[k] / 1000, 2)
                   for k in ("p50_us", "p99_us", "p999_us", "max_us")}}
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    result: dict[str, float] = {"requests": requests, "errors": 0,
                                "non2xx": int(non2xx.group(1)) if non2xx else 0}
    for pct, key in (("50", "p50_ms"), ("99", "p99_ms")):
        found = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)$", out, re.M)
        if found:
            scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[found.group(2)]
            result[key] = round(float(found.group(1)) * scale, 2)
    return result


def warm_up(server: Server, connections: int, args: argparse.Namespace, work: Path,
            seconds: float = 4.0, rounds: int = 30, least: int = 8) -> list[int]:
    """wrk rounds until the rate stops rising (two rounds in a row < 3 % above the best
    before them, after at least ``least``, so one noisy round does not end it), each
    round asking for other users (its own seed), so every worker's page cache comes to
    hold every user's first page, as in an API that has served a while with the job
    idle. (One seed for every round asked for the same ~14k of 20k users again and
    again; the open loop after it then rendered the rest while it was measured.)"""
    rates: list[int] = []
    while len(rates) < rounds:
        rates.append(wrk(server, connections, seconds, args, work,
                         seed=args.seed + 1 + len(rates))["requests_per_s"])
        print(f"  warm-up round {len(rates)}: {rates[-1]} req/s", flush=True)
        if len(rates) >= least and max(rates[-2:]) < max(rates[:-2]) * 1.03:
            break
    return rates


# -- open loop -----------------------------------------------------------------------


def _open_worker(port: int, rate: float, seconds: float, connections: int, users: int,
                 seed: int, out: multiprocessing.Queue) -> None:
    run: Callable[[Coroutine[Any, Any, dict]], dict]
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    out.put(run(_open_loop(port, rate, seconds, connections, users, seed)))


async def _open_loop(port: int, rate: float, seconds: float, connections: int, users: int,
                     seed: int) -> dict:
    """Requests due at ``start + n/rate``; each timed from when it was due."""
    rng = random.Random(seed)
    due: asyncio.Queue[float] = asyncio.Queue()
    latencies: list[float] = []
    errors = 0

    async def connection() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            while (intended := await due.get()) >= 0:
                writer.write(_request(f"/v1/users/{rng.randint(1, users)}/home?limit=20"))
                status, _ = await _read_response(reader)
                latencies.append((time.perf_counter() - intended) * 1000)
                errors += status != 200
        finally:
            writer.close()

    tasks = [asyncio.create_task(connection()) for _ in range(connections)]
    await asyncio.sleep(0.5)  # connections open before the clock starts
    cpu0, start = time.process_time(), time.perf_counter()
    total, n = int(rate * seconds), 0
    while n < total:
        # Release every request due by now at once: the loop's timers are ~1 ms coarse,
        # so sleeping per request would cap the rate below ~1,000/s.
        now = time.perf_counter()
        while n < total and (intended := start + n / rate) <= now:
            due.put_nowait(intended)
            n += 1
        if n < total:
            await asyncio.sleep(max(0.0, start + n / rate - time.perf_counter()))
    for _ in tasks:
        due.put_nowait(-1.0)
    await asyncio.gather(*tasks)
    return {"latencies": latencies, "errors": errors, "cpu_s": time.process_time() - cpu0,
            "wall_s": time.perf_counter() - start}


OPENLOOP_C = Path(__file__).parent / "tools" / "openloop.c"


def openloop_binary() -> Path:
    """``openloop.c`` compiled (once, into the jar cache's sibling) with the system's cc."""
    binary = Path.home() / ".cache" / "fanout" / "bin" / "openloop"
    if not binary.exists() or binary.stat().st_mtime < OPENLOOP_C.stat().st_mtime:
        binary.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([_need("cc"), "-O2", "-o", str(binary), str(OPENLOOP_C)], check=True)
    return binary


def open_loop(server: Server, rate: float, args: argparse.Namespace) -> dict:
    """Open loop at ``rate``: the C client (default) or ``--open-processes`` Python ones."""
    if args.open_client == "c":
        return _open_loop_c(server, rate, args)
    return _open_loop_python(server, rate, args)


def _open_loop_c(server: Server, rate: float, args: argparse.Namespace) -> dict:
    assert server.process is not None
    argv = [str(openloop_binary()), str(server.port), f"{rate:.1f}", f"{args.seconds:g}",
            str(args.open_connections), str(args.users), str(args.seed)]
    load, cpu0, client0 = os.getloadavg()[0], _tree_cpu(server.process.pid), children_cpu()
    t0 = time.perf_counter()
    raw = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    wall = time.perf_counter() - t0
    return {"rate": round(rate), "achieved_per_s": round(raw["achieved_per_s"]),
            "requests": raw["requests"], "errors": raw["non200"] + raw["unanswered"] + raw["lost"],
            "client": "openloop.c, 1 process", "connections": args.open_connections,
            **{k: round(raw[k], 2) for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms")},
            "client_cpu_s": round(children_cpu() - client0, 2),
            "server_cores": round((_tree_cpu(server.process.pid) - cpu0) / wall, 2),
            "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)]}


def _open_loop_python(server: Server, rate: float, args: argparse.Namespace) -> dict:
    procs = args.open_processes
    queue: multiprocessing.Queue = multiprocessing.Queue()
    assert server.process is not None
    load, cpu0 = os.getloadavg()[0], _tree_cpu(server.process.pid)
    workers = [multiprocessing.Process(target=_open_worker, args=(
        server.port, rate / procs, args.seconds, max(1, args.open_connections // procs),
        args.users, args.seed + i, queue)) for i in range(procs)]
    for w in workers:
        w.start()
    parts = [queue.get(timeout=args.seconds * 4 + 60) for _ in workers]
    for w in workers:
        w.join(10)
    server_cpu = _tree_cpu(server.process.pid) - cpu0
    latencies = [x for p in parts for x in p["latencies"]]
    wall = max(p["wall_s"] for p in parts)
    return {"rate": round(rate), "achieved_per_s": round(len(latencies) / wall),
            "requests": len(latencies), "errors": sum(p["errors"] for p in parts),
            "processes": procs, "connections": args.open_connections,
            **{f"p{k}_ms": round(percentile(latencies, q), 2)
               for k, q in (("50", .5), ("99", .99), ("999", .999))},
            "max_ms": round(max(latencies, default=0), 2),
            "client_cpu_s": round(sum(p["cpu_s"] for p in parts), 2),
            "server_cores": round(server_cpu / wall, 2),
            "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)]}


# -- main ----------------------------------------------------------------------------


def _show(label: str, r: dict) -> None:
    print(f"{label:>28}: {r.get('requests_per_s', r.get('achieved_per_s')):>6} req/s, "
          f"p50 {r.get('p50_ms')} ms, p99 {r.get('p99_ms')} ms; "
          + (f"{r['requests_per_cpu_s']} req per server CPU-s ({r['server_cores']} cores); "
             if "requests_per_cpu_s" in r else f"server {r['server_cores']} cores; ")
          + f"client {r['client_cpu_s']} CPU-s; errors {r['errors']}/{r.get('non2xx', 0)}; "
          f"load {r['loadavg_1m']}", flush=True)


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="http", users=20_000, follows=200_000,
                         tweets=200_000, store=Path("/tmp/fanout-api/v.sqlite"), rounds=2)
    ap.add_argument("--celebrity-threshold", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=50_000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cache-mb", type=int, default=256,
                    help="page cache per API process (MiB): enough for every first page")
    ap.add_argument("--connections", default="1,16,64")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--wrk-threads", type=int, default=2)
    ap.add_argument("--open-client", choices=("c", "python"), default="c",
                    help="open-loop client: openloop.c (built with cc on first use; a few "
                         "us of a core per request) or --open-processes asyncio processes "
                         "(~190 us per request: on 2 cores it takes the server's CPU)")
    ap.add_argument("--open-processes", type=int, default=2)
    ap.add_argument("--open-connections", type=int, default=64)
    ap.add_argument("--open-rates", default="1000,2000,3500",
                    help="open-loop rates (req/s) measured besides half the saturation: "
                         "the Python client's own CPU grows with the rate")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--doors", default="", metavar="DOORS",
                    help="only compare where a page read is answered (FANOUT_API_FAST_READS, "
                         "comma-separated: middleware,off), each warmed up, then "
                         "--seconds at the highest connection count, in turns, --rounds times")
    ap.add_argument("--before", default="", metavar="REV",
                    help="first measure the API of git revision REV (one process, "
                         "without httptools/uvloop, as it then ran) at --connections")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.store.exists():
        args.store.parent.mkdir(parents=True, exist_ok=True)
        info = build(args.store, args)
        args.store.with_suffix(".json").write_text(json.dumps(info))
    conns = [int(c) for c in args.connections.split(",")]
    out: dict = {"settings": {k: str(v) for k, v in vars(args).items()},
                 "machine": {"cpus": os.cpu_count()}, "closed": {}}
    if args.doors:
        return _doors(args, conns[-1], out)
    with scratch("fanout-http-") as work:
        if args.before:
            with api(args.store, 1, 0, work, checkout(args.before, work)) as server:
                wrk(server, conns[-1], 3, args, work)
                out["before"] = {"rev": args.before, "closed": {}}
                for c in conns:
                    out["before"]["closed"][str(c)] = r = wrk(server, c, args.seconds, args,
                                                              work)
                    _show(f"before ({args.before}), {c}c", r)
        with api(args.store, args.workers, args.cache_mb, work) as server:
            out["warmup"] = warm_up(server, conns[-1], args, work)
            for c in conns:
                out["closed"][str(c)] = r = wrk(server, c, args.seconds, args, work)
                _show(f"API, {c} connections", r)
            status, body = asyncio.run(_get_once(server.port, "/v1/users/1/home?limit=20"))
            reply = asyncio.run(_etag(server.port))
            out["not_modified"] = r = wrk(server, conns[-1], args.seconds / 2, args, work,
                                          headers=(f"If-None-Match: {reply}",),
                                          path="/v1/users/1/home?limit=20")
            _show("API, If-None-Match → 304", r)
            rate = out["closed"][str(conns[-1])]["requests_per_s"] / 2
            out["open_loop_half_saturation"] = r = open_loop(server, rate, args)
            _show(f"API, open loop {round(rate)}/s", r)
            out["open_loop"] = {}
            for fixed in (float(x) for x in args.open_rates.split(",") if x):
                out["open_loop"][str(round(fixed))] = r = open_loop(server, fixed, args)
                _show(f"API, open loop {round(fixed)}/s", r)
        with api(args.store, args.workers, 0, work) as server:
            wrk(server, conns[-1], 2, args, work)
            out["cache_off"] = r = wrk(server, conns[-1], args.seconds, args, work)
            _show(f"API, page cache off, {conns[-1]}c", r)
        with api(args.store, 1, args.cache_mb, work) as server:
            wrk(server, conns[-1], 3, args, work)
            out["one_worker"] = r = wrk(server, conns[-1], args.seconds, args, work)
            _show(f"API, 1 worker, {conns[-1]}c", r)
        with nginx(body, args.workers, work) as server:
            out["nginx"] = r = wrk(server, conns[-1], args.seconds, args, work)
            _show(f"nginx, same body, {conns[-1]}c", r)
    top = out["closed"][str(conns[-1])]["requests_per_s"]
    out["fraction_of_nginx"] = round(top / out["nginx"]["requests_per_s"], 3)
    out["body_bytes"], out["body_status"] = len(body), status
    print(f"API at {conns[-1]} connections = {out['fraction_of_nginx']:.1%} of nginx "
          f"serving the same {len(body)}-byte body")
    print(f"written to {save(args.name, out)}")
    return 0


def _doors(args: argparse.Namespace, connections: int, out: dict) -> int:
    """Cached reads per API CPU-second through each door, in turns (``--doors``)."""
    doors = [d for d in args.doors.split(",") if d]
    out["doors"] = {d: [] for d in doors}
    with scratch("fanout-http-") as work:
        for turn in range(args.rounds):
            for door in doors:
                with api(args.store, args.workers, args.cache_mb, work, doors=door) as server:
                    print(f"turn {turn + 1}, door {door}: warming up", flush=True)
                    warm_up(server, connections, args, work, least=4)
                    out["doors"][door].append(r := wrk(server, connections, args.seconds,
                                                       args, work))
                    _show(f"door {door}, {connections}c", r)
    best = {d: max(r["requests_per_cpu_s"] for r in runs) for d, runs in out["doors"].items()}
    base = best.get("off")
    for door, value in best.items():
        out.setdefault("per_api_cpu_s", {})[door] = value
        if base:
            out.setdefault("against_the_route", {})[door] = round(value / base, 2)
        print(f"{door}: {value} reads per API CPU-second"
              + (f", {value / base:.2f}x the route's" if base else ""))
    print(f"written to {save(args.name, out)}")
    return 0


async def _etag(port: int) -> str:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(_request("/v1/users/1/home?limit=20"))
        head = await reader.readuntil(b"\r\n\r\n")
    finally:
        writer.close()
    found = re.search(rb"(?i)\r\netag: *([^\r]+)", head)
    if found is None:
        raise RuntimeError("the API sent no ETag")
    return found.group(1).decode()


if __name__ == "__main__":
    sys.exit(main())
