"""Network faults in sequence, at random, under load on a 3-node stack with hosts of its own.

    .venv/bin/python benchmarks/run.py run soak                   # ~20 min here → results/soak.json
    .venv/bin/python benchmarks/run.py run soak --faults 3 --hold 30 --name soak-short

As root (network namespaces): ``fanout up --nodes 3 --hosts`` in a scratch directory,
then a paced replay of a generated history, the history checker's writers and readers
on the API (:class:`infra.checks.checker.Workload`) and live home streams held by
:class:`infra.checks.checker.StreamHolder` clients that drop and resume, all running through
``--faults`` faults drawn at random (``--seed``) from the nemesis's: a host isolated,
the majority cut from a minority of one, a one-way partition, a flapping host, a lossy
host, a throttled link, a slow link and the job and API cut off from the brokers. Each holds
``--hold`` seconds (:func:`infra.checks.under_fault.hold`: a probe write a second meanwhile), then
heals, with ``--gap`` seconds between two. Per fault: writes and their statuses in
the window, the 503s and how fast they came, reads (errors, p99), the first 202 after
the heal, and the live verifier's nines over the window. At the end: ``fanout verify``
(0 divergent), :func:`infra.checks.checker.check` (lost, duplicated, phantom writes: 0 each)
and the streams' missed, duplicated and phantom events (0 each).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from bench_nodes import FANOUT, BenchError, _env, fanout, say
from harness import ROOT, argument_parser, save
from pipeline import scratch

from infra import webclient

sys.path.insert(0, str(ROOT))

from infra.checks.checker import (  # noqa: E402
    History,
    StreamHolder,
    Workload,
    check,
    check_streams,
    log_ends,
)
from infra.checks.under_fault import flapping, hold  # noqa: E402
from infra.faults.nemesis import Nemesis  # noqa: E402
from infra.services.hosts import require_netns  # noqa: E402
from infra.stack.stack import Stack  # noqa: E402
from ingest.events import TWEETS  # noqa: E402
from ingest.settings import KafkaSettings  # noqa: E402
from serving.callers import mint  # noqa: E402
from views.stores import store_from_url  # noqa: E402

NODES = ("node-1", "node-2", "node-3")


def faults(rng: random.Random) -> dict[str, Any]:
    """Every fault the soak draws from: name → what it does to a :class:`Nemesis`."""
    a, b = rng.sample(NODES, 2)
    return {f"isolate {a}": lambda n: n.isolate(a),
            f"partition majority | {a}": lambda n: n.partition([a]),
            f"one-way {a} -> {b}": lambda n: n.one_way(a, b),
            f"flap {a}": flapping(a),
            f"lossy {a} 5%": lambda n: n.lossy(a, 5.0),
            f"throttle {a} 1mbit": lambda n: n.throttle(a, "1mbit"),
            f"slow {a} 100±50ms": lambda n: n.slow(a, 100, 50),
            "cut-root": lambda n: n.cut_root()}


def nines(verifier: str | None) -> dict[str, float]:
    """The live verifier's consistent-within ratios now (sampler a), by window."""
    if not verifier:
        return {}
    try:
        text = webclient.get(verifier, timeout=5).text
    except httpx.HTTPError:
        return {}
    found = {}
    for line in text.splitlines():
        if line.startswith("fanout_verify_consistent_within_ratio{") and 'sampler="a"' in line:
            labels, value = line.rsplit(" ", 1)
            window = labels.split('window="', 1)[1].split('"', 1)[0]
            span = labels.split('span="', 1)[1].split('"', 1)[0] if 'span="' in labels else ""
            found[f"{window}/{span}"] = float(value)
    return found


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="soak", users=200, follows=2000,
                         posts=4000)
    ap.add_argument("--faults", type=int, default=8, help="faults in the sequence")
    ap.add_argument("--hold", type=float, default=30.0, help="seconds each fault holds")
    ap.add_argument("--gap", type=float, default=20.0, help="seconds between two faults")
    ap.add_argument("--streams", type=int, default=12, help="live home streams held")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    require_netns()
    rng = random.Random(args.seed)
    result: dict[str, Any] = {"args": vars(args), "faults": []}
    with scratch("fanout-bench-soak-") as work:
        run = work / "run"
        began = time.monotonic()
        try:
            say("up", "fanout up --nodes 3 --hosts")
            fanout(run, "up", "--nodes", "3", "--hosts", "--timeout", "900", label="up")
            result["up_s"] = round(time.monotonic() - began, 1)
            result.update(_soak(args, rng, work, run))
        finally:
            say("down", "fanout down")
            subprocess.run([*FANOUT, "--run-dir", str(run), "down"], cwd=ROOT, env=_env(),
                           capture_output=True, timeout=600, check=False)
    path = save(args.name, result)
    print(json.dumps({k: v for k, v in result.items() if k != "faults"}, indent=2))
    print(f"results: {path}")
    ok = result["checker"]["ok"] and result["streams"]["ok"] and result["divergent"] == 0
    return 0 if ok else 1


def _soak(args: argparse.Namespace, rng: random.Random, work: Path, run: Path
          ) -> dict[str, Any]:
    stack = Stack.load(run)
    if stack is None:
        msg = f"no stack in {run}"
        raise BenchError(msg)
    kafka = KafkaSettings(bootstrap=stack.bootstrap, partitions=stack.partitions,
                          topic_prefix=stack.topic_prefix)
    history_file = work / "history"
    span_days = (args.faults * (args.hold + args.gap) + 120) / 86400 * 20
    fanout(work / "gen", "generate", "--out", str(history_file), "--users", str(args.users),
           "--follows", str(args.follows), "--tweets", str(args.posts), "--seed",
           str(args.seed), "--start", str(int(time.time() * 1000)), "--span-days",
           f"{span_days:.4f}", label="history")
    history = History()
    history.start_offsets = log_ends(kafka.bootstrap, kafka.topic(TWEETS))
    secret = stack.env().get("FANOUT_AUTH_SECRET", "").encode()
    token = (lambda u: mint(u, secret, 86400)) if secret else (lambda _: None)
    workload = Workload(stack.api_url, list(range(1, args.users + 1)), history, token,
                        write_every=0.1, read_every=0.1, seed=args.seed).start()
    holders = [StreamHolder(stack.api_url, u, token(u), limit=20, drop_every=5, seed=u).start()
               for u in range(1, args.streams + 1)]
    replay = subprocess.Popen(
        [*FANOUT, "--run-dir", str(run), "replay", str(history_file), "--speedup", "20",
         "--no-progress", "--max-failures", "-1"], cwd=ROOT, env=_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    nemesis = Nemesis(run, echo=False)
    figures: list[dict[str, Any]] = []
    try:
        time.sleep(args.gap)
        for i in range(args.faults):
            name, apply = rng.choice(list(faults(rng).items()))
            say("fault", f"{i + 1}/{args.faults}: {name} for {args.hold:.0f}s")
            window = hold(nemesis, name, apply, stack.api_url, history, args.hold, args.users,
                          token)
            say("fault", window.render(history).replace("\n", "; "))
            time.sleep(args.gap)
            figures.append({"index": i + 1, **window.figures(history),
                            "nines_after": nines(stack.verifier_url())})
    finally:
        nemesis.heal()
        workload.stop()
    out, _ = replay.communicate(timeout=1800)
    say("replay", out.strip().splitlines()[-1] if out.strip() else f"exit {replay.returncode}")
    began = time.monotonic()
    verified = fanout(run, "verify", "--wait", "600", label="verify")
    caught_up = time.monotonic() - began
    divergent = int(verified.split(" divergent")[0].rsplit(" ", 1)[-1]) \
        if " divergent" in verified else -1
    with store_from_url(stack.store_url, cap=800) as store:
        report = check(history, kafka.bootstrap, kafka.topic(TWEETS), store)
    streams = check_streams(holders, wait=120)
    for holder in holders:
        holder.join(20)
    say("checker", report.render())
    say("streams", streams.render())
    say("verify", verified.strip().splitlines()[-1])
    return {"faults": figures, "checker": {
                "ok": report.ok, "writes": report.attempted, "acked": report.acknowledged,
                "lost": len(report.lost), "duplicated": len(report.duplicated),
                "phantom": len(report.phantom),
                # each write found twice or lost, with when it was sent and what it got,
                # to place it among the faults' windows
                "odd_writes": [{"n": op.n, "began": op.began, "took": op.took,
                                "status": op.status, "user": op.user}
                               for op in history.writes
                               if op.n in set(report.duplicated) | set(report.lost)]},
            "streams": {"ok": streams.ok, "events": streams.events, "resumes": streams.resumes,
                        "missed": streams.missed, "duplicated": streams.duplicated,
                        "phantom": streams.phantom},
            "divergent": divergent, "verify_after_replay_s": round(caught_up, 1),
            "nines_end": nines(stack.verifier_url())}


if __name__ == "__main__":
    sys.exit(main())
