"""The executor sink's two stages against a real Cassandra node, without Spark.

The stage functions are what Spark's tasks run (``mapInArrow``); here each is called
in-process on a share of a batch split the way Spark's hash repartitioning splits it,
so that many batches run in seconds. Every batch is applied twice: through the
driver path (``CassandraStore.apply``) into one keyspace and through the stages into
another; every table the read path uses must then read the same. The Spark path
itself runs in ``tests/views/test_pipeline.py`` and ``tests/views/test_faults.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import psutil
import pyarrow as pa
import pytest

from infra.checks.verify import compare
from ingest.events import (
    BLOCK,
    MUTE,
    AccountDelete,
    Activity,
    Delete,
    Event,
    Follow,
    Post,
    Relation,
    Repost,
    Unrepost,
)
from ingest.generator import History, generate
from serving.timeline import home_top
from tests.support.cassandra import fresh_keyspace, writing_store
from views.changelog import Changelog
from views.delta import Delta, DeltaKind
from views.errors import StoreError
from views.join import JoinConfig
from views.local import LocalJoin
from views.sink import deltas_table
from views.stores.cassandra import statements as cql
from views.stores.cassandra.config import WRITE_PROFILE
from views.stores.cassandra.sink import ExecutorSink, spark_routes, tweet_stage, user_stage
from views.stores.cassandra.store import CassandraStore, close_task_stores
from views.stores.contract import BatchStats, Store
from views.stores.rows import DORMANT, Entry, Relations, UserRow
from views.stores.sqlite import SQLiteStore

pytestmark = [pytest.mark.timeout(600), pytest.mark.long]

CAP = 12
_BY_TWEET = {DeltaKind.TWEET, DeltaKind.REPOST, DeltaKind.TL_DEL, DeltaKind.UNFANOUT,
             DeltaKind.TL_ADD, DeltaKind.FANOUT}


class Recording(SQLiteStore):
    """A SQLite store that also keeps every batch's deltas (the reference, and the input)."""

    def __init__(self, inactive_days: float = 0.0) -> None:
        super().__init__(":memory:", cap=CAP, inactive_days=inactive_days)
        self.recorded: list[list[Delta]] = []

    def apply(self, deltas, batch_id=-1) -> BatchStats:
        self.recorded.append(list(deltas))
        return super().apply(self.recorded[-1], batch_id)


def _no_nulls_where_not_null(table: pa.Table) -> pa.Table:
    """Stage 1's rows as Spark takes them: no null in a column its schema says is NOT NULL."""
    for f in table.schema:
        assert f.nullable or table.column(f.name).null_count == 0, f.name
    return table


def _tweet_key(row: dict) -> int:
    """Stage 1's shuffle key, as ``sink.tweet_route`` computes it in Spark."""
    if row["kind"] in _BY_TWEET:
        return row["tweet_id"]
    if row["kind"] == DeltaKind.USER:
        return row["user_id"]
    return row["author_id"] ^ row["user_id"] ^ row["offset"]


def _split(table: pa.Table, key, n: int) -> Iterator[pa.Table]:
    rows = table.to_pylist()
    for part in range(n):
        yield pa.Table.from_pylist([r for r in rows if hash(key(r)) % n == part],
                                   schema=table.schema)


def _apply_in_tasks(sink: ExecutorSink, deltas: list[Delta], batch_id: int, n: int = 3,
                    tweet_tasks_twice: bool = False) -> BatchStats:
    """What ExecutorSink.__call__ does, with the two shuffles done here.

    Stage two's shuffle key takes the values 0..n-1, which ``_split`` sends to tasks
    0..n-1 as Spark sends ``ExecutorSink.routes``' values.
    """
    ts, digest = sink.begin(batch_id)
    routed = []
    for part in _split(deltas_table(deltas), _tweet_key, n):
        for _ in range(2 if tweet_tasks_twice else 1):  # a task Spark ran again
            out = list(tweet_stage(sink.open_store, ts, range(n), iter(part.to_batches())))
        routed += out
    table = _no_nulls_where_not_null(pa.Table.from_batches(routed))
    tallies = [SimpleNamespace(**row)
               for part in _split(table, lambda r: r["route"], n)
               for batch in user_stage(sink.open_store, ts, iter(part.to_batches()),
                                       sink.store.inactive_ms)
               for row in batch.to_pylist()]
    return sink.finish(batch_id, ts, digest, tallies, 0.0)


def _read_all(store: Store, users: list[int], tweets: list[int]) -> dict[str, object]:
    gone = {u for u, row in store.users(users).items() if row.deleted}  # served no timeline
    return {
        "relations": {u: store.relations(u) for u in users},
        "reposts_of": store.reposts_of(tweets),
        # What is served: the cache's tail past the cap, and so the horizon, may differ
        # with when trims ran (a rerun batch raises the size estimate, trimming sooner).
        "home": {u: home_top(store, u, CAP) for u in users if u not in gone},
        "followees": {u: sorted(store.followees(u)) for u in users},
        "celebrity_edges": {u: sorted(store.celebrities_followed(u)) for u in users},
        "celebrities": store.celebrities(),
        "tweets": store.tweets(tweets),
        "users": store.users(users),
        "offsets": store.applied_offsets(),
        "author_tweets": store.author_tweets(users, None, 100_000),
    }


@contextmanager
def _keyspaces(hosts: str, inactive_days: float = 0.0, options: str = ""
               ) -> Iterator[tuple[CassandraStore, CassandraStore]]:
    """Open stores in two fresh keyspaces: the driver path's, and the executors'; both
    retry a timed-out write, as the job's writers do (:func:`writing_store`).

    ``options``: the stores' URL options (the executors' tasks open it from the URL)."""
    with fresh_keyspace(hosts, options) as a, fresh_keyspace(hosts, options) as b:
        driver, executors = (writing_store(url, CAP, inactive_days) for url in (a, b))
        driver.open()
        executors.open()
        try:
            yield driver, executors
        finally:
            driver.close()
            executors.close()
            close_task_stores()


@pytest.fixture
def two_keyspaces(cassandra_hosts: str) -> Iterator[tuple[CassandraStore, CassandraStore]]:
    with _keyspaces(cassandra_hosts) as stores:
        yield stores


def _timeline_kinds(history: History, seed: int) -> list[Event]:
    """Reposts (some undone, some twice), replies, blocks, mutes and account deletions
    over a generated history's users and posts, each later than what it names."""
    rng = random.Random(seed)
    users = sorted({u.user_id for u in history.users})
    posts = [t for t in history.tweets if isinstance(t, Post)]
    ids = iter(range(max(t.tweet_id for t in history.tweets) + 1, 2**62))
    out: list[Event] = []
    for post in rng.sample(posts, 250):
        reposter = rng.choice([u for u in users if u != post.author_id])
        at = post.created_at + rng.randrange(1, 10**8)
        repost = Repost(next(ids), reposter, post.tweet_id, post.author_id, at)
        out.append(repost)
        undo, later = rng.random(), at + rng.randrange(1, 10**8)
        if undo < 0.2:
            out.append(Unrepost(repost.tweet_id, reposter, later))
        elif undo < 0.3:
            out.append(Delete(repost.tweet_id, reposter, later))
        elif undo < 0.45:  # a second repost of the same tweet: a no-op while the first stands
            out.append(dataclasses.replace(repost, tweet_id=next(ids), created_at=later))
    for post in rng.sample(posts, 80):
        other = rng.choice([u for u in users if u != post.author_id])
        out.append(Post(next(ids), post.author_id, post.created_at + 1, "re", other))
    for _ in range(120):
        actor, other = rng.sample(users, 2)
        at = rng.choice(posts).created_at
        out.append(Relation(actor, other, at, rng.choice((BLOCK, MUTE)), rng.random() < 0.7))
    out += [AccountDelete(u, rng.choice(posts).created_at) for u in rng.sample(users, 4)]
    return out


def test_stages_write_what_the_driver_path_writes(two_keyspaces):
    driver, executors = two_keyspaces
    history = generate(100, 1200, 1000, seed=7, delete_ratio=0.1, unfollow_ratio=0.15)
    extra = _timeline_kinds(history, seed=7)
    events = sorted([*history.events(), *extra], key=lambda e: e.created_at)
    reference = Recording().open()
    join = LocalJoin(JoinConfig(cap=CAP, promote_at=25, demote_below=20), reference)
    for i in range(0, len(events), 400):
        join.run(events[i:i + 400])
    sink = ExecutorSink(executors)
    for batch_id, deltas in enumerate(reference.recorded):
        driver.apply(deltas, batch_id)
        stats = _apply_in_tasks(sink, deltas, batch_id, tweet_tasks_twice=batch_id % 3 == 1)
        if batch_id == 2:  # the batch again, as Spark reruns it after a crash
            _apply_in_tasks(sink, deltas, batch_id)
    users = sorted({u.user_id for u in history.users})
    tweets = sorted({t.tweet_id for t in [*history.tweets, *extra] if hasattr(t, "tweet_id")})
    assert driver.celebrities(), "the history should cross the celebrity threshold"
    assert stats.timeline_adds > 0
    expected, got = _read_all(driver, users, tweets), _read_all(executors, users, tweets)
    for table in expected:
        assert got[table] == expected[table], table
    # The new kinds reached the store: reposts shown and hidden, replies, blocks, mutes.
    rows = driver.tweets(tweets).values()
    assert {(r.is_repost, r.deleted) for r in rows} >= {(True, True), (True, False)}
    assert any(r.reply_to for r in rows) and driver.reposts_of(tweets)
    relations = [driver.relations(u) for u in users]
    assert any(r.blocked for r in relations) and any(r.muted for r in relations)
    assert sum(u.deleted for u in driver.users(users).values()) == 4
    assert [b.batch_id for b in executors.batches(3)] == [len(reference.recorded) - 1,
                                                         len(reference.recorded) - 2,
                                                         len(reference.recorded) - 3]


def test_stage_two_folds_what_the_shuffle_reorders(two_keyspaces):
    """Spark delivers a task's rows in no particular order: the newest relation wins (an
    un-op a tie), the newest profile, and an account deletion whatever came with it."""
    _, executors = two_keyspaces
    sink = ExecutorSink(executors)
    for batch_id, reverse in enumerate((False, True)):
        u, x, y, z = (9_000 + 10 * batch_id + i for i in range(4))
        deltas = [Delta.relation(u, x, "block", False, 7), Delta.relation(u, x, "block", True, 5),
                  Delta.relation(u, y, "mute", True, 6), Delta.relation(u, y, "mute", False, 6),
                  Delta.relation(u, z, "mute", True, 4), Delta.relation(z, u, "block", True, 4),
                  Delta.profile(y, 4, "new", "New"), Delta.profile(y, 3, "old", "Old"),
                  Delta.account_deleted(z, 9), Delta.profile(z, 10, "late", "Late")]
        _apply_in_tasks(sink, deltas[::-1] if reverse else deltas, batch_id)
        assert executors.relations(u) == Relations(frozenset({z}), frozenset({z}))
        assert executors.relations(x) == Relations()
        assert executors.relations(z) == Relations(frozenset({u}), frozenset())
        assert executors.users([y, z]) == {y: UserRow(y, "new", "New"),
                                           z: UserRow(z, "", "", True)}


def test_stages_move_a_repost_as_the_sqlite_store_does(two_keyspaces, monkeypatch):
    """Smaller copies of a repost id (another time, another original: DESIGN §4b) and
    deletes under another user's id in a repost's batch. Both paths store what SQLite
    does, the rows at a moved repost's old key gone, also when a stage-1 task dies
    once the repost's row names the new key and the batch runs again."""
    driver, executors = two_keyspaces
    u, r, a, b, forger = (9_100 + i for i in range(5))
    o1, o2, rid, rid2 = (9_110 + i for i in range(4))
    batches = [[Follow(u, r, 1), Post(o1, a, 3, "o1"), Post(o2, b, 2, "o2"),
                Repost(rid, r, o1, a, 7)],
               [Repost(rid, r, o2, b, 5), Delete(rid, forger, 8),
                Repost(rid2, r, o1, a, 0), Delete(rid2, forger, 9)],
               [Repost(rid, r, o2, b, 4), Unrepost(rid, r, 9)]]
    real_run = CassandraStore._run
    cut_short = [False]

    def run(self: CassandraStore, ops: list[cql.Op], profile: object = WRITE_PROFILE) -> list:
        if cut_short[0] and any(name == "repost_set" for name, _ in ops):
            cut_short[0] = False
            real_run(self, [op for op in ops if op[0] == "repost_set"], profile)
            msg = "the task died mid-batch"
            raise StoreError(msg)
        return real_run(self, ops, profile)

    monkeypatch.setattr(CassandraStore, "_run", run)
    reference = Recording().open()
    join = LocalJoin(JoinConfig(cap=CAP, promote_at=25, demote_below=20), reference)
    sink = ExecutorSink(executors)
    users, tweets = [u, r, a, b, forger], [o1, o2, rid, rid2]
    reads = ("reposts_of", "home", "tweets", "author_tweets")
    for batch_id, events in enumerate(batches):
        join.run(events)
        deltas = reference.recorded[-1]
        driver.apply(deltas, batch_id)
        if batch_id == 1:
            cut_short[0] = True
            with pytest.raises(StoreError, match="died mid-batch"):
                _apply_in_tasks(sink, deltas, batch_id)
            assert executors.tweets([rid])[rid].created_at == 5  # the new key is stored
        _apply_in_tasks(sink, deltas, batch_id, tweet_tasks_twice=batch_id == 2)
        expected = _read_all(reference, users, tweets)
        for store in (driver, executors):
            got = _read_all(store, users, tweets)
            for table in reads:
                assert got[table] == expected[table], (batch_id, table)
        if batch_id == 1:  # what SQLite stores, spelled out
            assert reference.author_tweets([r], None, 10) == [Entry(5, rid, r),
                                                              Entry(0, rid2, r)]
            assert expected["reposts_of"] == {o2: [Entry(5, rid, r)], o1: [Entry(0, rid2, r)]}
    assert reference.author_tweets([r], None, 10) == [Entry(0, rid2, r)]
    assert [e.tweet_id for e in expected["home"][u]] == [rid2]


DAY = 86_400_000


def _reads(history: History, seed: int, days: float) -> list[Activity]:
    """Home-timeline reads over a generated history, by user, in four kinds.

    Readers read at least every ``days`` (never dormant); lapsed readers stop from the
    fifth day to the fifteenth (dormant, then back); some read once on the first day
    (dormant to the end); the rest never read (never dormant either).
    """
    rng = random.Random(seed)
    times = [t.created_at for t in history.tweets]
    start, end = min(times), max(times)
    out: list[Activity] = []
    for i, user in enumerate(sorted(u.user_id for u in history.users)):
        if i % 4 == 3:
            continue
        at = start + rng.randrange(DAY)
        out.append(Activity(user, at))
        gap = (start + 5 * DAY, start + 15 * DAY) if i % 4 == 1 else (end, end)
        while i % 4 != 2 and at < end:
            at += rng.randrange(DAY // 2, int(days * DAY))
            if gap[0] <= at < gap[1]:
                at = gap[1] + rng.randrange(DAY)
            out.append(Activity(user, at))
    return out


def _dormant(store: Store, users: list[int]) -> set[int]:
    return {u for u in users if store.horizon(u) == DORMANT}


def test_stages_keep_inactive_users_as_the_driver_path_does(cassandra_hosts):
    """Reads (ACTIVITY) reach the task of the reader's timeline: after every batch the
    same users are dormant on both paths as in the SQLite store, and a returning user's
    regenerated cache is the same; a batch that changed who is dormant runs again on the
    executors (a Spark rerun), with no visible effect."""
    days = 3.0
    history = generate(60, 700, 600, seed=11, delete_ratio=0.1, unfollow_ratio=0.15)
    extra = [*_timeline_kinds(history, seed=11), *_reads(history, seed=11, days=days)]
    events = sorted([*history.events(), *extra], key=lambda e: e.created_at)
    reference = Recording(inactive_days=days).open()
    # Celebrities early enough that returning users follow some (left out of the cache).
    join = LocalJoin(JoinConfig(cap=CAP, promote_at=15, demote_below=12), reference)
    users = sorted(u.user_id for u in history.users)
    went_dormant, regenerated = set(), {}
    # Dormancy batch by batch, as SQLite's: every timeline kept up every batch.
    with _keyspaces(cassandra_hosts, days, "upkeep=1") as (driver, executors):
        sink = ExecutorSink(executors)
        before: set[int] = set()
        for batch_id, start in enumerate(range(0, len(events), 200)):
            join.run(events[start:start + 200])
            deltas = reference.recorded[-1]
            driver.apply(deltas, batch_id)
            _apply_in_tasks(sink, deltas, batch_id)
            now = _dormant(reference, users)
            if now != before:
                _apply_in_tasks(sink, deltas, batch_id)
            assert _dormant(driver, users) == now == _dormant(executors, users), batch_id
            for user in before - now:  # back: the cache as fan-out would have left it
                cache = reference.cached(user, None, 10_000)
                assert driver.cached(user, None, 10_000) == cache, (batch_id, user)
                assert driver.horizon(user) == reference.horizon(user), (batch_id, user)
                # The newest CAP: the executors' reruns may have trimmed sooner below them.
                assert executors.cached(user, None, CAP) == cache[:CAP], (batch_id, user)
                regenerated[user] = reference.celebrities_followed(user)
                assert cache, (batch_id, user)
            went_dormant |= now - before
            before = now
        tweets = sorted({t.tweet_id for t in [*history.tweets, *extra] if hasattr(t, "tweet_id")})
        expected, got = _read_all(driver, users, tweets), _read_all(executors, users, tweets)
        for table in expected:
            assert got[table] == expected[table], table
    assert regenerated, "lapsed readers should come back to a regenerated cache"
    assert any(regenerated.values()), "some returning reader should follow a celebrity"
    assert went_dormant - set(regenerated), "a one-time reader should stay dormant"
    assert driver.rows_written == reference.rows_written  # regenerations included


def _node_pid(hosts: str) -> int | None:
    """The pid listening on the node's native port, if it runs on this machine."""
    port = int(hosts.split(",")[0].rsplit(":", 1)[1])
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return conn.pid
    return None


def _pausable_writer(two_keyspaces, cassandra_hosts, caplog,
                     retry_s: float) -> tuple[int, CassandraStore]:
    """The local node's pid and an open task writer with a 1 s request timeout and
    ``retry_s`` of retries, the executor's warnings captured; skips a remote node."""
    pid = _node_pid(cassandra_hosts)
    if pid is None:
        pytest.skip("the Cassandra node is not a local process: it cannot be paused")
    _, executors = two_keyspaces
    config = dataclasses.replace(executors.config, timeout=1.0, retry_s=retry_s)
    writer = CassandraStore.for_tasks(config, CAP)
    writer.open()
    caplog.set_level(logging.WARNING, logger="views.stores.cassandra.executor")
    return pid, writer


def test_a_write_that_times_out_is_run_again(two_keyspaces, cassandra_hosts, caplog):
    """The node stops answering (SIGSTOP) for longer than the request timeout, then resumes."""
    _, executors = two_keyspaces
    pid, writer = _pausable_writer(two_keyspaces, cassandra_hosts, caplog, 60.0)
    ops = [("user_set", (u, f"h{u}", "n", 1, 10)) for u in range(1, 41)]
    resume = threading.Timer(3.0, os.kill, (pid, signal.SIGCONT))
    try:
        os.kill(pid, signal.SIGSTOP)
        resume.start()
        writer._run(ops)
    finally:
        resume.join(10)
        os.kill(pid, signal.SIGCONT)
        writer.close()
    assert any("running them again" in r.message for r in caplog.records), caplog.text
    assert len(executors.users(list(range(1, 41)))) == 40


def test_with_no_retry_budget_a_timed_out_write_fails_at_once(two_keyspaces, cassandra_hosts,
                                                               caplog):
    """The API's stores have no budget: a request that times out fails the call, once."""
    pid, writer = _pausable_writer(two_keyspaces, cassandra_hosts, caplog, 0.0)
    try:
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(StoreError, match="after 1 attempt"):
            writer._run([("user_set", (u, f"h{u}", "n", 1, 10)) for u in range(1, 5)])
    finally:
        os.kill(pid, signal.SIGCONT)
        writer.close()
    assert not any("running them again" in r.message for r in caplog.records), caplog.text


def test_a_bad_statement_is_not_retried(two_keyspaces):
    _, executors = two_keyspaces
    writer = CassandraStore.for_tasks(executors.config, CAP)
    writer.open()
    try:
        with pytest.raises(StoreError, match="after 1 attempt"):
            writer._run([("user_set", (2, "h", "n", "not a number", 10))])
    finally:
        writer.close()


def _rival_claims(first: History, second: History) -> list[Post]:
    """Posts by another author of ``first``'s deleted posts' ids, at their times, for
    ``second`` to carry: half by a lower author id (they own the id), half higher."""
    users = sorted({u.user_id for u in second.users})
    posts = {t.tweet_id: t for t in first.tweets if isinstance(t, Post)}
    deleted = [posts[t.tweet_id] for t in first.tweets
               if isinstance(t, Delete) and t.tweet_id in posts]
    out = []
    for i, post in enumerate(deleted):
        lower = [u for u in users if u < post.author_id]
        higher = [u for u in users if u > post.author_id]
        rivals = lower if (i % 2 == 0 and lower) or not higher else higher
        out.append(Post(post.tweet_id, rivals[i % len(rivals)], post.created_at, "rival"))
    return out


def test_rival_claims_of_deleted_ids_in_a_later_history_are_served_as_the_sql_says(
        two_keyspaces):
    """Two histories replayed one after the other whose tweet ids collide (the generator's
    ids are its posts' times): the second posts, under another author and at the same
    time, ids the first posted and deleted. Each id belongs to the earlier claim by
    (created_at, author_id); both paths serve what the SQL says."""
    driver, executors = two_keyspaces
    span = DAY // 100  # as the multi-node tests' histories: none of them is late
    first = generate(60, 700, 300, seed=21, delete_ratio=0.2, span_ms=span)
    second = generate(60, 700, 300, seed=22, delete_ratio=0.05, span_ms=span)
    rivals = _rival_claims(first, second)
    assert len(rivals) > 20
    events = [*sorted(first.events(), key=lambda e: e.created_at),
              *sorted([*second.events(), *rivals], key=lambda e: e.created_at)]
    reference = Recording().open()
    join = LocalJoin(JoinConfig(cap=CAP, promote_at=25, demote_below=20), reference)
    sink = ExecutorSink(executors)
    for batch_id, start in enumerate(range(0, len(events), 300)):
        join.run(events[start:start + 300])
        deltas = reference.recorded[-1]
        driver.apply(deltas, batch_id)
        _apply_in_tasks(sink, deltas, batch_id)
    log_ = Changelog(events=events)
    for store in (reference, driver, executors):
        result = compare(log_, store, CAP)
        assert result.divergent == 0, (store, result.samples)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_each_route_lands_in_its_own_task_of_stage_two(spark, n):
    """``repartition(n, "route")`` sends the p-th route to partition p: one task a route."""
    from pyspark.sql import functions as F

    routes = spark_routes(spark, n)
    assert len(set(routes)) == n
    frame = spark.createDataFrame([(r,) for r in routes] * 5, "route long")
    placed = (frame.repartition(n, "route")
              .select("route", F.spark_partition_id().alias("task")).distinct().collect())
    assert sorted((r.task, r.route) for r in placed) == list(enumerate(routes))
