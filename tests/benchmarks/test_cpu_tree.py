"""``benchmarks/tools/cpu_tree.py``: the busy window is the job's micro-batches, not a stray burst;
threads are counted by id, so short-lived ones are not lost."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "tools"))

from cpu_tree import WORKERS, busy_stretches, busy_window, thread_cpu  # noqa: E402


def _samples(per_second: list[float]) -> list[tuple[float, Counter[str], dict]]:
    """Cumulative samples from the workers' CPU-seconds in each second."""
    total, out = 0.0, [(0.0, Counter({WORKERS: 0.0}), {})]
    for t, used in enumerate(per_second, start=1):
        total += used
        out.append((float(t), Counter({WORKERS: total}), {}))
    return out


def _threads(*per_sample: dict) -> list[tuple[float, Counter[str], dict]]:
    return [(float(t), Counter(), threads) for t, threads in enumerate(per_sample)]


def test_threads_that_start_and_end_inside_the_window_count():
    # The task thread lives throughout; two state-server threads (one per task) each
    # live for two samples; the name is the same, the thread ids differ.
    samples = _threads({1: ("task", 5.0)},
                       {1: ("task", 6.0), 7: ("state", 0.5)},
                       {1: ("task", 7.0), 7: ("state", 1.5)},
                       {1: ("task", 8.0), 9: ("state", 0.8)},
                       {1: ("task", 9.0), 9: ("state", 1.0)},
                       {1: ("task", 9.5)})
    assert thread_cpu(samples, 0, 5) == pytest.approx({"task": 4.5, "state": 2.5})
    # Only what fell between the two samples, whoever was alive at either end.
    assert thread_cpu(samples, 1, 3) == pytest.approx({"task": 2.0, "state": 1.8})


def test_a_renamed_thread_is_counted_once():
    # Spark renames an executor thread for each task: idle, then launch, then idle.
    samples = _threads({4: ("Executor task idle", 10.0)},
                       {4: ("Executor task launch", 11.0)},
                       {4: ("Executor task idle", 11.2)})
    assert thread_cpu(samples, 0, 2) == pytest.approx({"Executor task launch": 1.0,
                                                       "Executor task idle": 0.2})


def test_a_reused_thread_id_is_a_new_thread():
    samples = _threads({3: ("pool", 4.0)}, {3: ("pool", 0.3)})
    assert thread_cpu(samples, 0, 1) == pytest.approx({"pool": 0.3})


def test_the_window_is_the_longest_busy_stretch():
    # A data-source worker at second 2, then the job from second 8 to 15 with a
    # 2-second lull (another stage), then idle ticks.
    used = [0, 0.7, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1, 0.1, 0.05, 0]
    samples = _samples(used)
    first, last = busy_window(samples)
    assert (samples[first][0], samples[last][0]) == (7.0, 15.0)


def test_a_gap_longer_than_allowed_splits_the_stretch():
    used = [1, 1, 1, 0, 0, 0, 0, 1, 1]
    first, last = busy_window(_samples(used), gap=3)
    assert (first, last) == (0, 3)


def test_without_busy_workers_the_window_is_the_whole_run():
    samples = _samples([0.1, 0, 0.1])
    assert busy_window(samples) == (0, len(samples) - 1)


def test_each_busy_stretch_is_reported_in_order():
    # Two phases (a replay, then a burst) 5 quiet seconds apart, and a stray tick.
    used = [0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 0.1]
    samples = _samples(used)
    assert busy_stretches(samples, gap=3) == [(1, 5), (10, 12)]
    # What each used is the difference of its two ends: 3 and 2 CPU-seconds.
    assert [samples[b][1][WORKERS] - samples[a][1][WORKERS]
            for a, b in busy_stretches(samples, gap=3)] == pytest.approx([3.0, 2.0])
    # A gap that spans the lull merges them (busy seconds 5 and 11 are 6 apart).
    assert busy_stretches(samples, gap=6) == [(1, 12)]
    assert busy_window(samples, gap=3) == (1, 5)
    assert busy_stretches(_samples([0.1, 0])) == []
