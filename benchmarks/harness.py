"""What every benchmark shares: where results go, the stamp each carries, and the comparison.

A result is one JSON file a scenario, ``benchmarks/results/NAME.json``, written by
:func:`save` with a ``stamp``: the commit it ran on (and whether the tree had
uncommitted changes), the machine (host, cores, memory, load average over 1, 5 and 15
minutes at the end of the run) and the date in UTC. The file keeps the latest result;
earlier ones live in git, so a file name never says when or why it was run.
:func:`argument_parser` is the argument set the scenarios share (the result's name, the
sizes, the store file, the rounds): one meaning and one help text each, the script's defaults.
:func:`compare` sets a result beside another — the same file at an earlier commit by
default — figure by figure, with the ratio; ``benchmarks/run.py compare`` prints it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _git(*argv: str) -> str:
    out = subprocess.run(["git", "-C", str(ROOT), *argv], capture_output=True, text=True,
                         check=False)
    return out.stdout if out.returncode == 0 else ""


def _memory_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return 0.0


#: An argument :func:`argument_parser` leaves out (``None`` is a default some scripts use).
OMIT: Any = object()

_SIZES = {
    "users": "users in the history, ids 1..N (default: %(default)s)",
    "follows": "follows in the history (default: %(default)s)",
    "tweets": "tweets in the history (default: %(default)s)",
    "posts": "posts in the history, written through the stack (default: %(default)s)",
    "edges": "only the first N ego-twitter edges (default: %(default)s; None: all)",
}


def argument_parser(description: str, *, name: Any = OMIT, users: Any = OMIT,
                    follows: Any = OMIT, tweets: Any = OMIT, posts: Any = OMIT, edges: Any = OMIT,
                    store: Any = OMIT, rounds: Any = OMIT) -> argparse.ArgumentParser:
    """An argument parser with the options the scenarios share, each at the default given.

    An option left at :data:`OMIT` is not added (a script whose ``--users`` means Locust's
    users, or whose ``--tweets`` counts a batch, adds its own). ``name`` is the result's
    file, ``results/NAME.json``; ``store`` a SQLite view store file; ``rounds`` how often
    each measurement runs.
    """
    ap = argparse.ArgumentParser(description=description)
    if name is not OMIT:
        ap.add_argument("--name", default=name,
                        help="write the result to results/NAME.json (default: %(default)s)")
    sizes = {"users": users, "follows": follows, "tweets": tweets, "posts": posts,
             "edges": edges}
    for option, help_text in _SIZES.items():
        default = sizes[option]
        if default is not OMIT:
            ap.add_argument(f"--{option}", type=int, default=default, help=help_text)
    if store is not OMIT:
        ap.add_argument("--store", type=Path, default=store,
                        help="a SQLite view store file, used if it exists; a script that "
                             "builds its store builds it there, or in a temporary file when "
                             "None (default: %(default)s)")
    if rounds is not OMIT:
        ap.add_argument("--rounds", type=int, default=rounds,
                        help="rounds of each measurement; the script's docstring says which "
                             "it reports (default: %(default)s)")
    return ap


def stamp() -> dict[str, Any]:
    """The commit, the machine and the date of a result (taken when it is saved)."""
    return {
        "commit": _git("rev-parse", "--short", "HEAD").strip(),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no").strip()),
        "machine": platform.node(),
        "cores": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def cpu_seconds(pid: int | None) -> float:
    """The CPU-seconds (user and system) process ``pid`` has used so far; 0 for None."""
    if pid is None:
        return 0.0
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU-seconds of a process's live threads, summed by name (digits and separators cut),
    and the whole process's (``""``: its ended threads too)."""
    out = defaultdict[str, float](float)
    out[""] = cpu_seconds(pid)
    for thread in psutil.Process(pid).threads():
        try:
            name = Path(f"/proc/{pid}/task/{thread.id}/comm").read_text().strip()
        except OSError:
            continue  # ended meanwhile
        out[re.sub(r"[-:#]?\d+$", "", name).strip()] += thread.user_time + thread.system_time
    return dict(out)


def save(name: str, result: dict[str, Any]) -> Path:
    """Write ``result`` as ``results/NAME.json`` with its :func:`stamp`; return the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({**result, "stamp": stamp()}, indent=2, default=str) + "\n")
    return path


def load(name: str, rev: str | None = None) -> dict[str, Any] | None:
    """``results/NAME.json`` from the working tree, or as it was at commit ``rev``."""
    path = RESULTS / f"{name}.json"
    if rev is None:
        return json.loads(path.read_text()) if path.exists() else None
    text = _git("show", f"{rev}:{path.relative_to(ROOT)}")
    return json.loads(text) if text else None


def previous(name: str) -> str | None:
    """The commit whose ``results/NAME.json`` the working tree's is to be set against.

    ``HEAD`` when the file differs from it (a fresh, uncommitted result); otherwise
    the commit before the last one that changed the file.
    """
    rel = str((RESULTS / f"{name}.json").relative_to(ROOT))
    if _git("status", "--porcelain", "--", rel).strip():
        return "HEAD" if _exists("HEAD", rel) else None
    commits = _git("log", "-n", "2", "--format=%H", "--", rel).split()
    return commits[1] if len(commits) > 1 else None


def _exists(rev: str, rel: str) -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}:{rel}"],
                          capture_output=True, check=False).returncode == 0


def figures(result: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every number of a result with its path (``phases.1.seconds``); the stamp and the
    arguments are not figures."""
    if isinstance(result, dict):
        for key, value in result.items():
            if not prefix and key in ("stamp", "args"):
                continue
            yield from figures(value, f"{prefix}{key}.")
    elif isinstance(result, list):
        for i, value in enumerate(result):
            yield from figures(value, f"{prefix}{i}.")
    elif isinstance(result, (int, float)) and not isinstance(result, bool):
        if math.isfinite(result):
            yield prefix.rstrip("."), float(result)


def compare(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, float, float, float | None]]:
    """``(figure, old, new, new / old)`` for every figure both results have, in ``new``'s order."""
    before = dict(figures(old))
    rows = []
    for path, value in figures(new):
        if path in before:
            was = before[path]
            rows.append((path, was, value, value / was if was else None))
    return rows


def describe(stamped: dict[str, Any]) -> str:
    """One line on where a result comes from."""
    s = stamped.get("stamp") or {}
    if not s:
        return "(no stamp)"
    load_1 = (s.get("load_average") or ["?"])[0]
    dirty = "+changes" if s.get("dirty") else ""
    return (f"{s.get('commit', '?')}{dirty} on {s.get('machine', '?')} "
            f"({s.get('cores', '?')} cores, load {load_1}) at {s.get('date', '?')}")


#: The start of a wrk script whose threads each draw their own users (a Lua state per
#: thread, seeded by its index): with one seed for all, every thread asked for the same
#: users in the same order. ``%(seed)d`` is the run's seed.
WRK_THREADS_LUA = """
local threads = 0
setup = function(thread)
  threads = threads + 1
  thread:set("index", threads)
end
init = function(args)
  math.randomseed(%(seed)d * 1000 + index)
end
"""
