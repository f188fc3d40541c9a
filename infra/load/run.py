"""``fanout load``: a headless load run against the local stack, written up as a report.

It finds (or, with ``--start``, starts and fills) the stack, prepares the workload
from the store (:mod:`infra.load.prep`), and for each read mode measured — the
materialized view (``fanout``), the read-time baseline (``read``), or both with
``--compare`` — runs ``loadgen/locustfile.py`` headless in a Locust subprocess (open
loop at ``--rate`` or closed loop with ``--users``), the fan-out probe beside it, and
then reads the view job's lag per micro-batch from the store. Progress shows while
it runs. The results go to ``reports/<run>/``: ``summary.json``, ``report.html`` and
the PNGs (:mod:`loadgen.report`); a short table is printed at the end.

The default mix, ``social``, acts as DESIGN §4b's users do: replies, reposts and
their undos, blocks, mutes and now and then an account deletion beside posts,
follows and timeline reads (:mod:`loadgen.workload`). The probe's authors join its
followers among the workload's reserved users, whom the load never blocks, mutes or
deletes, so the probe's edges hold whatever the mix does.

Every run is bounded: in time (``--duration`` plus warm-up, with a hard deadline on
the subprocess), in requests (``--max-requests``) and in place (loopback targets
only, unless ``--allow-remote``). The flags of :class:`~infra.load.settings.LoadSettings`
(``--target``, ``--profile``, ``--duration``, ``--warmup``, ``--rate``, ``--users``,
``--reports``) fall back to its ``FANOUT_LOAD_*`` and ``FANOUT_REPORTS_DIR`` variables;
Locust gets its workload in the ``LOCUST_FANOUT_*`` variables (:func:`locust_env`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

import loadgen
from infra import webclient
from infra.errors import LoadRunError
from infra.load import prep as loadprep
from infra.load.settings import LoadSettings
from infra.services.process import interrupted_by_signals
from ingest.progress import progress as progress_bar
from loadgen.errors import LoadgenError
from loadgen.probe import FanoutProbe, ProbeResult, ProbeSettings, Target
from loadgen.settings import LocustSettings
from loadgen.workload import Workload, parse_mix, parse_user_range

if TYPE_CHECKING:  # the report pulls in matplotlib: imported when a run needs it
    from loadgen.report import ModeRun

log = logging.getLogger(__name__)

LOCUSTFILE = Path(loadgen.__file__).with_name("locustfile.py")
RESULTS, LIVE = "hdr.json", "live.json"
GRACE = 60.0
MAX_DURATION = 3_600.0
MODES = ("fanout", "read")


@dataclass(frozen=True)
class LoadPlan:
    """One validated ``fanout load`` invocation."""

    name: str
    out: Path
    target: str
    profile: str
    duration: float
    warmup: float
    rate: float
    users: int
    arrivals: str
    modes: tuple[str, ...]
    processes: int
    max_requests: int
    probe: bool
    probe_interval: float
    probe_authors: int
    probe_deadline: float
    seed: int

    @property
    def interval(self) -> float:
        """Timeline interval: 1 s, coarser for long runs (at most ~600 intervals)."""
        return float(max(1, math.ceil((self.warmup + self.duration) / 600)))


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``fanout load`` to the ``fanout`` command."""
    p = sub.add_parser("load", help="headless load run with an HdrHistogram report",
                       description=__doc__.split("\n\n")[0])
    LoadSettings.add_flags(p, "target")["target"].metavar = "URL"
    p.add_argument("--start", action="store_true",
                   help="start a stack in <run-dir>/load, fill it with a synthetic history, "
                        "load it, stop it")
    LoadSettings.add_flags(p, "profile", "duration", "warmup", "rate", "users")
    p.add_argument("--arrivals", choices=("constant", "poisson"), default="constant",
                   help="open-loop schedule (default constant)")
    p.add_argument("--read-mode", choices=MODES, default="fanout",
                   help="API read mode to load (default fanout: the materialized view)")
    p.add_argument("--compare", action="store_true",
                   help="load fanout and read mode in turn, same load and store, one report")
    _add_bounds(p)
    _add_probe(p)
    _add_start(p)
    p.set_defaults(func=run)


def _add_bounds(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default=None, help="report directory name (default: time+profile)")
    LoadSettings.add_flags(p, "reports")
    p.add_argument("--processes", type=int, default=1,
                   help="Locust processes (a master and N workers when > 1; default 1)")
    p.add_argument("--max-requests", type=int, default=None,
                   help="stop a mode after this many requests (default: 3x the planned)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a --target that is not loopback")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")


def _add_probe(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-probe", action="store_true", help="do not measure fan-out latency")
    p.add_argument("--probe-interval", type=float, default=1.0,
                   help="seconds between fan-out probes (default 1)")
    p.add_argument("--probe-authors", type=int, default=8,
                   help="authors sampled per class, normal and celebrity (default 8)")
    p.add_argument("--probe-deadline", type=float, default=30.0,
                   help="seconds a probe waits to see its tweet (default 30)")


def _add_start(p: argparse.ArgumentParser) -> None:
    h = loadprep.History()
    p.add_argument("--history-users", type=int, default=h.users)
    p.add_argument("--history-follows", type=int, default=h.follows)
    p.add_argument("--history-tweets", type=int, default=h.tweets)
    p.add_argument("--celebrity-threshold", type=int, default=h.celebrity_threshold,
                   help=f"for --start (default {h.celebrity_threshold})")
    p.add_argument("--auth", choices=("on", "off"), default="on",
                   help="for --start: API auth (default on: tokens are minted for the load)")
    p.add_argument("--store", choices=("sqlite", "cassandra"), default=None,
                   help="for --start: the stack's store, as `fanout up --store` (default: "
                        "FANOUT_STORE, else an SQLite file; cassandra starts a local node)")
    p.add_argument("--keep", action="store_true", help="for --start: leave the stack up")
    p.add_argument("--user-range", default="1-2000",
                   help="users to act as when the store is unknown (default 1-2000)")


# -- the run ------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """``fanout load``: 0 when the report was written and its figures are consistent."""
    from loadgen.report import render_text

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe request
    try:
        plan = make_plan(args)
        with interrupted_by_signals():  # Locust and a read-mode API are stopped on the way out
            summary = execute(plan, args)
    except (LoadRunError, LoadgenError, OSError) as exc:
        log.error("load run failed: %s", exc)
        return 1
    except KeyboardInterrupt as exc:
        log.error("load run stopped by %s before its report; what it started is stopped",
                  exc.args[0] if exc.args else "Ctrl-C")
        return 130
    print(render_text(summary))
    print(f"\nreport: {plan.out / 'report.html'}")
    bad = [p for figures in summary["modes"].values() for p in figures["problems"]]
    return 1 if bad else 0


def load_settings(args: argparse.Namespace) -> LoadSettings:
    """The :class:`LoadSettings` of an invocation: its flags over ``args.environ``."""
    flags = {field: getattr(args, field, None) for field in LoadSettings.model_fields}
    return LoadSettings.from_env(args.environ, **flags)


def make_plan(args: argparse.Namespace) -> LoadPlan:
    """Validate the flags and their variables into a :class:`LoadPlan` (bounds included)."""
    s = load_settings(args)
    parse_mix(s.profile)
    _check(0 < s.duration <= MAX_DURATION, f"--duration must be in (0, {MAX_DURATION:g}]")
    _check(0 <= s.warmup <= 600, "--warmup must be in [0, 600]")
    _check(0 <= s.rate <= 50_000, "--rate must be in [0, 50000]")
    _check(1 <= s.users <= 5_000, "--users must be in [1, 5000]")
    _check(1 <= args.processes <= (os.cpu_count() or 1) * 2, "--processes is too large")
    name = args.name or time.strftime("%Y%m%d-%H%M%S-") + s.profile.split(":")[0]
    modes = MODES if args.compare else (args.read_mode,)
    planned = (s.rate or s.users * 200) * (s.duration + s.warmup)
    return LoadPlan(name, s.reports / name, s.target, s.profile, s.duration, s.warmup,
                    s.rate, s.users, args.arrivals, modes, args.processes,
                    args.max_requests or int(3 * planned + 1000), not args.no_probe,
                    args.probe_interval, args.probe_authors, args.probe_deadline, args.seed)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise LoadRunError(message)


def execute(plan: LoadPlan, args: argparse.Namespace) -> dict[str, Any]:
    """Set up, run every mode, and build the report; return its summary."""
    from loadgen.report import build

    history = loadprep.History(args.history_users, args.history_follows, args.history_tweets,
                               args.celebrity_threshold, args.seed + 7)
    with loadprep.target(Path(args.run_dir), url=plan.target or None, start=args.start,
                         history=history, allow_remote=args.allow_remote, auth=args.auth,
                         keep=args.keep, store=args.store) as load, loadprep.private_dir() as private:
        prepared = loadprep.prepare(load, private, probe_authors=args.probe_authors,
                                    seed=plan.seed, user_range=parse_user_range(args.user_range))
        reserve(prepared.workload, prepared.targets)
        runs = [_run_mode(plan, load, prepared, mode) for mode in plan.modes]
    return build(runs, _info(plan, load, prepared), plan.out)


def reserve(workload: Path, targets: list[Target]) -> None:
    """Add the probe's authors and followers to the workload file's reserved users."""
    if not targets:
        return
    loaded = Workload.load(workload)
    probed = {t.author for t in targets} | {t.follower for t in targets}
    loaded.reserved = sorted(set(loaded.reserved) | probed)
    loaded.dump(workload)


def _run_mode(plan: LoadPlan, load: loadprep.LoadTarget, prepared: loadprep.Prepared,
              mode: str) -> ModeRun:
    from loadgen.report import ModeRun, load_results

    out = plan.out / mode
    out.mkdir(parents=True, exist_ok=True)
    with loadprep.api_for(mode, load, prepared.auth, plan.out) as api:
        print(f"==> {mode} mode: {_describe(plan)} against {api}", flush=True)
        started = time.time()
        servers = api_processes(api)
        cpu0, wall0, server0 = children_cpu(), time.monotonic(), cpu_of(servers)
        process = _start_locust(plan, api, prepared, out)
        probe = _ProbeThread(api, prepared, plan) if plan.probe and prepared.targets else None
        try:
            _follow(process, out, plan, mode, probe)
        finally:
            _stop(process)
            result = probe.finish() if probe else None
        # Locust and its workers are reaped by now (the API of read mode is not yet):
        # the load generator's own CPU, to show it was not the bottleneck.
        wall = round(time.monotonic() - wall0, 2)
        client = {"processes": plan.processes, "cpu_s": round(children_cpu() - cpu0, 2),
                  "wall_s": wall}
        # What the same load cost the API serving it: the read modes' CPU side by side.
        server = {"processes": len(servers), "cpu_s": round(cpu_of(servers) - server0, 2),
                  "wall_s": wall} if servers else None
    return ModeRun(mode, load_results(out / RESULTS), result, _lag_series(load, started),
                   plan.probe_deadline, client, server)


def children_cpu() -> float:
    """CPU seconds of this process's reaped children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def api_processes(url: str) -> list[psutil.Process]:
    """The processes listening on ``url``'s port on this machine.

    Each API worker has its own socket, so this is every worker. It is empty for a
    target served from another machine, or where this user may not see the sockets'
    owners: the report then leaves the API's CPU out rather than fail the run.
    """
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    try:
        pids = {c.pid for c in psutil.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid}
        return [psutil.Process(pid) for pid in sorted(pids)]
    except psutil.Error:
        return []


def cpu_of(processes: list[psutil.Process]) -> float:
    """CPU seconds the ``processes`` have used so far (a process gone since counts 0)."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _describe(plan: LoadPlan) -> str:
    loop = (f"open loop {plan.rate:g} actions/s ({plan.arrivals}), {plan.users} users"
            if plan.rate else f"closed loop, {plan.users} users")
    return f"{plan.profile}, {loop}, {plan.warmup:g}s warm-up + {plan.duration:g}s"


# -- Locust in a subprocess -----------------------------------------------------------------
def locust_command(plan: LoadPlan, api: str) -> list[str]:
    """The ``locust`` command line of one mode's run; its workload is :func:`locust_env`."""
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
           "-u", str(plan.users), "-r", str(plan.users), "-t", f"{plan.warmup + plan.duration:g}s",
           "--stop-timeout", "5", "--host", api, "--only-summary", "--loglevel", "INFO"]
    if plan.processes > 1:
        cmd += ["--processes", str(plan.processes)]
    return cmd


def locust_env(plan: LoadPlan, prepared: loadprep.Prepared, out: Path) -> dict[str, str]:
    """The ``LOCUST_FANOUT_*`` variables that give one mode's Locust its workload.

    The locustfile's flags fall back to them (:class:`loadgen.settings.LocustSettings`);
    those not set here are the caller's environment's, or their defaults.
    """
    values: dict[str, object] = {
        "fanout_out": out, "fanout_workload": prepared.workload, "fanout_profile": plan.profile,
        "fanout_rate": plan.rate, "fanout_arrivals": plan.arrivals,
        "fanout_warmup": plan.warmup, "fanout_interval": plan.interval,
        "fanout_seed": plan.seed, "fanout_max_requests": plan.max_requests}
    if prepared.tokens is not None:
        values["fanout_tokens"] = prepared.tokens
    names = LocustSettings.env_names()
    return {names[field]: str(value) for field, value in values.items()}


def _start_locust(plan: LoadPlan, api: str, prepared: loadprep.Prepared,
                  out: Path) -> subprocess.Popen[bytes]:
    (out / RESULTS).unlink(missing_ok=True)
    with (out / "locust.log").open("wb") as logfile:
        # A session of its own: on a deadline the whole group (workers too) is stopped.
        return subprocess.Popen(locust_command(plan, api), stdin=subprocess.DEVNULL,
                                stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **locust_env(plan, prepared, out)})


def _follow(process: subprocess.Popen[bytes], out: Path, plan: LoadPlan, mode: str,
            probe: _ProbeThread | None) -> None:
    """Show progress until Locust exits; stop it at the hard deadline."""
    total = plan.warmup + plan.duration
    began = time.monotonic()
    last = (began, 0)
    with progress_bar(total=round(total), desc=mode, unit="s", bar_format=
                      "{desc}: {bar} {n_fmt}/{total_fmt}s {postfix}") as bar:
        while process.poll() is None:
            if time.monotonic() - began > total + GRACE:
                msg = f"Locust ran past {total + GRACE:.0f}s: stopped; see {out / 'locust.log'}"
                raise LoadRunError(msg)
            live = _read_json(out / LIVE)
            now, count = time.monotonic(), int(live.get("count", 0)) + int(live.get("warmup", 0))
            rps = (count - last[1]) / max(now - last[0], 1e-3)
            last = (now, count)
            bar.n = min(round(total), round(now - began))
            bar.set_postfix_str(f"{rps:,.0f} req/s, {live.get('errors', 0)} errors, "
                                f"{probe.count() if probe else 0} probes")
            time.sleep(1.0)
    if not (out / RESULTS).exists():
        msg = f"Locust exited ({process.returncode}) without results; see {out / 'locust.log'}"
        raise LoadRunError(msg)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the Locust process group we started, if it still runs (bounded)."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        os.killpg(process.pid, sig)
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# -- the probe and the view lag -------------------------------------------------------------
class _ProbeThread:
    """The fan-out probe on a thread of its own for the length of one mode's run."""

    def __init__(self, api: str, prepared: loadprep.Prepared, plan: LoadPlan) -> None:
        self.client = webclient.client(base_url=api, timeout=plan.probe_deadline + 5)
        settings = ProbeSettings(interval=plan.probe_interval, deadline=plan.probe_deadline)
        self.probe = FanoutProbe(self.client, prepared.targets, settings)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(plan.warmup, plan.duration),
                                       name="fanout-probe", daemon=True)
        self.thread.start()

    def _run(self, warmup: float, duration: float) -> None:
        if not self.stop.wait(warmup):  # probe the measured part only
            self.probe.run(self.stop, time.time() + duration)

    def count(self) -> int:
        return len(self.probe.result.samples)

    def finish(self) -> ProbeResult:
        self.stop.set()
        self.thread.join(self.probe.settings.deadline + 60)
        self.client.close()
        return self.probe.result


def _lag_series(load: loadprep.LoadTarget, since: float) -> list[tuple[float, float]]:
    """(applied at, newest event time → applied) in s per micro-batch since ``since``."""
    if not load.store_url:
        return []
    from views.stores import store_from_url

    with store_from_url(load.store_url) as store:
        rows = store.batches(5_000)
    floor_ms = (since - 60) * 1000  # batches of live writes, not of the replayed history
    return sorted((b.finished_at / 1000, (b.finished_at - b.max_event_time) / 1000)
                  for b in rows if b.finished_at >= since * 1000 and b.max_event_time >= floor_ms)


def _info(plan: LoadPlan, load: loadprep.LoadTarget, prepared: loadprep.Prepared
          ) -> dict[str, Any]:
    return {"name": plan.name, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "target": load.api_url, "store": load.store_url, "modes": list(plan.modes),
            "profile": plan.profile, "mix": parse_mix(plan.profile).describe(),
            "loop": "open" if plan.rate else "closed", "rate": plan.rate,
            "arrivals": plan.arrivals, "users": plan.users, "processes": plan.processes,
            "duration_s": plan.duration, "warmup_s": plan.warmup,
            "workload_users": prepared.users, "auth": "on" if prepared.auth else "off",
            "probe": asdict(ProbeSettings(plan.probe_interval, plan.probe_deadline))
            if plan.probe else None, "history": load.history or None,
            "cpus": os.cpu_count(), "python": sys.version.split()[0]}
