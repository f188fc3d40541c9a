"""The SparkSession every fanout process and test uses, configured in one place.

This module owns how Spark is started (DESIGN §5, §10): local mode ``local[2]`` by
default (``master``, ``FANOUT_SPARK_MASTER`` or ``SPARK_MASTER`` picks another, e.g.
``spark://host:7077``),
bound to loopback, no UI, the RocksDB state store with changelog checkpointing,
Arrow on, nullable ints kept as pandas extension dtypes (ids above 2^53 must never
become float64), quiet logs, the ``fanout-kafka`` source registered, and Spark's own
Kafka source (``format("kafka")``) on ``spark.jars`` when its jars are in the cache.

Spark 4 needs Java 17+; :func:`build_session` checks that first so a missing or old
JVM fails with a message that says so, not with a py4j stack trace.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from pyspark.sql import SparkSession

from infra.errors import InfraError
from infra.services import class_archive
from infra.services.jars import SPARK_KAFKA, cached, classpath
from infra.services.process import JIT_OPTIONS as JIT_OPTIONS  # the JVMs' JIT (see there)
from infra.services.spark_home import lean_home
from infra.settings import SPARK_DRIVER_MEMORY_ENV, SPARK_JAVA_OPTIONS_ENV, SPARK_MASTER_ENV
from views.source import KafkaSource

log = logging.getLogger(__name__)

DEFAULT_MASTER: Final = "local[2]"
#: The driver's heap unless FANOUT_SPARK_DRIVER_MEMORY says (see session_conf): Spark's
#: own default. State lives in RocksDB, off the heap, so the heap is bounded by a
#: micro-batch, not by the history; 2g replayed ego-twitter ~6% faster but took the
#: stack past 3 GB (benchmarks/RESULTS.md).
DRIVER_MEMORY: Final = "1g"
#: glibc's malloc arenas in the Spark JVMs (and the Python workers they start). Native
#: allocations from many JVM threads (RocksDB, Arrow, Netty) otherwise spread over up
#: to 8 arenas a core that are rarely given back: with a 1 GB heap the local JVM peaked
#: at 2,065 MB in one ego-twitter replay and at 1,307 MB with 2 arenas
#: (benchmarks/RESULTS.md). Hadoop's launch scripts cap them at 4 likewise.
#: The executors' Python daemon (``spark.python.daemon.module``).
DAEMON_MODULE: Final = "views.daemon"
MALLOC_ARENAS_ENV: Final = "MALLOC_ARENA_MAX"
MALLOC_ARENAS: Final = "2"
LOOPBACK: Final = "127.0.0.1"
MIN_JAVA: Final = 17
#: Repository root, put on the Python workers' path in local mode so that they can
#: unpickle our classes (the data source) even when the project is not installed.
PROJECT_ROOT: Final = Path(__file__).resolve().parents[2]

#: Spark's trigger loop, which warns when a batch outlasts the trigger.
FALLING_BEHIND_LOGGER: Final = "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor"
#: Loggers that are noisy at WARN and say nothing we act on.
QUIET_LOGGERS: Final = (
    # Logs a warning per ValueState.get() on a missing value (DESIGN §10).
    "org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkStateServer",
    "org.apache.hadoop.util.NativeCodeLoader",
    # "spark.sql.adaptive.enabled is not supported in streaming", at every query start.
    "org.apache.spark.sql.execution.streaming.runtime.ResolveWriteToStream",
    # "Current batch is falling behind" after every batch longer than the trigger: every
    # batch of a job that catches up, and many a steady one at a 0.25 s trigger. The
    # job's own progress log and its lag metric say how far behind it is.
    FALLING_BEHIND_LOGGER,
)

_LOG4J2_HEAD: Final = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


class SparkSetupError(InfraError):
    """Spark cannot start here (no suitable Java, bad master)."""


def build_session(app_name: str, *, shuffle_partitions: int,
                  checkpoint_root: str | Path | None = None,
                  extra_conf: Mapping[str, str] | None = None,
                  master: str | None = None, log_level: str = "WARN",
                  scratch: Path | None = None) -> SparkSession:
    """Start (or join) the SparkSession and register the ``fanout-kafka`` source.

    ``shuffle_partitions`` is part of a streaming query's checkpoint: changing it
    makes old checkpoints unusable. ``checkpoint_root`` becomes the default
    checkpoint location of queries that do not name one. ``scratch`` holds the
    driver's temporary files instead of /tmp (:func:`scratch_conf`).
    """
    require_java()
    master = (master or os.environ.get(SPARK_MASTER_ENV) or os.environ.get("SPARK_MASTER")
              or DEFAULT_MASTER)
    _prepare_environment(master)
    builder = SparkSession.builder.appName(app_name).master(master)
    conf = (session_conf(shuffle_partitions, log_level, tmpdir=scratch) | executor_conf(master)
            | (scratch_conf(scratch, master) if scratch is not None else {}))
    if checkpoint_root is not None:
        conf["spark.sql.streaming.checkpointLocation"] = str(checkpoint_root)
    for key, value in (conf | dict(extra_conf or {})).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    _quiet(spark, log_level)
    _register_sources(spark)
    log.info("SparkSession %s on %s (Spark %s)", app_name, master, spark.version)
    return spark


#: How the query's checkpoint files (offset and commit logs, the state store's files)
#: are written. Spark's default for a local path goes through Hadoop's FileContext,
#: whose rename asks for the file's link status by forking `readlink` (no native
#: Hadoop library here): ~50 ms of each micro-batch's offset-log write and again of
#: its commit, on the critical path of every batch. The FileSystem-based
#: manager renames with rename(2), atomic on the local filesystems fanout
#: checkpoints to; it still forks `chmod` once per file Hadoop creates.
CHECKPOINT_FILE_MANAGER: Final = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager")


def java_options() -> str:
    """The options fanout gives a Spark JVM, then those of ``FANOUT_SPARK_JAVA_OPTIONS``.

    The variable is how to profile the JVM where the job runs, e.g.
    ``-XX:StartFlightRecording=delay=30s,duration=60s,filename=job.jfr,settings=profile``
    (read with ``benchmarks/tools/jfr_top.py``).
    """
    extra = os.environ.get(SPARK_JAVA_OPTIONS_ENV, "").strip()
    return f"{JIT_OPTIONS} {extra}" if extra else JIT_OPTIONS


#: Batches of state (and of offset and commit logs) the checkpoint keeps; Spark's
#: default is 100. A batch that catches up on a large state writes nearly all of it
#: into its changelog, so 100 of them held 12.5 GB on disk for 194 MB of live state
#: at 1M users (benchmarks/RESULTS.md). Recovery needs only the newest snapshot and
#: the changelogs after it; nothing in fanout reads older batches.
MIN_BATCHES_TO_RETAIN: Final = 10


def class_archive_path() -> Path | None:
    """Where the driver's class archive for this JVM, these jars and options is (or goes).

    None without a ``java`` to run. See :mod:`infra.services.class_archive`.
    """
    java = _java_binary()
    if java is None:
        return None
    return class_archive.archive_path(Path(java), _spark_home(), _kafka_jars(),
                                      _archived_options())


def _archived_options() -> str:
    """The driver options an archive depends on (the heap's size sets its pointer form)."""
    return f"{JIT_OPTIONS} -Xmx{os.environ.get(SPARK_DRIVER_MEMORY_ENV) or DRIVER_MEMORY}"


def _spark_home() -> Path:
    return Path(os.environ.get("SPARK_HOME") or lean_home())


def _kafka_jars() -> list[Path]:
    return classpath(SPARK_KAFKA) if cached(SPARK_KAFKA) is not None else []


def driver_java_options(log4j: Path, tmpdir: Path | None = None) -> str:
    """The driver JVM's options: log config, class archive, tmpdir, :func:`java_options`.

    The user's ``FANOUT_SPARK_JAVA_OPTIONS`` stay last, so they can override the rest
    (``-Xshare:off`` turns the archive off too).
    """
    java = _java_binary()
    archive = class_archive.driver_option(Path(java) if java else None, _spark_home(),
                                          _kafka_jars(), _archived_options())
    temporary = f"-Djava.io.tmpdir={tmpdir}" if tmpdir is not None else ""
    return " ".join(filter(None, (f"-Dlog4j2.configurationFile=file:{log4j}", archive,
                                  temporary, java_options())))


def scratch_conf(scratch: Path, master: str) -> dict[str, str]:
    """Spark's block and shuffle files under ``scratch`` too, in local mode.

    By default they and the native libraries the driver unpacks (lz4, RocksDB's JNI)
    go to /tmp, where a SIGKILLed job leaves them: one run of the whole-stack tests
    left 257 directories there (``blockmgr-*``, ``spark-*``, ``liblz4*``,
    ``librocksdbjni*``). The view job gives its checkpoint's ``tmp`` directory, which
    it empties when it starts (``fanout job``). A cluster's executors keep their
    workers' own directories: a path on this machine may not exist on theirs.

    The Python workers' Unix sockets stay in the system's temporary directory, where
    they were: their paths must fit in 107 bytes, and a run directory's may not.
    """
    local = {"spark.local.dir": str(scratch)} if master.startswith("local") else {}
    return local | {"spark.python.unix.domain.socket.dir": tempfile.gettempdir()}


def session_conf(shuffle_partitions: int, log_level: str = "WARN",
                 tmpdir: Path | None = None) -> dict[str, str]:
    """The Spark settings fanout relies on, as strings; ``tmpdir``: the driver's /tmp."""
    log4j = _log4j2_file(log_level)
    return {
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.driver.memory": os.environ.get(SPARK_DRIVER_MEMORY_ENV) or DRIVER_MEMORY,
        "spark.driver.extraJavaOptions": driver_java_options(log4j, tmpdir),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Spark keys its pools of Python workers by their environment, and only the
        # decode's mapInArrow sets SPARK_SIMPLIFIED_TRACEBACK: with it on, the decode
        # and the join each kept a daemon and two ~175 MB workers.
        "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
        "spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype": "true",
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # RocksDB's SST files uncompressed (Spark's default is LZ4). Every 10th commit
        # flushes the memtable and every 4th flush compacts, rewriting the state: on 2
        # cores that work lands on the batches, and at 1M users the compression was
        # most of it (post → visible p99 0.92–0.93 s against 0.64 s, live SST 150
        # against 236 MB; benchmarks/RESULTS.md, "Freshness"). Files of either kind
        # are read alike, so a running view may change it.
        "spark.sql.streaming.stateStore.rocksdb.compression": "none",
        "spark.sql.streaming.minBatchesToRetain": str(MIN_BATCHES_TO_RETAIN),
        "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
        # Python workers, and transformWithState's calls to the state server, over Unix
        # sockets instead of loopback TCP. Two state calls per key bucket were most of
        # a small micro-batch's join: at 500 tweets/s, batch p50 0.34 → 0.28 s.
        "spark.python.unix.domain.socket.enabled": "true",
        # The executors' Python daemon imports what the workers need before it forks
        # them (views.daemon): a cold job's first micro-batch waited on each worker's
        # imports.
        "spark.python.daemon.module": DAEMON_MODULE,
    } | kafka_jars_conf()


def kafka_jars_conf() -> dict[str, str]:
    """``spark.jars`` = Spark's Kafka connector, when the install step cached it.

    Only when cached: a session that reads with the ``fanout-kafka`` source, or none,
    must not need Maven. A query on ``format("kafka")`` without the jars fails at
    start with a message saying to run ``fanout jars spark-kafka`` (views.connector).
    ``spark.jars`` (not the driver class path) also ships them to a cluster's executors.
    """
    jars = _kafka_jars()
    return {"spark.jars": ",".join(str(p) for p in jars)} if jars else {}


def executor_conf(master: str) -> dict[str, str]:
    """What executors in JVMs of their own need to run our Python code; none locally.

    Their Python workers unpickle the source and the join processor, so they must
    import ``views`` and ``ingest``: the project root goes on their path (local mode
    puts it in the environment instead, see :func:`_prepare_environment`). It is the
    driver's path, which holds for a standalone cluster on this machine
    (:mod:`infra.services.sparkcluster`) and in the one image that runs driver and executors
    alike (``infra/docker/Dockerfile``).
    """
    if master.startswith("local"):
        return {}
    return {"spark.executorEnv.PYTHONPATH": str(PROJECT_ROOT),
            f"spark.executorEnv.{MALLOC_ARENAS_ENV}": MALLOC_ARENAS,
            "spark.executor.extraJavaOptions": java_options()}


def require_java(minimum: int = MIN_JAVA) -> int:
    """The major version of the ``java`` Spark will use; raise if it is too old."""
    java = _java_binary()
    if java is None:
        msg = (f"Spark needs Java {minimum}+ but no `java` was found (JAVA_HOME unset and "
               f"none on PATH); install e.g. openjdk-{minimum}-jre-headless")
        raise SparkSetupError(msg)
    result = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                            check=False)
    version = java_major_version(result.stderr + result.stdout)
    if version is None or version < minimum:
        shown = (result.stderr or result.stdout).strip().splitlines()[:1]
        msg = (f"Spark needs Java {minimum}+, but {java} is {shown or 'unknown'}; set "
               f"JAVA_HOME to a Java {minimum}+ install")
        raise SparkSetupError(msg)
    return version


def java_major_version(version_output: str) -> int | None:
    """Major version from ``java -version`` output (``1.8.0_x`` → 8, ``17.0.1`` → 17)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def _java_binary() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def _prepare_environment(master: str) -> None:
    """Environment the JVM and its Python workers inherit; read once at JVM start."""
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    # pip's PySpark without its source zips, which every Python process Spark starts
    # would otherwise compile anew (infra.services.spark_home); a SPARK_HOME set is the user's.
    if not os.environ.get("SPARK_HOME"):
        os.environ["SPARK_HOME"] = str(lean_home())
    # PySpark takes the workers' interpreter from this variable alone (not from
    # spark.pyspark.python), on executors too; default to ours so they see the same
    # packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault(MALLOC_ARENAS_ENV, MALLOC_ARENAS)
    if master.startswith("local"):
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(PROJECT_ROOT) not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *paths])


def _log4j2_file(level: str) -> Path:
    """A log4j2 config at ``level`` with :data:`QUIET_LOGGERS` at ERROR, written once."""
    text = _LOG4J2_HEAD.format(level=level.lower()) + "".join(
        f"logger.q{i}.name = {name}\nlogger.q{i}.level = error\n"
        for i, name in enumerate(QUIET_LOGGERS))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"fanout-log4j2-{digest}.properties"
    if not path.exists():
        # Write then rename, so a concurrent process never reads half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    return path


def _quiet(spark: SparkSession, level: str) -> None:
    """Apply the log levels to a session that may predate our log4j2 file."""
    spark.sparkContext.setLogLevel(level)
    jvm = spark.sparkContext._jvm
    if jvm is None:
        return
    configurator = jvm.org.apache.logging.log4j.core.config.Configurator
    error = jvm.org.apache.logging.log4j.Level.ERROR
    for name in QUIET_LOGGERS:
        configurator.setLevel(name, error)


def _register_sources(spark: SparkSession) -> None:
    spark.dataSource.register(KafkaSource)
