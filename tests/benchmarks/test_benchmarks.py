"""The benchmark harness: results are stamped and compared figure by figure, the runner
knows every scenario, and each micro-benchmark computes what it should (run once)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import harness  # noqa: E402


def test_figures_are_every_number_but_the_stamp_and_the_arguments():
    result = {"args": {"rate": 500}, "stamp": {"cores": 2},
              "phases": [{"seconds": 1.5, "ok": True, "name": "graph"}, {"seconds": 2}],
              "p99": float("nan"), "rows": 10}
    assert dict(harness.figures(result)) == {"phases.0.seconds": 1.5, "phases.1.seconds": 2.0,
                                             "rows": 10.0}


def test_compare_sets_each_common_figure_beside_its_old_value():
    old = {"a": {"p50": 2.0, "p99": 4.0}, "gone": 1, "zero": 0}
    new = {"a": {"p50": 1.0, "p99": 4.0}, "new": 3, "zero": 5}
    assert harness.compare(old, new) == [("a.p50", 2.0, 1.0, 0.5), ("a.p99", 4.0, 4.0, 1.0),
                                         ("zero", 0.0, 5.0, None)]


def test_save_stamps_the_commit_machine_and_date(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    path = harness.save("x", {"rows": 1})
    saved = json.loads(path.read_text())
    assert saved["rows"] == 1
    stamp = saved["stamp"]
    assert len(stamp["commit"]) >= 7 and stamp["cores"] >= 1 and len(stamp["load_average"]) == 3
    assert stamp["date"].endswith("Z") and stamp["machine"]
    assert harness.describe(saved).startswith(stamp["commit"])


def test_the_runner_lists_every_system_benchmark():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), "list"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    listed = {line.split()[0] for line in out.splitlines() if line.strip()}
    scripts = {p.stem.removeprefix("bench_") for p in BENCHMARKS.glob("bench_*.py")}
    assert scripts and listed == scripts


def test_the_runner_refuses_an_unknown_scenario():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), "run", "nosuch"],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.returncode == 2 and "no scenario 'nosuch'" in out.stderr


@pytest.mark.timeout(300)
def test_each_micro_benchmark_checks_what_it_computes():
    out = subprocess.run([sys.executable, "-m", "pytest", str(BENCHMARKS / "micro"), "-q",
                          "-p", "no:cacheprovider", "--benchmark-disable"], cwd=ROOT,
                         capture_output=True, text=True, check=False, timeout=290)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "6 passed" in out.stdout


def test_the_shared_arguments_take_each_scripts_defaults_and_add_only_what_is_asked():
    ap = harness.argument_parser("x", name="replay", tweets=100_000, edges=None, rounds=3)
    args = ap.parse_args([])
    assert vars(args) == {"name": "replay", "tweets": 100_000, "edges": None, "rounds": 3}
    assert ap.parse_args(["--edges", "50", "--name", "r2"]).edges == 50
    with pytest.raises(SystemExit):
        ap.parse_args(["--users", "5"])  # not asked for: the script may give --users its own meaning
