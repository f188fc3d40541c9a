"""A newcomer's first run: `make demo` in a fresh clone with every cache empty, then again.

    .venv/bin/python benchmarks/bench_first_run.py      # ~4 min → first_run.json

Clones the repository's HEAD into a scratch directory and runs ``make demo`` there
with empty caches of its own: pip's and uv's, Maven's local repository, the jar cache,
Spark's home and the class archive (so PyPI and Maven Central are read as on a new
machine; Java and Maven must be installed). Then ``make demo`` once more in the same
clone, installed. Reported: the wall time of each run, the install's share of the
first (up to the virtualenv's stamp, the jars fetched meanwhile; then ``fanout jars``
for the connector) and the demo's own step timings, its ``verify`` step included.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import ROOT, argument_parser, save

ap = argument_parser(__doc__.splitlines()[0], name="first_run")
ap.add_argument("--keep", action="store_true", help="leave the scratch clone and caches")

#: A step line of the demo's closing table: "   12.3s  what it did".
_STEP = re.compile(r"^\s+(\d+\.\d)s  (.+)$")


def _make_demo(clone: Path, env: dict[str, str], log: Path) -> dict[str, Any]:
    """One ``make demo``: its wall time, when the install ended, the demo's steps."""
    began = time.monotonic()
    marks: dict[str, float] = {}
    steps: dict[str, float] = {}
    said = -1.0  # the last 10-s window a line was echoed in
    with log.open("a") as out, subprocess.Popen(
            ["make", "demo"], cwd=clone, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True) as make:
        assert make.stdout is not None
        for line in make.stdout:
            out.write(line)
            now = round(time.monotonic() - began, 1)
            if line.startswith("touch ") and "installed-stamp" in line:
                marks["installed"] = now
            elif line.startswith(".venv/bin/fanout demo"):
                marks["jars"] = now
            elif (step := _STEP.match(line)) is not None:
                steps[step.group(2)] = float(step.group(1))
            if now // 10 > said:  # a line every 10 s at most
                said = now // 10
                print(f"  {now:.0f} s: {line.rstrip()[:100]}", flush=True)
    if make.returncode != 0:
        sys.exit(f"make demo failed (exit {make.returncode}); see {log}")
    return {"seconds": round(time.monotonic() - began, 1), "marks": marks, "steps": steps}


def main() -> None:
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="fanout-first-run-"))
    clone, caches, log = scratch / "fanout", scratch / "caches", scratch / "make.log"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {**os.environ,
           "PIP_CACHE_DIR": str(caches / "pip"), "UV_CACHE_DIR": str(caches / "uv"),
           "MAVEN_OPTS": f"-Dmaven.repo.local={caches / 'm2'}",
           "FANOUT_JAR_CACHE": str(caches / "jars"),
           "FANOUT_SPARK_HOME_CACHE": str(caches / "spark-home"),
           "FANOUT_CLASS_ARCHIVE_CACHE": str(caches / "class-archive")}
    env.pop("VIRTUAL_ENV", None)
    try:
        print(f"make demo from nothing in {clone} (log {log})", flush=True)
        first = _make_demo(clone, env, log)
        print(f"from nothing: {first['seconds']} s; again, installed", flush=True)
        again = _make_demo(clone, env, log)
        print(f"installed: {again['seconds']} s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(save(args.name, {"from_nothing": first, "installed": again}))


if __name__ == "__main__":
    main()
