"""``benchmarks/cpu_tree.py``'s busy window: the job's micro-batches, not a stray burst."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from cpu_tree import WORKERS, busy_window  # noqa: E402


def _samples(per_second: list[float]) -> list[tuple[float, Counter[str], Counter[str]]]:
    """Cumulative samples from the workers' CPU-seconds in each second."""
    total, out = 0.0, [(0.0, Counter({WORKERS: 0.0}), Counter())]
    for t, used in enumerate(per_second, start=1):
        total += used
        out.append((float(t), Counter({WORKERS: total}), Counter()))
    return out


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
