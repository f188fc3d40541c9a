"""The Spark settings fanout starts its session with (infra.services.spark.session_conf)."""

from __future__ import annotations

import tempfile
import time

import psutil
import pytest

from infra.services.spark import (
    CHECKPOINT_FILE_MANAGER,
    DRIVER_MEMORY,
    FALLING_BEHIND_LOGGER,
    JIT_OPTIONS,
    MALLOC_ARENAS,
    MALLOC_ARENAS_ENV,
    MIN_BATCHES_TO_RETAIN,
    executor_conf,
    scratch_conf,
    session_conf,
)
from infra.settings import SPARK_DRIVER_MEMORY_ENV, SPARK_JAVA_OPTIONS_ENV


def test_the_driver_heap_is_1g_unless_fanout_spark_driver_memory_says(
        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(SPARK_DRIVER_MEMORY_ENV, raising=False)
    assert session_conf(2)["spark.driver.memory"] == DRIVER_MEMORY == "1g"
    monkeypatch.setenv(SPARK_DRIVER_MEMORY_ENV, "2g")
    conf = session_conf(2)
    assert conf["spark.driver.memory"] == "2g"
    assert JIT_OPTIONS in conf["spark.driver.extraJavaOptions"]
    assert conf["spark.sql.shuffle.partitions"] == "2"


def test_fanout_spark_java_options_go_to_every_spark_jvm_after_fanouts_own(
        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(SPARK_JAVA_OPTIONS_ENV, raising=False)
    assert session_conf(2)["spark.driver.extraJavaOptions"].endswith(JIT_OPTIONS)
    recording = "-XX:StartFlightRecording=duration=30s,filename=job.jfr,settings=profile"
    monkeypatch.setenv(SPARK_JAVA_OPTIONS_ENV, f" {recording} ")
    driver = session_conf(2)["spark.driver.extraJavaOptions"]
    assert driver.endswith(f"{JIT_OPTIONS} {recording}"), driver
    executors = executor_conf("spark://127.0.0.1:7077")["spark.executor.extraJavaOptions"]
    assert executors == f"{JIT_OPTIONS} {recording}"


def test_a_scratch_holds_the_drivers_temporary_files_and_local_blocks(tmp_path):
    # Without one, both go to /tmp, where a SIGKILLed job leaves them.
    assert "java.io.tmpdir" not in session_conf(2)["spark.driver.extraJavaOptions"]
    driver = session_conf(2, tmpdir=tmp_path)["spark.driver.extraJavaOptions"]
    assert f"-Djava.io.tmpdir={tmp_path} " in driver and driver.endswith(JIT_OPTIONS), driver
    sockets = {"spark.python.unix.domain.socket.dir": tempfile.gettempdir()}  # short paths
    assert scratch_conf(tmp_path, "local[2]") == {"spark.local.dir": str(tmp_path)} | sockets
    # A cluster's executors keep their workers' directories: the path is this machine's.
    assert scratch_conf(tmp_path, "spark://10.0.0.1:7077") == sockets


def test_the_spark_jvm_runs_with_few_malloc_arenas(spark):
    jvms = [p for p in psutil.Process().children(recursive=True)
            if p.name() == "java" and "org.apache.spark.deploy.SparkSubmit" in p.cmdline()]
    assert jvms, "the session's JVM should be a child of this process"
    assert all(p.environ().get(MALLOC_ARENAS_ENV) == MALLOC_ARENAS == "2" for p in jvms)
    assert executor_conf("spark://127.0.0.1:7077")[
        f"spark.executorEnv.{MALLOC_ARENAS_ENV}"] == MALLOC_ARENAS


def test_checkpoints_are_written_through_the_filesystem_api(spark, tmp_path):
    # Hadoop's FileContext forks `readlink` per rename on a local path; the session's
    # checkpoint files (offset and commit logs, state store files) go through this one.
    jvm = spark._jvm
    manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager \
        .create(jvm.org.apache.hadoop.fs.Path(str(tmp_path)),
                spark._jsparkSession.sessionState().newHadoopConf())
    assert manager.getClass().getName() == CHECKPOINT_FILE_MANAGER
    assert manager.isLocal()


def _sockets(batches):
    """In a Python worker: its own TCP and Unix sockets, once per task."""
    import psutil
    import pyarrow as pa

    me = psutil.Process()
    tcp, unix = len(me.net_connections("tcp")), len(me.net_connections("unix"))
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"tcp": [tcp], "unix": [unix]})


def test_python_workers_talk_to_the_jvm_over_unix_sockets(spark):
    rows = spark.range(4).mapInArrow(_sockets, "tcp long, unix long").collect()
    assert rows
    assert all(r.tcp == 0 and r.unix > 0 for r in rows), rows


def test_the_spark_jvm_keeps_room_for_compiled_code(spark):
    # Without tiers the JVM reserves 48 MB for compiled code; a long job filled it and
    # the JVM turned its compiler off for good.
    runtime = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert "-XX:ReservedCodeCacheSize=240m" in arguments, arguments
    assert "-XX:TieredStopAtLevel=1" in arguments


def test_a_batch_longer_than_the_trigger_is_not_a_warning(spark):
    # At the job's 0.25 s trigger many a steady batch runs longer; Spark would warn at
    # every one. The logger must name Spark's class, or the setting quiets nothing.
    jvm = spark._jvm
    jvm.java.lang.Class.forName(FALLING_BEHIND_LOGGER)
    level = jvm.org.apache.logging.log4j.LogManager.getLogger(FALLING_BEHIND_LOGGER).getLevel()
    assert level.toString() == "ERROR"


def test_the_state_stores_files_are_written_uncompressed(spark):
    # RocksDB's flushes and compactions rewrite the state; compressing it was most of
    # their cost at 1M users (benchmarks/RESULTS.md, "Freshness"). The running
    # session's value, not the dict's: a later builder option would override it.
    assert spark.conf.get("spark.sql.streaming.stateStore.rocksdb.compression") == "none"


def test_a_checkpoint_keeps_the_logs_of_its_last_batches_only(spark, tmp_path):
    # Each catching-up batch's changelog holds most of the state: Spark's default of
    # 100 batches kept 65x the live state on disk at 1M users.
    assert spark.conf.get("spark.sql.streaming.minBatchesToRetain") == str(MIN_BATCHES_TO_RETAIN)
    checkpoint = tmp_path / "ck"
    # Purged as each batch ends: an asynchronous purge is skipped while the one before
    # still runs, so a busy box would end with a batch's logs more now and then.
    async_purge = "spark.sql.streaming.asyncLogPurge.enabled"
    was = spark.conf.get(async_purge)
    spark.conf.set(async_purge, "false")
    # rate-micro-batch makes a batch each trigger; "rate" only when a second has passed.
    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 50).load()
             .writeStream.format("noop").trigger(processingTime="50 milliseconds")
             .option("checkpointLocation", str(checkpoint)).start())
    try:
        deadline = time.monotonic() + 120
        while (query.lastProgress or {}).get("batchId", -1) < 3 * MIN_BATCHES_TO_RETAIN:
            assert time.monotonic() < deadline, query.lastProgress
            assert query.isActive, query.exception()
            time.sleep(0.1)
    finally:
        query.stop()
        spark.conf.set(async_purge, was)
    batches = sorted(int(f.name) for f in (checkpoint / "offsets").iterdir()
                     if f.name.isdigit())
    assert batches[-1] >= 3 * MIN_BATCHES_TO_RETAIN
    assert len(batches) <= MIN_BATCHES_TO_RETAIN + 1, batches
