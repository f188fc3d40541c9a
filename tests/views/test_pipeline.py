"""The whole view path for real: Kafka → Spark (RocksDB state) → SQLite or Cassandra.

Each test produces a history into its own topics, runs the streaming query with
``availableNow`` (it drains what is there and stops — no sleeps), and checks the
served timelines against the SQL recomputed from the topics with ``infra.checks.verify``.
The tests run on both stores — a SQLite file, and a fresh keyspace on the session's
Cassandra node (``cassandra_hosts`` in ``tests/plugins/cassandra.py``) — except the
one-shot replay, which the restart test covers on Cassandra (a replay in two halves,
then ``verify``): each Spark run costs seconds (the restart on Cassandra, ~10 s here).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Producer

from infra.checks.verify import verify
from infra.services.spark import DAEMON_MODULE
from ingest.events import Follow, Post, UserUpsert, encode_key
from ingest.generator import DEFAULT_SPAN_MS, DEFAULT_START_MS, KINDS, add_reads, generate
from ingest.settings import KafkaSettings
from ingest.social import SOCIAL
from serving.timeline import home_top
from tests.support.cassandra import fresh_keyspace
from tests.support.changelog import produce
from views.job import job_sink, start_query
from views.settings import ViewSettings
from views.stores.base import DORMANT, Store

#: Not a whole stack: the session's Kafka node, SparkSession and Cassandra node, so it runs
#: with the tests that start none (tests/plugins/workers.py).
pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.timeout(900)]
BIG = 2**63 - 1


@pytest.fixture(params=["sqlite", "cassandra"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty store of each kind: a SQLite file, or a fresh Cassandra keyspace."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'v.sqlite'}"
        return
    with fresh_keyspace(request.getfixturevalue("cassandra_hosts")) as url:
        yield url


def _view(tmp_path: Path, store_url: str, **overrides: object) -> ViewSettings:
    base = dict(store_url=store_url, checkpoint_dir=tmp_path / "ck",
                timeline_cap=40, celebrity_threshold=40, max_records_per_batch=3000,
                shuffle_partitions=2)
    return ViewSettings(**(base | overrides))


def _store(view: ViewSettings) -> Store:
    return view.store()


def _drain(spark, kafka: KafkaSettings, view: ViewSettings, store: Store) -> None:
    query = start_query(spark, kafka, view, store, available_now=True)
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_replayed_history_equals_the_sql(spark, kafka_settings, tmp_path, store_url):
    # Every record of DESIGN §4b, and reads: most users stop reading, and go inactive
    # after 4 days of the 30-day history.
    history = add_reads(generate(300, 4000, 3000, seed=3, mix=SOCIAL), 0.3,
                        DEFAULT_START_MS, DEFAULT_SPAN_MS)
    counts = history.counts()
    assert all(counts[k] > 0 for k in KINDS), counts
    events = list(history.events())
    produce(kafka_settings, events)
    view = _view(tmp_path, store_url, inactive_days=4)
    with _store(view) as store:
        _drain(spark, kafka_settings, view, store)
        result = verify(kafka_settings, store, view.timeline_cap)
        assert result.ok, result.render()
        assert result.users_checked > 250
        assert store.celebrities(), "the history should cross the celebrity threshold"
        dormant = [u for u in store.home_users() if store.horizon(u) == DORMANT]
        assert dormant, "users who stopped reading should get no fan-out"
    # The decode (mapInArrow) and the join (transformWithStateInPandas) share one
    # pool of Python workers: one daemon, not one per stage (infra.services.spark.session_conf).
    assert len(_worker_daemons()) == 1, _worker_daemons()


def _worker_daemons() -> list[list[str]]:
    """Command lines of the Spark JVMs' Python daemons for UDF workers (``views.daemon``)."""
    daemons = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd, parent = proc.cmdline(), proc.parent()
            if cmd[-2:] == [DAEMON_MODULE, "pyspark.worker"] and parent is not None \
                    and "java" in parent.name():
                daemons.append(cmd)
        except psutil.Error:
            continue  # gone meanwhile
    return daemons


def test_stopping_and_restarting_midway_converges(spark, kafka_settings, tmp_path, store_url):
    events = list(generate(200, 3000, 3000, seed=5).events())
    half = len(events) // 2
    produce(kafka_settings, events[:half])
    view = _view(tmp_path, store_url, max_records_per_batch=500)
    with _store(view) as store:
        # First run: stopped from outside after two micro-batches, mid-stream.
        two_batches = threading.Event()
        # The job's own sink for the store: Cassandra's writes from the executors.
        sink = job_sink(view, store, spool=False)
        sink.on_batch = lambda *_: two_batches.set() if len(sink.history) >= 2 else None
        query = start_query(spark, kafka_settings, view, store, sink=sink)
        assert two_batches.wait(300), "no two micro-batches within 300 s"
        query.stop()
        assert 0 < sum(s.deltas for _, _, s in sink.history)
        # The rest arrives while the job is down; a new query resumes from the checkpoint.
        produce(kafka_settings, events[half:])
        _drain(spark, kafka_settings, view, store)
        result = verify(kafka_settings, store, view.timeline_cap)
        assert result.ok, result.render()


def test_ids_near_2_pow_63_and_bad_records(spark, kafka_settings, tmp_path, store_url):
    produce(kafka_settings, [
        UserUpsert(BIG - 5, "big", "Big Author", 1),
        Follow(BIG, BIG - 5, 2),
        Post(BIG - 1, BIG - 5, 3, "near 2^63"),
        Post(2**53 + 1, BIG - 5, 4, "just past float64"),
    ])
    raw = Producer({"bootstrap.servers": kafka_settings.bootstrap})
    bad = [("tweets", b"1", b"not json"), ("follows", b"7", b'{"v":1,"op":"follow",'
           b'"follower_id":7,"followee_id":7,"created_at":1}'),
           # A tombstone; keyed, since Kafka refuses a keyless record on a compacted topic.
           ("users", b"5", None)]
    for topic, key, value in bad:
        raw.produce(kafka_settings.topic(topic), key=key, value=value)
    assert raw.flush(30) == 0
    view = _view(tmp_path, store_url)
    with _store(view) as store:
        _drain(spark, kafka_settings, view, store)
        entries = home_top(store, BIG, 10)
        assert [(e.tweet_id, e.author_id) for e in entries] == [
            (2**53 + 1, BIG - 5), (BIG - 1, BIG - 5)]
        assert store.users([BIG - 5])[BIG - 5].handle == "big"
        letters = store.dead_letters()
        assert sorted(d.topic for d in letters) == ["follows", "tweets", "users"]
        assert all(d.reason for d in letters)
        assert verify(kafka_settings, store, view.timeline_cap).ok
    assert encode_key(BIG) == str(BIG).encode()
