"""The busiest threads and methods of a Java Flight Recording of a Spark JVM.

    FANOUT_SPARK_JAVA_OPTIONS="-XX:StartFlightRecording=delay=50s,duration=50s,filename=/tmp/job.jfr,settings=profile" \\
        .venv/bin/python benchmarks/bench_replay.py
    .venv/bin/python benchmarks/tools/jfr_top.py /tmp/job.jfr --thread stateConnection --name jfr-replay

JFR samples threads that run Java code (``jdk.ExecutionSample``, every 10–20 ms in the
``profile`` settings, a few threads at a time) and JDK 17's ``jfr print`` lists them
one by one; this counts them. It prints the samples per thread (numbers in thread
names folded, so one line stands for a pool), then, for the threads whose name starts
with ``--thread``, the methods found on most of their sampled stacks (a method counts
once per stack: the figure is the share of the thread's samples spent in or under
it). Native code (RocksDB, the JVM's own threads) is not sampled, so the shares are of
the Java CPU, not of the process's. A recording is written when its ``duration`` ends:
pick one that ends before the JVM does.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

# The benchmarks' own modules, beside this folder.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import save  # noqa: E402

Sample = tuple[str, list[str]]  # folded thread name, frames (innermost first)

_THREAD = re.compile(r'sampledThread = "(.*)" \(javaThreadId')


def parse(text: str) -> list[Sample]:
    """The execution samples in ``jfr print --events jdk.ExecutionSample`` output."""
    samples: list[Sample] = []
    for event in text.split("jdk.ExecutionSample {")[1:]:
        thread = _THREAD.search(event)
        if thread is None or "stackTrace = [" not in event:
            continue
        stack = event.split("stackTrace = [", 1)[1].split("\n  ]", 1)[0]
        frames = [line.strip().split("(", 1)[0] for line in stack.splitlines()
                  if line.strip() and line.strip() != "..."]
        samples.append((fold(thread.group(1)), frames))
    return samples


def fold(name: str) -> str:
    """A thread's name with its numbers folded: one name per pool."""
    return re.sub(r"\d+", "#", name)


def by_thread(samples: Iterable[Sample]) -> Counter[str]:
    return Counter(thread for thread, _ in samples)


def hot_methods(samples: Iterable[Sample], prefix: str) -> tuple[int, Counter[str]]:
    """Samples of the threads named ``prefix…``, and per method the samples it is on."""
    total, methods = 0, Counter[str]()
    for thread, frames in samples:
        if thread.startswith(prefix):
            total += 1
            methods.update(set(frames))
    return total, methods


def read(recording: str, depth: int) -> str:
    jfr = shutil.which("jfr")
    if jfr is None:
        raise SystemExit("no `jfr` on PATH: it comes with a JDK (Debian: openjdk-17-jdk-headless)")
    out = subprocess.run([jfr, "print", "--stack-depth", str(depth), "--events",
                          "jdk.ExecutionSample", recording],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"jfr could not read {recording}: {out.stderr.strip()}")
    return out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording")
    ap.add_argument("--thread", default="", help="the threads whose methods to list (name prefix)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--depth", type=int, default=64, help="frames read per stack")
    ap.add_argument("--name", default=None, help="also write benchmarks/results/NAME.json")
    args = ap.parse_args()
    samples = parse(read(args.recording, args.depth))
    if not samples:
        raise SystemExit(f"{args.recording} holds no execution samples (settings=profile?)")
    threads = by_thread(samples)
    print(f"{len(samples):,} execution samples")
    for thread, n in threads.most_common(args.top):
        print(f"  {n:6,} {100 * n / len(samples):5.1f}%  {thread}")
    total, methods = hot_methods(samples, args.thread)
    if args.thread:
        print(f"threads {args.thread}…: {total:,} samples; methods on their stacks:")
        for method, n in methods.most_common(args.top):
            print(f"  {n:6,} {100 * n / max(total, 1):5.1f}%  {method}")
    if args.name:
        result = {"recording": args.recording, "samples": len(samples),
                  "threads": dict(threads.most_common()), "thread_prefix": args.thread,
                  "thread_samples": total, "methods": dict(methods.most_common(args.top))}
        print(f"written to {save(args.name, result)}", file=sys.stderr)


if __name__ == "__main__":
    main()
