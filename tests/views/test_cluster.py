"""The view job on a real Spark standalone cluster, an executor SIGKILLed midway.

A master and a worker start once for the module from pyspark's own launcher
(:class:`infra.services.sparkcluster.LocalSparkCluster`), on loopback. The job runs unchanged,
as ``fanout up`` runs it (``python -m infra.cli job``) with ``SPARK_MASTER`` naming
the cluster, so its executors are JVMs of their own that the worker forks. A
synthetic history is replayed in chunks; while the job works through the second, its
executor (found in ``/proc`` by the application id on its command line) is SIGKILLed
inside a task — its own log, in the worker's directory, shows a task started and not
finished. Spark must start a new executor and rerun the lost tasks from the
checkpoint's state, and the served timelines must equal the SQL recomputed from the
log (``infra.checks.verify``).

Run with ``-s`` to see the figures: cluster start time, the RSS of each JVM, how long
the new executor took.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.checks.verify import lagging, verify
from infra.services.process import JIT_OPTIONS
from infra.services.procs import cmdline, running
from infra.services.sparkcluster import LocalSparkCluster
from ingest.generator import generate
from ingest.settings import KafkaSettings
from tests.support.changelog import produce
from tests.support.process import Service, tagged, wait_for
from views.changelog import read_changelog
from views.stores.sqlite import SQLiteStore

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.e2e, pytest.mark.long]

CAP, CELEBRITY = 40, 30
MB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSparkCluster]:
    started = time.monotonic()
    with LocalSparkCluster(tmp_path_factory.mktemp("spark-cluster"), cores=2,
                           memory="2g") as cluster:
        print(f"\nstandalone cluster up in {time.monotonic() - started:.1f}s at "
              f"{cluster.master_url}")
        for name, pid in cluster.pids.items():  # the daemons' JIT stops at C1, as the job's
            assert JIT_OPTIONS in cmdline(pid), (name, cmdline(pid))
        yield cluster
        pids = cluster.pids
    for name, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"{name} {pid} outlived stop()"


@pytest.fixture
def job_service() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for service in started:
        service.kill()
        assert not tagged(service.tag), "the job left processes behind"


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _job(kafka: KafkaSettings, tmp_path: Path, master: str) -> Service:
    env = {"KAFKA_BOOTSTRAP": kafka.bootstrap, "FANOUT_TOPIC_PREFIX": kafka.topic_prefix,
           "FANOUT_PARTITIONS": str(kafka.partitions),
           "FANOUT_STORE": f"sqlite:///{tmp_path / 'views.sqlite'}",
           # On one machine a local path is a directory driver and executors share.
           "FANOUT_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
           "FANOUT_TIMELINE_CAP": str(CAP), "FANOUT_CELEBRITY_THRESHOLD": str(CELEBRITY),
           "FANOUT_MAX_RECORDS_PER_BATCH": "1000", "FANOUT_TRIGGER_SECONDS": "0",
           "FANOUT_SHUFFLE_PARTITIONS": "2",
           "SPARK_MASTER": master, "FANOUT_SPARK_MASTER": master}
    return Service("job", [], env, tmp_path / "job-run")


def _applied(store: SQLiteStore) -> int:
    """Records the store has applied so far, over every topic partition."""
    return sum(offset + 1 for offset in store.applied_offsets().values())


def _app_id(cluster: LocalSparkCluster) -> str | None:
    apps = cluster.status().get("activeapps") or []
    return str(apps[0]["id"]) if apps else None


def _kill_executor_in_a_task(cluster: LocalSparkCluster, app_id: str,
                              job: Service) -> tuple[list[int], float]:
    """SIGKILL the executor while it runs a task, as its own log shows (again if the
    task finished meanwhile, at most 3 times); the pids killed and how long the last
    one took to be replaced."""
    kills: list[int] = []
    respawn = 0.0
    while True:
        assert len(kills) < 3, f"3 kills of {kills} hit no running task"
        executor, log_path = _executor_in_a_task(cluster, app_id, job)
        os.kill(executor, signal.SIGKILL)
        killed = time.monotonic()
        kills.append(executor)
        wait_for(lambda dead=executor: cluster.executor_pids(app_id) not in ([], [dead]), 120,
                 f"the worker to replace executor {executor} of {app_id}")
        respawn = time.monotonic() - killed
        wait_for(lambda: job.log_text().count("Lost executor") >= len(kills), 60,
                 f"the driver to log the loss of executor {executor}")
        if _unfinished_tasks(log_path):
            return kills, respawn


def _executor_in_a_task(cluster: LocalSparkCluster, app_id: str,
                        job: Service) -> tuple[int, Path]:
    """The executor of ``app_id`` and its log, once the log shows a task under way."""
    def in_a_task() -> tuple[int, Path] | None:
        assert job.alive(), f"the job died:\n{job.log_text()[-4000:]}"
        for pid in cluster.executor_pids(app_id):
            log_path = cluster.executor_log(pid)
            if _unfinished_tasks(log_path):
                return pid, log_path
        return None

    found = wait_for(in_a_task, 120, f"an executor of {app_id} running a task", every=0.05)
    assert isinstance(found, tuple)
    return found


def _unfinished_tasks(log_path: Path) -> set[str]:
    """TIDs the executor's log says started and did not finish."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    running = set(re.findall(r"Running task .* \(TID (\d+)\)", text))
    return running - set(re.findall(r"Finished task .* \(TID (\d+)\)", text))


def _rss_line(cluster: LocalSparkCluster) -> str:
    return ", ".join(f"{name} {value / MB:.0f} MB" for name, value in cluster.rss().items())


@pytest.mark.timeout(900)
def test_job_on_a_cluster_survives_an_executor_kill(cluster, kafka_settings, tmp_path,
                                                     job_service):
    started = time.monotonic()
    events = list(generate(300, 3000, 1500, seed=23).events())
    size = -(-len(events) // 4)
    chunks = [events[i:i + size] for i in range(0, len(events), size)]
    job = _job(kafka_settings, tmp_path, cluster.master_url)
    job_service.append(job)
    produce(kafka_settings, chunks[0])
    job.start()
    with SQLiteStore(tmp_path / "views.sqlite", cap=CAP) as store:
        def applied_past(count: int) -> bool:
            assert job.alive(), f"the job died:\n{job.log_text()[-4000:]}"
            return _applied(store) > count

        wait_for(lambda: applied_past(0), 300, "the job's first batch on the cluster", every=0.5)
        app_id = wait_for(lambda: _app_id(cluster), 30, "the job's application on the master")
        assert isinstance(app_id, str)
        wait_for(lambda: cluster.executor_pids(app_id), 60, f"an executor of {app_id}")
        print(f"\n{app_id} running; RSS: {_rss_line(cluster)}")

        # Midway: the executor dies inside a task of a batch of the second chunk.
        before = _applied(store)
        produce(kafka_settings, chunks[1])
        wait_for(lambda: applied_past(before), 120, "a batch of the second chunk", every=0.1)
        kills, respawn = _kill_executor_in_a_task(cluster, app_id, job)
        for chunk in chunks[2:]:
            produce(kafka_settings, chunk)
        ends = read_changelog(kafka_settings).ends

        def caught_up() -> bool:
            assert job.alive(), f"the job died:\n{job.log_text()[-4000:]}"
            return not lagging(store, ends)

        wait_for(caught_up, 420, "the job to catch up with the log after the kill", every=0.5)
        assert _app_id(cluster) == app_id, "the driver must survive an executor's death"
        rss = _rss_line(cluster)
        result = verify(kafka_settings, store, CAP)
        celebrities = len(store.celebrities())
    job.stop()
    print(f"executors {kills} SIGKILLed in a running task; replaced within {respawn:.1f}s; "
          f"{len(events)} events in {len(chunks)} chunks; {celebrities} celebrities; "
          f"RSS before stop: {rss}; test {time.monotonic() - started:.0f}s; {result.render()}")
    assert result.ok, result.render()
    assert result.divergent == 0 and result.users_checked > 200
    assert celebrities > 0, "the history should cross the celebrity threshold"


def test_each_daemon_is_a_service_ready_with_its_marker_and_log(
        cluster: LocalSparkCluster) -> None:
    for name in ("master", "worker"):
        daemon = cluster.daemon(name)
        assert daemon.ready(), f"the {name} is not ready"
        assert running(daemon.pid, daemon.marker), f"the {name}'s marker is not in its command line"
        assert daemon.log_path.stat().st_size > 0
