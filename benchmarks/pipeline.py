"""A whole pipeline in one process tree for benchmarks: broker, topics, Spark job, store.

The store is SQLite through the driver's spooling sink, or (``store="cassandra"``) a
local Cassandra node of the pipeline's own (the stack's heap and commit log) written
through the job's executor sink, as ``fanout up`` runs each.

Used by the benchmark scripts beside it; nothing in the product imports it. The job
runs continuously (processing-time trigger), exactly as under ``fanout up``; the
benchmark produces into the topics from a separate process (``fanout replay``) or
from here, and waits on the store's applied offsets.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

import psutil
from harness import ROOT

sys.path.insert(0, str(ROOT))

from infra.services.broker import KafkaBroker  # noqa: E402
from infra.services.spark import build_session  # noqa: E402
from ingest.settings import KafkaSettings  # noqa: E402
from ingest.topics import create_topics  # noqa: E402
from views.job import job_sink, start_query  # noqa: E402
from views.kafka_offsets import EndOffsets  # noqa: E402
from views.settings import ViewSettings  # noqa: E402
from views.stores import store_from_url  # noqa: E402
from views.stores.contract import Store  # noqa: E402
from views.stores.sqlite import SQLiteStore  # noqa: E402

#: The stores a pipeline writes to.
STORES = ("sqlite", "cassandra")
#: The local Cassandra node's heap, the stack's (``infra.services.cassandra``'s default).
CASSANDRA_HEAP_MB = 768


@dataclass
class Pipeline:
    """Handles of a running pipeline."""

    kafka: KafkaSettings
    view: ViewSettings
    store: Store
    sink: Any
    workdir: Path
    query: Any = None
    launch: Callable[[], Any] | None = None
    peak_rss: int = 0
    #: RSS by kind of process at the peak (driver, jvm, python workers, broker, ...).
    peak_parts: dict[str, int] = field(default_factory=dict)
    batch_log: list[dict[str, float]] = field(default_factory=list)

    def ends(self) -> dict[tuple[str, int], int]:
        offsets = EndOffsets(self.kafka.bootstrap)
        tps = offsets.topic_partitions(self.kafka.physical_topics())
        return {(self.kafka.logical(t), p): e for (t, p), e in offsets.ends(tps).items()}

    def applied(self, ends: dict[tuple[str, int], int]) -> int:
        done = self.store.applied_offsets()
        return sum(min(done.get(tp, -1) + 1, end) for tp, end in ends.items())

    def wait_caught_up(self, timeout: float, progress: bool = True) -> float:
        """Seconds until every produced record is applied (bounded)."""
        start = time.perf_counter()
        deadline = start + timeout
        ends = self.ends()
        total = sum(ends.values())
        last = -1
        while (done := self.applied(ends)) < total:
            if self.query.exception() is not None:
                raise RuntimeError(f"query failed: {self.query.exception()}")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"applied {done} of {total} records in {timeout}s")
            if progress and done != last:
                print(f"  applied {done:,}/{total:,} records "
                      f"({time.perf_counter() - start:.0f}s)", file=sys.stderr, flush=True)
                last = done
            time.sleep(0.2)
        caught = time.perf_counter() - start
        # The store commits before the sink's callback logs the batch: wait for the log,
        # or the figures would miss the batch that finished the catch-up.
        newest = self.store.batches(1)
        while newest and not any(b["batch_id"] == newest[0].batch_id for b in self.batch_log):
            if time.perf_counter() > deadline:
                raise TimeoutError(f"batch {newest[0].batch_id} was never logged by the sink")
            time.sleep(0.05)
        return caught

    def batches_since(self, first: int) -> list[dict[str, float]]:
        return [b for b in self.batch_log if b["batch_id"] >= first]


def _rss_tree() -> dict[str, int]:
    """RSS of this process and its descendants, by kind (see :func:`process_kind`)."""
    me = psutil.Process()
    parts = {"driver": me.memory_info().rss}
    for child in me.children(recursive=True):
        try:
            kind = process_kind(child.cmdline())
            parts[kind] = parts.get(kind, 0) + child.memory_info().rss
        except psutil.Error:
            pass
    return parts


def tree_cpu(root: psutil.Process) -> Iterator[tuple[psutil.Process, str, float]]:
    """Each live process of ``root``'s tree, its kind (``driver`` for ``root``, else
    :func:`process_kind`) and its CPU-seconds (user + system) so far."""
    for proc in [root, *root.children(recursive=True)]:
        try:
            cpu = proc.cpu_times()
            kind = "driver" if proc.pid == root.pid else process_kind(proc.cmdline())
        except psutil.Error:
            continue
        yield proc, kind, cpu.user + cpu.system


def cpu_by_kind() -> defaultdict[str, float]:
    """CPU-seconds of this process and its live descendants, by kind (:func:`tree_cpu`)."""
    out: defaultdict[str, float] = defaultdict(float)
    for _, kind, cpu in tree_cpu(psutil.Process()):
        out[kind] += cpu
    return out


def process_kind(cmdline: list[str]) -> str:
    line = " ".join(cmdline)
    if cmdline and cmdline[0].endswith("java"):
        # Spark's class path names its Kafka connector too: tell them by their main class.
        if "org.apache.cassandra" in line:
            return "cassandra"
        return "broker" if "kafka.Kafka" in line else "spark jvm"
    if "pyspark.daemon" in line or "pyspark.worker" in line:
        return "python workers"
    if "locust" in line:
        return "locust"
    if "-m serving" in line or " serve" in line:
        return "api"
    if "replay" in line:
        return "replay"
    return "other"


#: Set to keep a benchmark's work directory (broker log, store, checkpoints) after it.
KEEP_ENV = "FANOUT_BENCH_KEEP"


#: Set to a directory to have Spark write its event log there (``tools/stages.py`` reads it).
EVENT_LOG_ENV = "FANOUT_BENCH_EVENT_LOG"


def event_log_conf() -> dict[str, str]:
    """Spark's event log into ``FANOUT_BENCH_EVENT_LOG``, uncompressed; none when unset."""
    where = os.environ.get(EVENT_LOG_ENV)
    if not where:
        return {}
    Path(where).mkdir(parents=True, exist_ok=True)
    return {"spark.eventLog.enabled": "true", "spark.eventLog.compress": "false",
            "spark.eventLog.dir": Path(where).resolve().as_uri()}


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A work directory under the system's temp dir, removed at the end.

    A replay leaves ~0.9 GB there (the broker's log, the store, the checkpoints), so
    left behind they filled this machine's disk. ``FANOUT_BENCH_KEEP=1`` keeps it
    (the path is printed) for a look at the store or the logs.
    """
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    finally:
        if os.environ.get(KEEP_ENV):
            print(f"kept the work directory {work} ({KEEP_ENV} is set)", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def cassandra_keyspace(hosts: str, options: str = "") -> str:
    """A new keyspace's store URL on ``hosts`` (with URL ``options``), its schema applied."""
    from views.stores.cassandra.schema import apply_at

    url = f"cassandra://{hosts}/bench_{uuid.uuid4().hex[:10]}" + (f"?{options}" if options else "")
    apply_at(url)
    return url


@contextmanager
def pipeline(*, partitions: int = 4, celebrity_threshold: int = 1000, cap: int = 800,
             max_records: int | None = 50_000, trigger_seconds: float = 0.0,
             shuffle_partitions: int = 2, key_buckets: int | None = None,
             conf: dict[str, str] | None = None, kafka_source: str | None = None,
             start: bool = True, store: str = "sqlite",
             store_options: str = "") -> Iterator[Pipeline]:
    """Start everything in a temp dir (:func:`scratch`); stop and clean up at the end.

    Without ``start`` the query is left to ``pipe.query = pipe.launch()`` (to time a backlog
    produced before the job runs). ``max_records`` None: the store's own batch cap.
    ``store_options``: the Cassandra store's URL options (``upkeep=1``, ...).
    """
    if store not in STORES:
        raise ValueError(f"store {store!r}: one of {STORES}")
    with ExitStack() as services:
        work = services.enter_context(scratch("fanout-bench-"))
        broker = services.enter_context(KafkaBroker(work / "kafka"))
        url = f"sqlite:///{work / 'v.sqlite'}"
        if store == "cassandra":
            from infra.services.cassandra import LocalCassandra

            node = services.enter_context(LocalCassandra(work / "cassandra",
                                                         heap_mb=CASSANDRA_HEAP_MB))
            url = cassandra_keyspace(node.hosts, store_options)
        yield from _pipeline(work, broker, url, partitions=partitions,
                             celebrity_threshold=celebrity_threshold, cap=cap,
                             max_records=max_records, trigger_seconds=trigger_seconds,
                             shuffle_partitions=shuffle_partitions, key_buckets=key_buckets,
                             conf=conf, kafka_source=kafka_source, start=start)


def _pipeline(work: Path, broker: KafkaBroker, url: str, *, partitions: int,
              celebrity_threshold: int, cap: int, max_records: int | None,
              trigger_seconds: float, shuffle_partitions: int, key_buckets: int | None,
              conf: dict[str, str] | None, kafka_source: str | None,
              start: bool) -> Iterator[Pipeline]:
    kafka = KafkaSettings(bootstrap=broker.bootstrap, partitions=partitions,
                          topic_prefix="b_")
    create_topics(kafka)
    optional: dict[str, Any] = {}
    if key_buckets:
        optional["key_buckets"] = key_buckets
    if kafka_source:
        optional["kafka_source"] = kafka_source
    view = ViewSettings(store_url=url,
                        checkpoint_dir=work / "ck", timeline_cap=cap,
                        celebrity_threshold=celebrity_threshold,
                        max_records_per_batch=max_records, trigger_seconds=trigger_seconds,
                        shuffle_partitions=shuffle_partitions, **optional)
    spark = build_session("fanout-bench", shuffle_partitions=shuffle_partitions,
                          extra_conf=(conf or {}) | event_log_conf())
    store = store_from_url(url, cap=cap).open()
    pipe = Pipeline(kafka, view, store, job_sink(view, store), work)
    stop = threading.Event()

    def record(stats: Any, total: float) -> None:
        pipe.batch_log.append({"batch_id": stats.batch_id, "seconds": total,
                               "store_seconds": stats.seconds, "deltas": stats.deltas,
                               "timeline_adds": stats.timeline_adds,
                               "finished": time.perf_counter()})

    pipe.sink.on_batch = record

    def sample_memory() -> None:
        while not stop.wait(0.5):
            parts = _rss_tree()
            if sum(parts.values()) > pipe.peak_rss:
                pipe.peak_rss, pipe.peak_parts = sum(parts.values()), parts

    sampler = threading.Thread(target=sample_memory, daemon=True)
    sampler.start()
    pipe.launch = lambda: start_query(spark, kafka, view, store, sink=pipe.sink)
    if start:
        pipe.query = pipe.launch()
    try:
        yield pipe
    finally:
        stop.set()
        if pipe.query is not None:
            pipe.query.stop()
        pipe.sink.close()
        store.close()
        spark.stop()


def replay_process(pipe: Pipeline, paths: list[str], extra: list[str]) -> dict[str, Any]:
    """Run ``fanout replay`` as its own process; return its timing."""
    env = {**os.environ, "KAFKA_BOOTSTRAP": pipe.kafka.bootstrap,
           "FANOUT_TOPIC_PREFIX": pipe.kafka.topic_prefix,
           "FANOUT_PARTITIONS": str(pipe.kafka.partitions), "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "infra.cli", "replay", *paths, "--no-progress",
                          *extra], env=env, capture_output=True, text=True, check=False,
                         cwd=ROOT, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"replay failed: {out.stdout}\n{out.stderr}")
    return {"seconds": time.perf_counter() - start, "output": out.stdout.strip()}


T = TypeVar("T")


def built_store(path: Path, build: Callable[[Path], T], cap: int = 800) -> tuple[SQLiteStore, T]:
    """``build(path)`` (the benchmark's store, timed on stderr), then that store opened."""
    started = time.perf_counter()
    built = build(path)
    print(f"built the store in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    return SQLiteStore(path, cap=cap).open(), built


def timed_ms(call: Callable[[Any], object], args: list[Any], rounds: int | None = None,
             warmup: int = 0) -> list[float]:
    """Milliseconds per ``call(arg)``, cycling through ``args`` ``rounds`` times.

    Default: each arg once; ``warmup`` untimed calls on the first args go before.
    """
    for arg in args[:warmup]:
        call(arg)
    samples = []
    for i in range(len(args) if rounds is None else rounds):
        start = time.perf_counter()
        call(args[i % len(args)])
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

