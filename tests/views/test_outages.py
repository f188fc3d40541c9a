"""Broker outages: the API and the view job neither hang nor spin, and say what happened.

Each test runs its own Kafka node, so that it can stop it, freeze it (SIGSTOP:
unreachable, data kept — what a broker restart looks like to its clients) or replace
it with a fresh, empty one on the same port (the topics deleted and recreated, or a
log directory lost). Checked:

- the API answers writes 503 with ``Retry-After`` while the broker is away, and its
  health says degraded; writes succeed again once a broker is back;
- the job's planning retries with backoff and clear log lines, then gives up
  (``BrokerUnreachable``) — bounded; a broker that comes back with its data is simply
  resumed from;
- a broker that comes back empty stops the job with ``OffsetsPastEnd`` saying what
  happened and how to recover; ``fanout rebuild`` sets the views aside and the views
  rebuilt from the replayed topics verify.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from infra import cli
from infra.checks.verify import lagging, verify
from infra.services.broker import KafkaBroker
from infra.stack.launch import up
from infra.stack.stack import Stack, StackError
from ingest.generator import generate
from ingest.settings import KafkaSettings
from ingest.topics import create_topics
from tests.support.api import closed_port, serve, settings
from tests.support.changelog import produce
from tests.support.process import wait_for
from views import job as job_module
from views.changelog import read_changelog
from views.errors import BrokerUnreachable
from views.kafka_offsets import KafkaReadError, retrying
from views.settings import ViewSettings
from views.source import KafkaStreamReader, SourceOptions
from views.stores.sqlite import SQLiteStore

pytestmark = pytest.mark.long

CAP = 40
#: How long the broker stays frozen: more than one attempt's timeout (10 s).
FREEZE_S = 12.0


class Brokers:
    """The test's own embedded broker on one port: stopped, frozen or replaced at will."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.current = KafkaBroker(logs / "kafka-0").start()
        self.bootstrap = self.current.bootstrap
        self.frozen = False

    def stop(self) -> None:
        self.thaw()
        self.current.stop()

    def restart_empty(self) -> None:
        """A fresh, empty broker on the same port (topics deleted and recreated)."""
        self.stop()
        port = int(self.bootstrap.rsplit(":", 1)[1])
        self.current = KafkaBroker(self.logs / "kafka-1", port=port).start()

    def freeze(self) -> None:
        """Unreachable, data kept: SIGSTOP (what a real Kafka restart looks like)."""
        os.kill(self.current.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            os.kill(self.current.pid, signal.SIGCONT)
            self.frozen = False


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Brokers]:
    running = Brokers(tmp_path)
    yield running
    running.stop()


def _kafka(brokers: Brokers) -> KafkaSettings:
    kafka = KafkaSettings(bootstrap=brokers.bootstrap, partitions=2, topic_prefix="o_")
    create_topics(kafka)
    return kafka


# -- planning retries, without Spark ------------------------------------------------------

def test_retrying_backs_off_logs_and_gives_up(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    def down() -> None:
        now[0] += 1.0  # each attempt takes a second to time out
        raise KafkaReadError("ListOffsets failed: connection refused")

    forgotten = []
    with caplog.at_level(logging.WARNING), pytest.raises(BrokerUnreachable) as failed:
        retrying(down, what="finding the end offsets", bootstrap="127.0.0.1:1", budget=40,
                 on_failure=lambda: forgotten.append(1), sleep=sleep, clock=lambda: now[0])
    assert pauses[:6] == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0]
    assert all(p <= 15.0 for p in pauses) and len(pauses) < 10, pauses
    assert len(forgotten) == len(pauses) + 1
    assert "unreachable for over 40s while finding the end offsets" in str(failed.value)
    assert "resumes from its checkpoint" in str(failed.value)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(pauses)
    assert "retrying in 0.5s" in warnings[0] and "connection refused" in warnings[0]


def test_retrying_returns_once_the_broker_answers() -> None:
    answers = iter([KafkaReadError("down"), KafkaReadError("down"), {"ok": 1}])

    def flaky() -> dict[str, int]:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert retrying(flaky, what="x", bootstrap="b", budget=60, sleep=lambda _: None) == {"ok": 1}


@pytest.mark.timeout(60)
def test_reader_gives_up_on_an_unreachable_broker() -> None:
    reader = KafkaStreamReader(SourceOptions(bootstrap=f"127.0.0.1:{closed_port()}",
                                             partitions=2, broker_retry=2.0))
    with pytest.raises(BrokerUnreachable, match="unreachable for over 2s"):
        reader.latestOffset({"tweets:0": 0}, ReadAllAvailable())


def test_job_exit_codes_name_the_cause(caplog: pytest.LogCaptureFixture) -> None:
    text = ("[STREAM_FAILED] Query terminated with exception: ... pyspark.errors.PythonException"
            ": views.errors.OffsetsPastEnd: the changelog topics on x end before ...\n  at ...")
    with caplog.at_level(logging.ERROR):
        assert job_module._failed(text) == job_module.EXIT_PAST_END
        assert job_module._failed("BrokerUnreachable: broker b unreachable") == \
            job_module.EXIT_BROKER
        assert job_module._failed("something else") == 1
    assert "view job stopped: the changelog topics on x end before ..." in caplog.text


# -- the API ------------------------------------------------------------------------------

@pytest.mark.broker
@pytest.mark.timeout(120)
def test_api_answers_503_while_the_broker_is_away_and_recovers(brokers, tmp_path) -> None:
    kafka = _kafka(brokers)
    store = SQLiteStore(tmp_path / "store.sqlite", cap=CAP).open()
    config = settings(store, auth=False, write_timeout_ms=1_000, retry_after_s=1,
                      broker_check_s=0.2)
    headers = {"X-User-Id": "42"}
    try:
        with serve(config, store, kafka) as client:
            client.timeout = httpx.Timeout(10)  # a hung write fails the test
            # A fresh broker may still be loading its idempotence coordinator for the
            # first write's 1 s timeout (it did once under load): wait for one to land.
            wait_for(lambda: client.post("/v1/tweets", json={"text": "before"},
                                         headers=headers).status_code == 202,
                     30, "a first write to be accepted", every=0.5)
            brokers.stop()
            for i in range(4):
                response = client.post("/v1/tweets", json={"text": f"lost {i}"}, headers=headers)
                assert response.status_code == 503, response.text
                assert response.headers["retry-after"] == "1"
                assert response.json()["error"] == "unavailable"
            follow = client.put("/v1/users/42/following/7", headers=headers)
            assert follow.status_code == 503 and "retry-after" in follow.headers
            wait_for(lambda: client.get("/healthz").status_code == 503, 30, "degraded health")
            assert client.get("/healthz").json()["broker"] == "unreachable"

            brokers.restart_empty()
            create_topics(kafka)  # `fanout up` creates them; the broker starts empty

            def accepted() -> bool:
                return client.post("/v1/tweets", json={"text": "after"},
                                   headers=headers).status_code == 202
            wait_for(accepted, 30, "a write to succeed after the broker came back", every=0.5)
            assert client.put("/v1/users/42/following/7", headers=headers).status_code == 202
            wait_for(lambda: client.get("/healthz").status_code == 200, 30, "health ok again")
            posted = read_changelog(kafka).events
            assert [e.text for e in posted if e.topic == "tweets"][-1] == "after"
    finally:
        store.close()


# -- the view job -------------------------------------------------------------------------

def _view(tmp_path: Path) -> ViewSettings:
    return ViewSettings(store_url=f"sqlite:///{tmp_path / 'run' / 'fanout.sqlite'}",
                        checkpoint_dir=tmp_path / "run" / "checkpoints", timeline_cap=CAP,
                        celebrity_threshold=30, max_records_per_batch=2000,
                        shuffle_partitions=2, trigger_seconds=0.2, broker_retry_s=60)


def _caught_up(query, store: SQLiteStore, kafka: KafkaSettings, timeout: float) -> None:
    ends = read_changelog(kafka).ends

    def done() -> bool:
        assert query.exception() is None, query.exception()
        return not lagging(store, ends)
    wait_for(done, timeout, "the view to catch up", every=0.25)


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.timeout(420)
def test_job_rides_out_an_outage_and_stops_clearly_on_an_empty_broker(
        spark, brokers, tmp_path, monkeypatch, capsys, caplog) -> None:
    kafka = _kafka(brokers)
    events = list(generate(200, 1500, 1000, seed=8).events())
    third = len(events) // 3
    produce(kafka, events[:third])
    view = _view(tmp_path)
    store = SQLiteStore(view.store_url.removeprefix("sqlite:///"), cap=CAP).open()
    query = job_module.start_query(spark, kafka, view, store)
    try:
        _caught_up(query, store, kafka, 240)
        # Unreachable with its data kept (a real Kafka restart, seen from the client).
        brokers.freeze()
        time.sleep(FREEZE_S)  # the outage: longer than one attempt's timeout, within budget
        assert query.isActive and query.exception() is None, query.exception()
        brokers.thaw()
        produce(kafka, events[third:2 * third])
        _caught_up(query, store, kafka, 240)
        assert verify(kafka, store, CAP).ok

        # Back empty (its log directory lost): the job must stop, and say so.
        brokers.restart_empty()
        create_topics(kafka)
        produce(kafka, events[:10])
        wait_for(lambda: not query.isActive, 120, "the job to stop on the emptied topics")
        error = str(query.exception())
    finally:
        query.stop()
        store.close()
    # The job explains the stop in its own words, whichever source found it.
    caplog.set_level(logging.ERROR, logger="views.job")
    code = job_module._failed(error)
    assert code == job_module.EXIT_PAST_END, error
    assert "fanout rebuild" in caplog.text, caplog.text

    monkeypatch.delenv("FANOUT_STORE", raising=False)
    monkeypatch.delenv("FANOUT_CHECKPOINT_DIR", raising=False)
    assert cli.main(["--run-dir", str(tmp_path / "run"), "rebuild"]) == 0
    moved = capsys.readouterr().out
    assert moved.count("moved ") >= 2, moved
    aside = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert any(n.startswith("checkpoints.aside-") for n in aside), aside
    assert any(n.startswith("fanout.aside-") and n.endswith(".sqlite") for n in aside), aside
    assert not (tmp_path / "run" / "checkpoints").exists()

    produce(kafka, events[10:])  # the user replays the history into the new broker
    with SQLiteStore(view.store_url.removeprefix("sqlite:///"), cap=CAP) as rebuilt:
        query = job_module.start_query(spark, kafka, view, rebuilt, available_now=True)
        assert query.awaitTermination(300), "the rebuild did not finish within 300 s"
        assert query.exception() is None, query.exception()
        result = verify(kafka, rebuilt, CAP)
    print(f"\njob outages: rode out a {FREEZE_S:.0f}s freeze; stopped on the emptied topics "
          f"(exit {code}); rebuilt after `fanout rebuild`: "
          f"{result.render()}")
    assert result.ok and result.events == len(events), result.render()


# -- fanout rebuild and fanout up -----------------------------------------------------------

def test_rebuild_refuses_while_the_job_runs_and_up_refuses_stale_views(tmp_path, monkeypatch):
    run = tmp_path / "run"
    (run / "checkpoints" / "state-v1" / "offsets").mkdir(parents=True)
    (run / "checkpoints" / "state-v1" / "offsets" / "0").write_text("{}")
    (run / "fanout.sqlite").write_bytes(b"")
    for name in ("KAFKA_BOOTSTRAP", "FANOUT_STORE", "FANOUT_CHECKPOINT_DIR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(StackError, match="rebuild"):
        up(run)  # an embedded broker starts empty: these views cannot match it
    # A stand-in for a running job: a process whose command line names infra.cli.
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "infra.cli"])
    stack = Stack(run_dir=str(run), bootstrap="127.0.0.1:1",
                  store_url=f"sqlite:///{run / 'fanout.sqlite'}", api_url="http://127.0.0.1:1",
                  pids={"job": job.pid})
    for name, value in stack.env().items():  # what `fanout` would take from the stack
        monkeypatch.setenv(name, value)
    try:
        stack.save()
        assert cli.main(["--run-dir", str(run), "rebuild"]) == 1
        assert (run / "fanout.sqlite").exists()
    finally:
        job.kill()
        job.wait(10)
    assert cli.main(["--run-dir", str(run), "rebuild", "--force"]) == 0
    assert not (run / "fanout.sqlite").exists() and not (run / "checkpoints").exists()
