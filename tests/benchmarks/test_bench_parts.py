"""``benchmarks/bench_parts.py``'s join and sink still run (the sink's figures come from it)."""

from __future__ import annotations

import sys

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_parts import bench_join_and_sink, events  # noqa: E402


def test_the_join_and_the_sink_run_on_a_slice_of_ego_twitter(tmp_path):
    evts = events(3_000, 300, tmp_path)
    result = bench_join_and_sink(evts, 1_000, tmp_path)
    assert result["join"]["events"] == len(evts) > 3_000
    assert result["sink"]["timeline_rows"] > 0
    assert result["sink"]["deltas"] > 0
