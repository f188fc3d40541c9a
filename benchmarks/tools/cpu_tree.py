"""CPU-seconds of a benchmark's process tree, by kind of process and by JVM thread.

    .venv/bin/python benchmarks/tools/cpu_tree.py [--name cpu] -- .venv/bin/python benchmarks/bench_peers.py --engines pipeline

Runs the command and samples, once a second, the cumulative CPU time (user + system)
of every process under it, grouped as ``benchmarks.pipeline`` groups them for memory
(driver, spark jvm, broker, python workers, ...), and of each thread of the Spark JVM
(``/proc/PID/task``; thread names with their numbers folded, e.g. ``Executor task
launch worker-#``). It prints the CPU each kind used over the *busy window*: from one
sample before the Python workers first ran to the last sample in which they did,
i.e. the job's micro-batches, not the broker's start or the producer (the
workers' longest busy stretch, see :func:`busy_window`). On two cores
the window offers twice its length in CPU-seconds. Every busy stretch is printed and
saved too (``stretches``), so that a benchmark whose phases are apart in time
(``bench_replay.py``'s graph phase and its burst) gets each phase's CPU; ``--gap``
sets how many quiet seconds a stretch spans. A second in which the workers
used under 0.2 CPU-seconds does not count as busy (idle workers still tick). Results go to
``benchmarks/results/NAME.json``.

Each thread is followed by its id from sample to sample, so a thread that starts and
ends inside the window still counts (Spark's state server runs one per task); threads
or processes that end between two samples lose at most their last second. The JVM's
CPU that no sampled thread accounts for is printed as ``(between samples)``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil

# The benchmarks' own modules, beside this folder.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import save  # noqa: E402
from pipeline import tree_cpu  # noqa: E402

WORKERS = "python workers"
#: CPU-seconds in a one-second sample that count the workers as busy (idle ones tick).
BUSY = 0.2


Threads = dict[int, tuple[str, float]]  # thread id: (folded name, cumulative CPU-seconds)
Sample = tuple[float, defaultdict[str, float], Threads]


def _sample(root: psutil.Process) -> tuple[defaultdict[str, float], Threads]:
    """Cumulative CPU-seconds per kind of process, and per Spark JVM thread."""
    kinds: defaultdict[str, float] = defaultdict(float)
    threads: Threads = {}
    for proc, kind, cpu in tree_cpu(root):
        kinds[kind] += cpu
        if kind == "spark jvm":
            threads.update(_jvm_threads(proc.pid))
    return kinds, threads


def _jvm_threads(pid: int) -> Threads:
    out: Threads = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (re.sub(r"[-_ #]?\d+", "#", name), (int(stat[11]) + int(stat[12])) / tick)
    return out


def thread_cpu(samples: list[Sample], first: int, last: int) -> dict[str, float]:
    """CPU-seconds per folded thread name between samples ``first`` and ``last``.

    Summed second by second per thread id, each second going to the name the thread
    has at its end (Spark renames a pool's thread for each task it runs): a thread
    born after ``first`` counts from zero, one gone before ``last`` keeps what it used
    while it was seen. (Cumulative figures per name, taken at the two ends only, lose
    every thread that ended in between.)
    """
    out: dict[str, float] = defaultdict(float)
    for i in range(first + 1, last + 1):
        before = samples[i - 1][2]
        for tid, (name, cpu) in samples[i][2].items():
            was = before[tid][1] if tid in before else 0.0
            out[name] += cpu - was if cpu >= was else cpu  # a reused id is a new thread
    return out


def busy_window(samples: list[Sample], gap: int = 3) -> tuple[int, int]:
    """Indexes of the samples that bound the Python workers' longest busy stretch.

    A stretch goes on across up to ``gap`` quiet seconds (a micro-batch's other
    stages); a short burst apart from it (the session starting its data-source
    worker) is not the job.
    """
    groups = _busy_groups(samples, gap)
    if not groups:
        return 0, len(samples) - 1
    longest = max(groups, key=len)
    return max(0, longest[0] - 1), longest[-1]


def busy_stretches(samples: list[Sample], gap: int = 3) -> list[tuple[int, int]]:
    """Every busy stretch of the Python workers, in order, as (first, last) sample indexes.

    ``first`` is the sample before the stretch's first busy second, so that
    ``samples[last] - samples[first]`` is what the stretch used. A benchmark with
    phases apart in time (``bench_replay.py``'s graph and its burst) has one each.
    """
    return [(max(0, g[0] - 1), g[-1]) for g in _busy_groups(samples, gap)]


def _busy_groups(samples: list[Sample], gap: int) -> list[list[int]]:
    """The workers' busy seconds (sample indexes), grouped across up to ``gap`` quiet ones."""
    busy = [i for i in range(1, len(samples))
            if samples[i][1][WORKERS] - samples[i - 1][1][WORKERS] >= BUSY]
    if not busy:
        return []
    groups = [[busy[0]]]
    for i in busy[1:]:
        if i - groups[-1][-1] > gap:
            groups.append([])
        groups[-1].append(i)
    return groups


def _used(samples: list[Sample], first: int, last: int) -> dict[str, float]:
    (_, k0, _), (_, k1, _) = samples[first], samples[last]
    return {k: round(k1[k] - k0[k], 2) for k in k1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default="cpu")
    ap.add_argument("--gap", type=int, default=3,
                    help="quiet seconds a busy stretch spans (more: phases merge)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to run after --")
    child = subprocess.Popen(command)
    root = psutil.Process(child.pid)
    samples: list[Sample] = []
    while child.poll() is None:
        try:
            samples.append((time.perf_counter(), *_sample(root)))
        except psutil.NoSuchProcess:
            break
        time.sleep(1.0)
    if child.returncode != 0:
        raise SystemExit(f"the command failed with exit code {child.returncode}")
    if len(samples) < 2:
        raise SystemExit("the command ended before two samples were taken")
    first, last = busy_window(samples, args.gap)
    t0, t1 = samples[first][0], samples[last][0]
    seconds = t1 - t0
    kinds = _used(samples, first, last)
    by_name = thread_cpu(samples, first, last)
    threads = {k: round(v, 2) for k, v in by_name.items() if v >= 0.05}
    threads["(between samples)"] = round(kinds.get("spark jvm", 0.0) - sum(by_name.values()), 2)
    total = sum(kinds.values())
    print(f"busy window {seconds:.1f} s: {total:.1f} CPU-seconds used "
          f"({total / seconds:.2f} cores busy on average)")
    for kind, cpu in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<16} {cpu:7.2f} CPU-s")
    print("Spark JVM threads:")
    for name, used in sorted(threads.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {name:<32} {used:7.2f} CPU-s")
    spans = busy_stretches(samples, args.gap)
    spent = [_used(samples, a, b) for a, b in spans]
    if len(spans) > 1:
        print("busy stretches (the workers busy, quiet for at most --gap seconds):")
        for (a, b), kinds_used in zip(spans, spent, strict=True):
            line = ", ".join(f"{k} {v:.2f}"
                             for k, v in sorted(kinds_used.items(), key=lambda kv: -kv[1]))
            print(f"  {samples[a][0] - samples[0][0]:7.1f}–{samples[b][0] - samples[0][0]:7.1f} s: "
                  f"{line}")
    stretches = [{"window": [round(samples[a][0] - samples[0][0], 1),
                             round(samples[b][0] - samples[0][0], 1)],
                  "window_s": round(samples[b][0] - samples[a][0], 2), "cpu_s": cpu}
                 for (a, b), cpu in zip(spans, spent, strict=True)]
    per_second = [{"t": round(t - samples[0][0], 1), **{k: round(v, 2) for k, v in kc.items()}}
                  for t, kc, _ in samples]
    result = {"command": command, "window_s": round(seconds, 2), "cpu_s": kinds,
              "window": [round(t0 - samples[0][0], 1), round(t1 - samples[0][0], 1)],
              "stretches": stretches, "cumulative_cpu_s": per_second,
              "spark_jvm_threads_cpu_s": threads, "cores": psutil.cpu_count()}
    print(f"written to {save(args.name, result)}", file=sys.stderr)


if __name__ == "__main__":
    main()
