"""``benchmarks/peers_flink.py`` without Flink: what ``bench_peers.py`` relies on.

The Flink engine itself needs ``.venv-flink`` (PyFlink, ~850 MB) and is not run here;
``bench_peers.py --engines flink,flink-batch`` checks it against ``peers.brute``.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT

BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import peers_flink  # noqa: E402


def test_the_peer_modules_import_nothing_but_the_standard_library():
    # bench_peers.py imports them into the product's virtualenv, which has no PyFlink.
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import peers_flink; "
             "print(' '.join(m for m in ('pyflink', 'confluent_kafka', 'pathway', 'duckdb', "
             "'infra', 'ingest', 'views') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe, str(BENCHMARKS)], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_view_is_the_capped_join_of_the_latest_edges_and_the_live_tweets():
    sql = " ".join(peers_flink.view_sql(800).split())
    assert "PARTITION BY follower_id, followee_id ORDER BY created_at DESC, `offset` DESC" in sql
    assert "NOT EXISTS" in sql and "d.op = 'delete'" in sql
    assert "PARTITION BY user_id ORDER BY created_at DESC, tweet_id DESC) AS rn" in sql
    assert sql.endswith("WHERE rn <= 800")
    assert "PARTITION BY user_id" not in " ".join(peers_flink.view_sql(0).split())


def test_each_engine_name_is_a_mode():
    assert set(peers_flink.ENGINES.values()) == set(peers_flink.MODES)


def test_a_peer_that_fails_is_reported_with_the_end_of_its_stderr(tmp_path):
    from bench_peers import _run_script

    script = tmp_path / "peer.py"
    script.write_text("import sys\n"
                      "print('reading 3 events', file=sys.stderr)\n"
                      "print('java.lang.OutOfMemoryError: Java heap space', file=sys.stderr)\n"
                      "sys.exit(3)\n")
    failed = _run_script(tmp_path / "peer", [sys.executable, str(script)])
    assert failed == {"error": "peer.py exited 3",
                      "stderr": ["reading 3 events",
                                 "java.lang.OutOfMemoryError: Java heap space"]}


def test_a_peer_that_finishes_gives_its_result_file(tmp_path):
    from bench_peers import _run_script

    script = tmp_path / "peer.py"
    script.write_text("import json, sys\n"
                      "json.dump({'events': 3, 'equal_to_brute': True}, open(sys.argv[-1], 'w'))\n")
    assert _run_script(tmp_path / "peer", [sys.executable, str(script)]) == {
        "events": 3, "equal_to_brute": True, "equal": True}


def test_repeated_runs_report_the_run_of_median_time_with_every_runs_seconds():
    from bench_peers import _median

    runs = [{"seconds": 30.0, "run": 1}, {"seconds": 10.0, "run": 2}, {"seconds": 20.0, "run": 3}]
    assert _median(runs) == {"seconds": 20.0, "run": 3, "repeats_s": [30.0, 10.0, 20.0]}
    assert _median(runs[:2])["run"] == 2  # of two, the faster
    assert _median(runs[:1]) is runs[0]
    failed = {"error": "peers_flink.py exited 1", "stderr": []}
    assert _median([runs[0], failed, runs[1]]) is failed
