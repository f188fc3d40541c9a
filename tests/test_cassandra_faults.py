"""Crash consistency on Cassandra: the job SIGKILLed while its executors write a batch.

The job runs as ``fanout up`` runs it (``python -m infra.cli job``, see
``tests/fault_helpers.py``) against the session's broker and a keyspace of the test's
own, with the executor sink (:mod:`views.executor_sink`). A kill "inside a write" is
found from outside with no product hook: the driver makes a batch's timestamp
durable in ``writer_clock`` before any task writes and records the batch (with that
timestamp) only after every task finished, so while the clock is ahead of the last
recorded batch, tasks are writing. The job is killed there and at random points,
restarted from its checkpoint each time; at the end the served timelines must equal
the SQL recomputed from the log. Run with ``-s`` to see the figures.
"""

from __future__ import annotations

import os
import random
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.verify import lagging, verify
from ingest.events import Event
from ingest.generator import generate
from ingest.producer import ChangelogProducer
from ingest.settings import KafkaSettings
from tests.cassandra_helpers import fresh_keyspace
from tests.fault_helpers import Service, tagged, wait_for
from views.changelog import read_changelog
from views.stores.cassandra import CassandraStore
from views.stores.cassandra_cql import batch_bucket

pytestmark = [pytest.mark.spark, pytest.mark.broker]

CAP, CELEBRITY = 40, 30
#: How each incarnation ends; one more runs to the end. A "write" kill that found no
#: batch being written is tried again in the next incarnation (at most twice more).
KILLS = ("write", "random", "write")


def _produce(kafka: KafkaSettings, events: list[Event]) -> None:
    with ChangelogProducer(kafka) as producer:
        for event in events:
            producer.send(event)
        assert producer.flush(60) == 0, "records still unacknowledged after 60 s"


@pytest.fixture
def job(kafka_settings: KafkaSettings, tmp_path: Path, cassandra_hosts: str
        ) -> Iterator[tuple[Service, CassandraStore]]:
    """The job as a service on a fresh keyspace, and a store to watch it with."""
    with fresh_keyspace(cassandra_hosts) as url:
        env = {"KAFKA_BOOTSTRAP": kafka_settings.bootstrap, "FANOUT_STORE": url,
               "FANOUT_TOPIC_PREFIX": kafka_settings.topic_prefix,
               "FANOUT_PARTITIONS": str(kafka_settings.partitions),
               "FANOUT_TIMELINE_CAP": str(CAP), "FANOUT_CELEBRITY_THRESHOLD": str(CELEBRITY),
               "FANOUT_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
               "FANOUT_MAX_RECORDS_PER_BATCH": "300", "FANOUT_TRIGGER_SECONDS": "0",
               "FANOUT_SHUFFLE_PARTITIONS": "2"}
        service = Service("job", [], env, tmp_path / "job-run")
        try:
            store = CassandraStore.from_url(url, cap=CAP)
            store.open()
            try:
                yield service, store
            finally:
                store.close()
        finally:
            service.kill()
            assert not tagged(service.tag), "the job left processes behind"


def _writing(store: CassandraStore) -> bool:
    """Whether a batch's timestamp is taken but the batch not recorded: tasks write."""
    clock = store._rows("clock_get")
    if not clock or clock[0][0] is None:
        return False
    last = clock[0][1]
    if last is None:
        return True  # the first batch of the keyspace
    recorded = store._rows("batch_get", (batch_bucket(last), last))
    return bool(recorded) and clock[0][0] > recorded[0][0]


class Killer:
    """Kills one incarnation of the job where its mode says."""

    def __init__(self, job: Service, store: CassandraStore, rng: random.Random) -> None:
        self.job, self.store, self.rng = job, store, rng
        self.kills: list[str] = []
        self.inside_write = 0

    def kill(self, mode: str, started_ms: int) -> bool:
        """Kill the running incarnation; False if a write kill found no write going on."""
        if mode == "random":  # anywhere: JVM start, recovery, planning, a write
            delay = self.rng.uniform(5.0, 40.0)
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline:
                self._alive()
                time.sleep(0.1)
            return self._kill(f"random at {delay:.1f}s")
        wait_for(lambda: self._alive() and any(b.finished_at >= started_ms
                                               for b in self.store.batches(5)),
                 300, "a first batch of this incarnation", every=0.5)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and self._alive():
            if _writing(self.store):
                self.inside_write += 1
                return self._kill("while executors wrote a batch")
        self._kill("after 90s of batches: no write in progress seen")
        return False

    def _alive(self) -> bool:
        assert self.job.alive(), f"the job died on its own:\n{self.job.log_text()[-4000:]}"
        return True

    def _kill(self, what: str) -> bool:
        self.job.kill()
        self.kills.append(what)
        return True


@pytest.mark.timeout(1200)
def test_job_killed_while_executors_write_cassandra_converges(kafka_settings, job):
    service, store = job
    events = list(generate(500, 3000, 2000, seed=17).events())
    seed = int(os.environ.get("FANOUT_FAULT_SEED") or time.time_ns() % 2**32)
    killer = Killer(service, store, random.Random(seed))
    size = -(-len(events) // 8)
    chunks = deque(events[i:i + size] for i in range(0, len(events), size))
    plan, retries = list(KILLS), 2
    for i, mode in enumerate(plan):
        for _ in range(min(len(chunks), 2 if mode == "write" else 1)):
            _produce(kafka_settings, chunks.popleft())
        service.start()
        if not killer.kill(mode, int(time.time() * 1000)) and retries:
            plan.insert(i + 1, mode)  # noqa: B909 - the plan grows on purpose
            retries -= 1
    while chunks:
        _produce(kafka_settings, chunks.popleft())
    service.env["FANOUT_MAX_RECORDS_PER_BATCH"] = "3000"
    service.start()
    log_ = read_changelog(kafka_settings)

    def caught_up() -> bool:
        assert service.alive(), f"the job died on its own:\n{service.log_text()[-4000:]}"
        return not lagging(store, log_.ends)

    wait_for(caught_up, 400, "the restarted job to catch up with the log", every=1.0)
    result = verify(kafka_settings, store, CAP)
    celebrities = len(store.celebrities())
    service.stop()
    executor_batches = service.log_text().count("written from the executors")
    print(f"\ncassandra job: {len(killer.kills)} SIGKILLs ({killer.inside_write} while "
          f"executors wrote): {killer.kills}; {len(events)} events in 8 chunks; "
          f"{service.starts} starts; {executor_batches} batches logged by the last run; "
          f"{celebrities} celebrities; FANOUT_FAULT_SEED={seed}; {result.render()}")
    assert result.ok, f"{result.render()} (FANOUT_FAULT_SEED={seed} replays the kill times)"
    assert result.divergent == 0 and not result.lagging_partitions
    assert killer.inside_write >= 1, killer.kills
    assert celebrities > 0, "the history should cross the celebrity threshold"
