"""The one runner of the benchmarks: list them, run one, compare its result with the last.

    .venv/bin/python benchmarks/run.py list
    .venv/bin/python benchmarks/run.py run freshness --rate 500 --seconds 60
    .venv/bin/python benchmarks/run.py run nodes             # one node of each against three
    .venv/bin/python benchmarks/run.py micro                 # the micro-benchmarks (pytest-benchmark)
    .venv/bin/python benchmarks/run.py compare freshness [--against REV] [--match batch]

A *scenario* is a system benchmark, ``benchmarks/bench_NAME.py``: ``run NAME ARGS``
runs it with ``ARGS`` (each scenario's ``--help`` lists its own; ``--name`` picks the
result file of those that write one) and then compares every result file the run
wrote with the same file's previous version in git (:func:`harness.previous`). The
micro-benchmarks are ``benchmarks/micro/`` on pytest-benchmark: the codec, the decode,
the join and the SQLite store's apply, each timed alone in this process; their
summary is ``results/micro.json``. Every result carries the stamp of
:func:`harness.stamp` (commit, machine, load average, date).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import RESULTS, ROOT, compare, describe, load, previous, save

HERE = Path(__file__).resolve().parent


def scenarios() -> dict[str, Path]:
    """Every system benchmark by name: ``bench_NAME.py`` → ``NAME``."""
    return {p.stem.removeprefix("bench_"): p for p in sorted(HERE.glob("bench_*.py"))}


def summary(script: Path) -> str:
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    return doc.split("\n", 1)[0]


def _written(since: dict[Path, float]) -> list[str]:
    return sorted(p.stem for p in RESULTS.glob("*.json")
                  if p.stat().st_mtime > since.get(p, 0.0))


def _mtimes() -> dict[Path, float]:
    return {p: p.stat().st_mtime for p in RESULTS.glob("*.json")} if RESULTS.exists() else {}


def print_comparison(name: str, against: str | None, match: str = "", limit: int = 40) -> bool:
    new = load(name)
    if new is None:
        print(f"{name}: no result in {RESULTS}")
        return False
    rev = against or previous(name)
    old = load(name, rev) if rev else None
    print(f"{name}: {describe(new)}")
    if old is None:
        print("  nothing earlier to compare with" + (f" at {rev}" if rev else " in git"))
        return True
    print(f"  against {rev}: {describe(old)}")
    rows = [r for r in compare(old, new) if match in r[0]]
    changed = [r for r in rows if r[1] != r[2]]
    shown = changed[:limit] if limit else changed
    for path, was, now, ratio in shown:
        times = f"{ratio:7.3f}x" if ratio is not None else "      -"
        print(f"  {path:<60} {was:>14,.4g} {now:>14,.4g} {times}")
    left = len(changed) - len(shown)
    print(f"  {len(rows)} figures in both, {len(changed)} changed"
          + (f" ({left} more: --all)" if left else ""))
    return True


def run(name: str, argv: list[str]) -> int:
    found = scenarios()
    if name not in found:
        print(f"no scenario {name!r}; 'run.py list' names them", file=sys.stderr)
        return 2
    before = _mtimes()
    code = subprocess.run([sys.executable, str(found[name]), *argv], cwd=ROOT,
                          check=False).returncode
    for written in _written(before):
        print_comparison(written, None)
    return code


def micro(argv: list[str]) -> int:
    """The micro-benchmarks under pytest-benchmark; their summary as ``results/micro.json``."""
    with tempfile.TemporaryDirectory(prefix="fanout-micro-") as work:
        raw = Path(work) / "raw.json"
        code = subprocess.run([sys.executable, "-m", "pytest", str(HERE / "micro"), "-q",
                               "-p", "no:cacheprovider", f"--benchmark-json={raw}", *argv],
                              cwd=ROOT, check=False).returncode
        if code != 0 or not raw.exists():
            return code or 1
        report = json.loads(raw.read_text())
    result = {"benchmarks": {
        b["name"]: {k: b["stats"][k] for k in ("min", "median", "mean", "stddev", "rounds")}
                   | dict(b.get("extra_info") or {})
        for b in report["benchmarks"]}}
    print(f"written to {save('micro', result)}")
    print_comparison("micro", None)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the scenarios, and where each latest result comes from")
    p = sub.add_parser("run", help="run a scenario, then compare what it wrote")
    p.add_argument("scenario")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the scenario's own arguments")
    p = sub.add_parser("micro", help="the micro-benchmarks (pytest-benchmark)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="pytest's arguments (-k ...)")
    p = sub.add_parser("compare", help="set results beside their previous version")
    p.add_argument("names", nargs="+", metavar="NAME", help="results/NAME.json")
    p.add_argument("--against", metavar="REV", help="a commit (default: the previous result)")
    p.add_argument("--match", default="", help="only figures whose path contains this")
    p.add_argument("--all", action="store_true", help="every changed figure, not the first 40")
    args = ap.parse_args()
    if args.command == "list":
        for name, script in scenarios().items():
            print(f"{name:<18} {summary(script)}")
        return 0
    if args.command == "run":
        return run(args.scenario, args.args)
    if args.command == "micro":
        return micro(args.args)
    found = [print_comparison(n, args.against, args.match, 0 if args.all else 40)
             for n in args.names]
    return 0 if all(found) else 1


if __name__ == "__main__":
    sys.exit(main())
