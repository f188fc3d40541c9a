"""``benchmarks/tools/stages.py`` reads a real Spark event log: jobs, their stages by place, tasks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.long

sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "tools"))

from pipeline import EVENT_LOG_ENV, event_log_conf  # noqa: E402
from stages import events, parse, summary  # noqa: E402

#: Three jobs of two stages each: one map task, then two reduce tasks after the shuffle.
JOBS = textwrap.dedent("""
    import sys
    from operator import add
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[1]")
             .config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", sys.argv[1])
             .config("spark.eventLog.compress", "false").config("spark.ui.enabled", "false")
             .getOrCreate())
    for _ in range(3):
        spark.sparkContext.parallelize(range(1000), 1).map(lambda x: (x % 7, 1)) \
            .reduceByKey(add, 2).collect()
    spark.stop()
""")


@pytest.fixture(scope="module")
def event_log(tmp_path_factory):
    where = tmp_path_factory.mktemp("events")
    subprocess.run([sys.executable, "-c", JOBS, where.as_uri()], check=True,
                   capture_output=True, timeout=300)
    return where


def test_each_job_is_summed_up_by_its_stages_and_their_tasks(event_log):
    jobs, stages = parse(events(event_log))
    assert len(jobs) == 3 and all(job.ended is not None for job in jobs.values())
    result = summary(jobs, stages, last=2)
    assert result["jobs"] == 2
    first, second = result["stages"]
    assert (first["place"], second["place"]) == (1, 2)
    assert first["tasks"]["p50"] == 1 and second["tasks"]["p50"] == 2
    for stage in (first, second):
        assert 0 <= stage["duration"]["p50"] <= result["job_ms"]["p99"]
        assert stage["task run"]["p99"] <= stage["task wall"]["p99"]
        assert stage["task cpu"]["p50"] >= 0 and stage["task scheduler delay"]["p50"] >= 0


def test_a_benchmark_writes_the_event_log_only_where_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(EVENT_LOG_ENV, raising=False)
    assert event_log_conf() == {}
    monkeypatch.setenv(EVENT_LOG_ENV, str(tmp_path / "events"))
    conf = event_log_conf()
    assert conf["spark.eventLog.enabled"] == "true"
    assert conf["spark.eventLog.dir"] == (tmp_path / "events").as_uri()
    assert (tmp_path / "events").is_dir()
