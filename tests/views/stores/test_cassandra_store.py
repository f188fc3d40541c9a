"""The Cassandra store's parts: URL, policies, statements, schema step, phases, reads.

The store's behaviour is in the contract suite (``test_store_contract.py``); here are
the pure steps it is built from — the URL and its options, the driver objects it
configures, the plan → statement step, batch timestamps — and, on the session's real
Cassandra node (``cassandra_hosts`` in ``tests/plugins/cassandra.py``), each in a fresh keyspace:
every statement prepared against the schema, the schema step, and the order and
write timestamps of a batch's phases.
"""

from __future__ import annotations

import gc
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cassandra import ConsistencyLevel
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ResponseFuture
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import tuple_factory

from infra.cli import _parser
from ingest.events import MAX_TEXT
from tests.support.cassandra import (
    fresh_keyspace,
    keyspace_url,
    new_keyspace_name,
    writing,
    writing_store,
)
from views.delta import Delta, pack
from views.errors import StoreError
from views.stores import store_from_url
from views.stores.cassandra import chunks
from views.stores.cassandra import statements as cql
from views.stores.cassandra.config import (
    WRITE_PROFILE,
    ConfigError,
    Replication,
    cluster_options,
    consistency_level,
    load_balancing,
    parse_url,
)
from views.stores.cassandra.executor import requests
from views.stores.cassandra.schema import (
    SchemaError,
    Step,
    apply_schema,
    connect,
    keyspace_cql,
    load_steps,
    pending,
    require_current,
    split_cql,
)
from views.stores.cassandra.store import CassandraStore
from views.stores.contract import Store
from views.stores.plan import WritePlan
from views.stores.rows import DORMANT, DeadRow, Entry, RelationRow, Relations, TweetRow, UserRow

BIG = 2**63 - 1


# -- the URL -----------------------------------------------------------------------------------

def test_a_full_url_parses() -> None:
    config = parse_url("cassandra://ann:s%40cret@c1,c2,c3:9142/fanout?dc=eu-1:3,us_2:2"
                       "&local_dc=eu-1&read_cl=local_one&write_cl=EACH_QUORUM&concurrency=32"
                       "&timeout=2.5&scan_timeout=60&trim_slack=0&schema=auto&ssl=1"
                       "&page_fresh_ms=50")
    assert config.hosts == ("c1", "c2", "c3") and config.port == 9142
    assert (config.keyspace, config.username, config.password) == ("fanout", "ann", "s@cret")
    assert config.replication == Replication("NetworkTopologyStrategy",
                                             (("eu-1", 3), ("us_2", 2)))
    assert config.local_dc == "eu-1"
    assert (config.read_cl, config.write_cl) == (ConsistencyLevel.LOCAL_ONE,
                                                 ConsistencyLevel.EACH_QUORUM)
    assert (config.concurrency, config.timeout, config.scan_timeout) == (32, 2.5, 60.0)
    assert (config.trim_slack, config.auto_schema, config.ssl) == (0, True, True)
    assert config.page_fresh_s == 0.05
    assert "s@cret" not in repr(config)


def test_url_defaults() -> None:
    config = parse_url("cassandra://cassandra/fanout")
    assert (config.hosts, config.port, config.username) == (("cassandra",), 9042, None)
    assert config.replication.cql_map() == "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    assert config.read_cl == config.write_cl == ConsistencyLevel.LOCAL_QUORUM
    assert (config.auto_schema, config.ssl, config.trim_slack) == (False, False, None)
    assert config.upkeep == 8
    assert parse_url("cassandra://cassandra/fanout?upkeep=1").upkeep == 1


def test_ports_and_ipv6_hosts() -> None:
    assert parse_url("cassandra://a:9043,b:9043/k").port == 9043
    config = parse_url("cassandra://[::1]:9044,[fe80::2]/k")
    assert (config.hosts, config.port) == (("::1", "fe80::2"), 9044)


@pytest.mark.parametrize(("url", "says"), [
    ("cassandra://h", "needs a keyspace"),
    ("cassandra://h/bad-name", "needs a keyspace"),
    ("cassandra:///ks", "no Cassandra host"),
    ("cassandra://a:9042,b:9043/ks", "one native port"),
    ("cassandra://a:http/ks", "bad port"),
    ("cassandra://a/ks?replicas=3", "unknown Cassandra store option"),
    ("cassandra://a/ks?rf=3&dc=dc1:3", "either rf"),
    ("cassandra://a/ks?rf=0", "at least 1"),
    ("cassandra://a/ks?dc=dc1", "expected dc1:3"),
    ("cassandra://a/ks?read_cl=SERIAL", "consistency level"),
    ("cassandra://a/ks?read_cl=EACH_QUORUM", "consistency level"),
    ("cassandra://a/ks?write_cl=ANY", "consistency level"),
    ("cassandra://a/ks?timeout=0", "must be a number"),
    ("cassandra://a/ks?schema=create", "check or auto"),
    ("cassandra://a/ks?ssl=yes", "0/1/true/false"),
    ("cassandra://a/ks?trim_slack=-1", "whole number"),
    ("cassandra://a/ks?upkeep=0", "at least 1"),
    ("cassandra://a/ks?upkeep=1025", "upkeep='1025' must be at most 1024"),
    ("cassandra://a/ks?concurrency=4096", "concurrency='4096' must be at most 2048"),
    ("sqlite:///x", "not a cassandra"),
])
def test_bad_urls_say_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_url(url)


def test_consistency_levels_parse_case_insensitively() -> None:
    assert consistency_level(" local_quorum ") == ConsistencyLevel.LOCAL_QUORUM
    assert consistency_level("each_quorum", write=True) == ConsistencyLevel.EACH_QUORUM
    with pytest.raises(ConfigError):
        consistency_level("LOCAL_SERIAL", write=True)


def test_store_from_url_builds_without_connecting() -> None:
    store = store_from_url("cassandra://no-such-host.invalid/ks", cap=12)
    assert isinstance(store, CassandraStore) and store.cap == 12
    assert store.trim_slack == 16
    with pytest.raises(StoreError, match="not open"):
        store.cached(1, None, 10)


# -- driver objects ----------------------------------------------------------------------------

def test_load_balancing_is_token_aware_over_the_local_dc() -> None:
    policy = load_balancing("dc1")
    assert isinstance(policy, TokenAwarePolicy) and policy.shuffle_replicas
    child = policy._child_policy
    assert isinstance(child, DCAwareRoundRobinPolicy) and child.local_dc == "dc1"
    assert load_balancing(None)._child_policy.local_dc == ""


def test_cluster_options_carry_levels_profiles_and_credentials() -> None:
    config = parse_url("cassandra://u:p@10.0.0.1,10.0.0.2:9043/ks?read_cl=ONE&write_cl=QUORUM"
                       "&local_dc=dc9&timeout=3&ssl=1")
    options = cluster_options(config)
    assert (options["contact_points"], options["port"]) == (["10.0.0.1", "10.0.0.2"], 9043)
    read, write = (options["execution_profiles"][k] for k in (EXEC_PROFILE_DEFAULT,
                                                                WRITE_PROFILE))
    assert (read.consistency_level, write.consistency_level) == (ConsistencyLevel.ONE,
                                                                 ConsistencyLevel.QUORUM)
    assert write.serial_consistency_level == ConsistencyLevel.LOCAL_SERIAL
    assert read.row_factory is tuple_factory and read.request_timeout == 3
    assert read.load_balancing_policy is not write.load_balancing_policy
    assert read.load_balancing_policy._child_policy.local_dc == "dc9"
    assert isinstance(options["auth_provider"], PlainTextAuthProvider)
    assert options["ssl_context"] is not None


def test_a_cluster_is_built_without_touching_the_network() -> None:
    cluster = Cluster(**cluster_options(parse_url("cassandra://127.0.0.1/ks")))
    try:
        assert cluster.port == 9042 and not cluster.is_shutdown
    finally:
        cluster.shutdown()


# -- statements --------------------------------------------------------------------------------

def test_protocol_negotiation_is_not_a_warning(keyspace: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    cluster, _ = connect(parse_url(keyspace), wait=60)
    cluster.shutdown()
    assert not [r for r in caplog.records
                if r.levelno >= logging.WARNING and "protocol version" in r.getMessage()]


@pytest.fixture(scope="module")
def keyspace(cassandra_hosts: str) -> Iterator[str]:
    """A store URL naming a fresh keyspace with the schema, for this module."""
    with fresh_keyspace(cassandra_hosts) as url:
        yield url


@pytest.fixture
def session(keyspace: str) -> Iterator[Any]:
    """A driver session on the module's keyspace."""
    config = parse_url(keyspace)
    cluster, session = connect(config, wait=60)
    session.set_keyspace(config.keyspace)
    yield session
    cluster.shutdown()


def test_a_finished_read_is_freed_by_its_reference_count(keyspace: str) -> None:
    """No request outlives its answer in a reference cycle (the driver's future and its
    timeout timer were one), so a reader's rows do not wait for the cyclic collector."""
    store = store_from_url(keyspace, cap=50).open()
    try:
        store.users([1, 2, 3])  # connections and prepared statements settled
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage
        try:
            for user in range(1, 101):
                store.users([user])
                store.home_start(user, None, 20)
            gc.collect()
            futures = sum(isinstance(o, ResponseFuture) for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert futures == 0, f"{futures} requests of 200 reads were freed only by the collector"
    finally:
        store.close()


def test_every_statement_is_valid_against_the_schema(session: Any) -> None:
    for name, text in cql.STATEMENTS.items():
        session.prepare(text)  # Cassandra rejects unknown columns, missing key parts, bad slices
        assert "{" not in text and "%" not in text, name


def _plan(*deltas: Delta) -> WritePlan:
    return Store.plan(deltas)


def _check_markers(ops: list[cql.Op]) -> None:
    for name, params in ops:
        assert cql.STATEMENTS[name].count("?") == len(params), name


def test_statements_are_prepared_with_every_table_qualified() -> None:
    for name, text in cql.STATEMENTS.items():
        qualified = cql.in_keyspace(text, "ks")
        assert qualified.replace("ks.", "") == text, name
        assert not re.search(r"\b(FROM|INTO|UPDATE)\s+(?!ks\.)", qualified), name
    assert cql.in_keyspace("UPDATE tweets USING TIMESTAMP ? SET deleted = true", "k_1") == (
        "UPDATE k_1.tweets USING TIMESTAMP ? SET deleted = true")


def test_tweet_ops_keep_deletes_sticky_and_resolve_times() -> None:
    plan = _plan(Delta.tweet(10, 1, 5, "hi", reply_to=4, record=14, ref_id=9),
                 Delta.tweet_deleted(11, 1),       # time from the table
                 Delta.tweet_deleted(12, 1),       # never posted
                 Delta.tweet(13, 1, 7, "late"),    # its author deleted it
                 Delta.tweet(14, 1, 8, "mine"),    # a forged delete before
                 Delta.tweet_deleted(15, 3))       # a forged delete now
    states = {11: cql.TweetState(4, False, 1), 13: cql.TweetState(None, True, 1),
              14: cql.TweetState(None, True, 3), 15: cql.TweetState(6, False, 1)}
    ops = cql.tweet_ops(plan, states, 100)
    _check_markers(ops)
    assert ops == [("tweet_live", (10, 1, 5, "hi", 4, 14, 9, 100)), ("author_add", (1, 5, 10, 100)),
                   ("tweet_gone_at", (100, 1, 4, 11)), ("author_del", (100, 1, 4, 11)),
                   ("tweet_gone", (100, 1, 12)),
                   # Over another author's row, every cell is written (it may be a repost's).
                   ("tweet_take", (14, 1, 8, "mine", False, 0, 0, 0, 100)),
                   ("author_add", (1, 8, 14, 100))]
    assert cql.TweetState.decode([(4, None, 1, None)]) == cql.TweetState(4, False, 1)
    assert cql.TweetState.decode([(4, False, 1, 9)]) == cql.TweetState(4, False, 1, 9)
    assert cql.TweetState.decode([]) is None


def test_of_two_authors_claims_the_earlier_keeps_the_row() -> None:
    """One id, two authors (a broken contract): the earliest (created_at, author) owns it."""
    plan = _plan(Delta.tweet(30, 1, 5, "later"),            # stored: author 2 at 4
                 Delta.tweet(31, 1, 5, "earlier"),          # stored: author 2 at 6
                 Delta.tweet_deleted(32, 1, 3),             # stored: author 2 at 4, live
                 Delta.repost(33, 1, 9, (10, 2), True),     # stored: author 2's post at 2
                 Delta.repost(34, 1, 1, (10, 2), True))     # stored: author 2's post at 2
    states = {30: cql.TweetState(4, False, 2), 31: cql.TweetState(6, False, 2),
              32: cql.TweetState(4, False, 2), 33: cql.TweetState(2, False, 2),
              34: cql.TweetState(2, False, 2)}
    ops = cql.tweet_ops(plan, states, 100) + cql.repost_ops(plan.reposts, states, 100)
    _check_markers(ops)
    assert ops == [("tweet_take", (31, 1, 5, "earlier", False, 0, 0, 0, 100)),
                   ("author_add", (1, 5, 31, 100)),
                   ("tweet_take", (32, 1, 3, "", True, 0, 0, 0, 100)),
                   ("author_del", (100, 1, 3, 32)),
                   ("repost_set", (34, 1, 1, False, 10, 2, 100)),
                   ("author_add", (1, 1, 34, 100)), ("repost_add", (10, 1, 34, 1, 100))]
    # Another author's stored repost keeps its rows: only the reposter's own move.
    assert cql.repost_moves(plan.reposts, {33: cql.TweetState(7, False, 2, 11)}, 100) == []


def test_tweet_ops_leave_an_id_the_batch_reposts_to_repost_ops() -> None:
    """Both would land at one timestamp, where Cassandra keeps the larger cell value:
    a delete under another user's id would hide the repost (``deleted`` true > false)."""
    plan = _plan(Delta.repost(20, 2, 0, (10, 1), True), Delta.tweet_deleted(20, 3),
                 Delta.repost(21, 2, 4, (10, 1), False), Delta.tweet_deleted(21, 2, 4),
                 Delta.tweet_deleted(22, 2))
    assert cql.lookup_ids(plan) == [20, 21, 22]
    states = {21: cql.TweetState(4, False, 2, 10)}
    assert cql.tweet_ops(plan, states, 100) == [("tweet_gone", (100, 2, 22))]


def test_removes_take_unknown_times_from_the_plan_or_the_table() -> None:
    plan = _plan(Delta.timeline_remove(2, 10, 1), Delta.timeline_remove(2, 11, 1),
                 Delta.timeline_remove(2, 12, 1, 9), Delta.timeline_remove(3, 13, 1),
                 Delta.timeline_remove(3, 16, 5),  # another author's tweet 16
                 Delta.tweet_deleted(11, 1, 6))
    assert cql.lookup_ids(plan) == [10, 11, 13, 16]
    states = {10: cql.TweetState(0, False, 1), 13: cql.TweetState(None, True, 1),
              16: cql.TweetState(3, False, 1)}
    owners = {t: s.author_id for t, s in states.items()}
    keys, skipped = cql.removed_keys(plan.removes, cql.tweet_times(plan, states), owners)
    assert keys == [(2, 0, 10), (2, 6, 11), (2, 9, 12)]
    assert skipped == 2
    ops = cql.remove_ops(keys + [(3, 4, 40)], 7 + cql.REMOVE)
    _check_markers(ops)
    assert ops == [("home_removes", (2, 7, chunks.encode(np.array([(0, 10), (6, 11), (9, 12)])),
                                     7 + cql.REMOVE)),
                   ("home_removes", (3, 7, chunks.encode(np.array([(4, 40)])), 7 + cql.REMOVE))]


def test_wipes_delete_the_authors_rows_found() -> None:
    wipes = cql.wipe_users([(2, 1), (2, 5), (3, 1)])
    partitions = {2: [(8, None, chunks.encode(np.array([(9, 90, 1), (8, 80, 4), (7, 70, 5)]))),
                      (12, chunks.encode(np.array([(7, 70)])), None)],  # removed later
                  3: []}
    rows = cql.wiped_rows(wipes, partitions)
    assert rows == [(2, 9, 90, 1)]
    assert cql.wiped_keys(rows, {}) == [(2, 9, 90)]


def test_a_wipe_leaves_a_row_another_authors_claim_owns() -> None:
    rows = [(2, 9, 90, 1), (2, 7, 70, 1), (2, 6, 60, 1), (2, 5, 50, 1)]
    # 90: author 4 owns the id at the row's time; 70: author 4's claim is at another
    # time (the row is author 1's); 60: author 1's own; 50: no stored row.
    stored = {90: (9, 4), 70: (3, 4), 60: (6, 1)}
    assert cql.wiped_keys(rows, stored) == [(2, 7, 70), (2, 6, 60), (2, 5, 50)]


def test_graph_and_profile_ops() -> None:
    plan = _plan(*pack(1, {}, edges={2: (True, 5), 3: (False, 6)}),
                 *pack(9, {}, starred={2: True}), Delta.celebrity(9, False),
                 Delta.profile(4, 5, "h", "n"),
                 Delta.profile(5, 2, "old", "o"))
    ops = cql.graph_ops(plan, 8) + cql.user_ops(plan.users, {4: 5, 5: 3}, 8)
    _check_markers(ops)
    assert ops == [("follow_on", (2, 1, 5, 8)), ("follow_off", (8, 3, 1)),
                   ("celeb_edge_on", (2, 9, 8)),
                   ("relation_on", (2, cql.CELEBRITY_ROW, 9, 0, 8)), ("celeb_off", (8, 9)),
                   ("user_set", (4, "h", "n", 5, 8))]


def test_repost_ops_write_the_last_state_of_each_repost() -> None:
    plan = _plan(Delta.repost(20, 2, 9, (10, 1), True),
                 Delta.repost(21, 2, 8, (11, 1), True),
                 Delta.repost(21, 2, 8, (11, 1), False))  # shown, then hidden: hidden
    ops = cql.repost_ops(plan.reposts, {}, 50)
    _check_markers(ops)
    assert ops == [("repost_set", (20, 2, 9, False, 10, 1, 50)), ("author_add", (2, 9, 20, 50)),
                   ("repost_add", (10, 9, 20, 2, 50)),
                   ("repost_set", (21, 2, 8, True, 11, 1, 50)), ("author_del", (50, 2, 8, 21)),
                   ("repost_del", (50, 11, 8, 21))]


def test_repost_moves_delete_the_rows_at_the_stored_key() -> None:
    """A copy with a smaller (created_at, original) replaces the stored one (DESIGN §4b)."""
    plan = _plan(Delta.repost(20, 2, 5, (10, 1), True),   # stored at 7: earlier now
                 Delta.repost(21, 2, 6, (10, 1), True),   # stored at 6 of 11: another original
                 Delta.repost(22, 2, 4, (10, 1), False),  # stored at 5, hidden at 4
                 Delta.repost(23, 2, 3, (10, 1), True),   # unchanged
                 Delta.repost(24, 2, 3, (10, 1), True),   # first written now
                 Delta.repost(25, 2, 3, (10, 1), True))   # a forged delete's row, no time
    states = {20: cql.TweetState(7, False, 2, 10), 21: cql.TweetState(6, False, 2, 11),
              22: cql.TweetState(5, False, 2, 10), 23: cql.TweetState(3, False, 2, 10),
              25: cql.TweetState(None, True, 3)}
    ops = cql.repost_moves(plan.reposts, states, 50)
    _check_markers(ops)
    assert ops == [("author_del", (50, 2, 7, 20)), ("repost_del", (50, 10, 7, 20)),
                   ("repost_del", (50, 11, 6, 21)),
                   ("author_del", (50, 2, 5, 22)), ("repost_del", (50, 10, 5, 22))]
    assert cql.moved_originals(ops) == {10, 11}


def test_a_block_is_written_into_both_users_partitions() -> None:
    plan = _plan(Delta.relation(1, 2, "block", True, 5), Delta.relation(1, 3, "mute", True, 6),
                 Delta.relation(4, 1, "block", False, 7))
    ops = cql.relation_ops(plan.relations.values(), 9)
    _check_markers(ops)
    assert ops == [("relation_on", (1, "block", 2, 5, 9)),
                   ("relation_on", (2, "blocked_by", 1, 5, 9)),
                   ("relation_on", (1, "mute", 3, 6, 9)),
                   ("relation_off", (9, 4, "block", 1)), ("relation_off", (9, 1, "blocked_by", 4))]
    with pytest.raises(StoreError, match="unknown relation 'follow'"):
        cql.relation_ops([RelationRow(1, 2, "follow", True, 5)], 9)


def test_a_deleted_account_gets_no_profile_written() -> None:
    plan = _plan(Delta.profile(4, 5, "h", "n"), Delta.account_deleted(4, 6),
                 Delta.profile(5, 5, "h5", "n5"), Delta.profile(6, 7, "h6", "n6"))
    stored, gone = cql.stored_users({5: [(3, True)], 6: [(None, None)], 7: []})
    assert (stored, gone) == ({5: 3}, {5})
    ops = cql.user_ops(plan.users, stored, 8, plan.deleted_users, gone)
    _check_markers(ops)
    assert ops == [("user_gone", (8, 4)), ("user_set", (6, "h6", "n6", 7, 8))]


def test_adds_at_or_below_the_horizon_are_dropped() -> None:
    plan = _plan(Delta.timeline_add(2, 10, 1, 5), Delta.timeline_add(2, 11, 1, 3),
                 Delta.timeline_add(3, 12, 1, 1), Delta.timeline_add(3, 12, 1, 1),
                 *pack(0, {}, horizons={2: (3, 11)}))
    meta = {u: cql.Meta() for u in cql.meta_users(plan)}
    kept = cql.kept_adds(plan, meta)
    assert kept.tolist() == [[2, 5, 10, 1], [3, 1, 12, 1]]  # the copy of (3, 1, 12) once
    assert meta[2].horizon == (3, 11)
    ops = cql.add_ops(kept, 40 + cql.ADD, meta)
    _check_markers(ops)
    assert ops == [("home_adds", (2, 40, chunks.encode(np.array([(5, 10, 1)])), 40 + cql.ADD)),
                   ("home_adds", (3, 40, chunks.encode(np.array([(1, 12, 1)])), 40 + cql.ADD))]
    assert meta[2].chunks == meta[3].chunks == 1


def test_blind_users_are_those_a_batch_only_adds_to_and_whose_turn_it_is_not() -> None:
    users = range(1, 401)
    plan = _plan(*(Delta.timeline_add(u, 1000 + u, 7, 5) for u in users),
                 Delta.timeline_remove(5, 1005, 7, 5), Delta.timeline_add(8, 2000, 7, 6),
                 Delta.timeline_add(8, 2001, 7, 7), Delta.timeline_add(8, 2002, 7, 8),
                 *pack(0, {}, horizons={7: (3, 11)}))
    plan.read(6, 9)
    ts = 1_796_564_607_871_166
    turn = cql.due(np.array(users), ts, 8)
    assert 0.05 < turn.mean() < 0.25  # about one user in 8
    assert (cql.due(np.array(users), ts, 8) == turn).all()  # the batch again: the same
    assert (cql.due(np.array(users), ts + cql.STRIDE, 8) != turn).any()  # the next: others
    blind = cql.blind_users(plan, ts, 8, limit=2)
    # Kept up: a remove (5), a read (6), a horizon (7), past the limit (8), their turn.
    assert blind == {u for u, due in zip(users, turn, strict=True) if not due} - {5, 6, 7, 8}
    assert not blind & set(cql.meta_users(plan, blind))
    assert set(cql.meta_users(plan, blind)) | blind == set(users)
    assert cql.blind_users(plan, ts, 1, limit=2) == set()  # upkeep 1: every user kept up


def test_a_catching_up_batch_keeps_its_users_up() -> None:
    """The store's limit: a user's adds in a blind batch are at most the slack over upkeep
    (here 200 // 8), so a catch-up's hundreds a user keep its meta, trims and merges."""
    store = CassandraStore(parse_url("cassandra://h/ks"), cap=800)  # not connected
    plan = _plan(*(Delta.timeline_add(1, 100 + i, 7, i) for i in range(26)),
                 *(Delta.timeline_add(2, 200 + i, 7, i) for i in range(25)))
    ts = next(t for t in range(0, 4000, cql.STRIDE) if not cql.due(np.array([1, 2]), t, 8).any())
    assert (store.trim_slack, store.upkeep) == (200, 8)
    assert store.blind(plan, ts) == {2}


def test_a_dormant_user_kept_up_loses_what_blind_batches_stored() -> None:
    plan = _plan(Delta.timeline_add(1, 10, 7, 5), Delta.timeline_add(2, 11, 7, 5),
                 Delta.timeline_add(3, 12, 7, 5))
    meta = {1: cql.Meta(), 2: cql.Meta(horizon=DORMANT)}  # 3: blind
    assert cql.dormant_added(plan.adds, meta) == [2]
    assert cql.kept_adds(plan, meta).tolist() == [[1, 5, 10, 7], [3, 5, 12, 7]]


def test_a_blind_batch_writes_one_row_and_a_kept_up_one_counts_the_rows_it_missed(
        keyspace: str, session: Any) -> None:
    """Adds only: a user's ``home_chunks`` row and no ``timeline_meta`` until its turn,
    which counts the blind rows, so the rows are merged about every CHUNKS_MAX; the
    cache above the horizon stays exact throughout. The cap is above the 300 batches, so
    no merge cuts: how often the user's turn comes is the clock's draw (:func:`cql.due`),
    and a cap under the entries a late second merge finds would cut it to the cap."""
    store = writing(RecordingStore, _with(keyspace, "upkeep=4"), cap=400)
    store.executed = []
    store.open()
    u, a = 10**9 + 40, 10**9 + 41
    try:
        store.apply([*pack(0, {}, horizons={u: (3, 10**9 + 100)})], 1)  # kept up: the horizon
        expected: list[Entry] = []
        blind = turns = merges = since = 0
        for i in range(300):
            t = 10**9 + 200 + i
            below = Delta.timeline_add(u, 10**9 + 600 + i, a, 1)  # under the horizon
            store.executed = []
            store.apply([Delta.tweet(t, a, 10 + i, "x"), Delta.timeline_add(u, t, a, 10 + i),
                         below], 2 + i)
            expected.insert(0, Entry(10 + i, t, a))
            ts = dict(store.executed)["clock_set"][0]
            names = {n for n, _ in store.executed}
            since += 1
            if cql.due(np.array([u]), ts, 4)[0]:
                turns += 1
                assert "meta_set" in names
            else:
                blind += 1
                assert not {"meta_get", "meta_get_in", "meta_set", "home_merge"} & names
            rows = session.execute("SELECT count(*) FROM home_chunks WHERE user_id = %s",
                                   (u,)).one()[0]
            if "home_merge" in names:
                merges += 1
                assert rows == 1 and since >= cql.CHUNKS_MAX // 4, since  # 8 turns at least
                since = 0
            assert rows == since + 1 or merges == 0 and rows == since
            assert store.cached(u, None, 400) == expected
            assert store.horizon(u) == (3, 10**9 + 100)
            if merges >= 2:
                break
        assert merges >= 2 and blind > 0 and turns > 0
    finally:
        store.close()


def test_a_users_adds_beyond_the_cap_in_one_batch_raise_the_horizon() -> None:
    adds = np.array([(2, 1, 10, 1), (2, 2, 20, 1), (2, 3, 30, 1), (2, 4, 40, 1), (3, 1, 10, 1),
                     (4, 5, 50, 1), (4, 5, 50, 2), (4, 6, 60, 1)])
    meta = {2: cql.Meta(), 3: cql.Meta(), 4: cql.Meta((6, 1), 0)}
    kept = cql.capped_adds(adds, meta, 2)
    # Two claims of one key straddle user 4's cut: both go, the horizon is at that key.
    assert kept.tolist() == [[2, 3, 30, 1], [2, 4, 40, 1], [3, 1, 10, 1], [4, 6, 60, 1]]
    assert (meta[2].horizon, meta[3].horizon, meta[4].horizon) == ((2, 20), cql.NO_HORIZON,
                                                                  (6, 1))
    assert cql.capped_adds(adds, meta, 8) is adds


def test_trimming_is_amortized_by_the_size_estimate() -> None:
    meta = {2: cql.Meta((1, 1), 3), 3: cql.Meta(size=0)}
    adds = np.array([(2, 9, 90, 1), (2, 8, 80, 1), (3, 7, 70, 1)])
    assert cql.over_cap(adds, meta, cap=3, slack=1) == [2]
    cut = cql.trim(meta[2], [(9, 90), (8, 80), (5, 50), (4, 40), (1, 1)], 3)
    assert cut == (4, 40) and meta[2] == cql.Meta((4, 40), 3)
    assert cql.trim(meta[3], [(7, 70)], 3) is None and meta[3].size == 1
    # The merge folds the user's rows up to the batch into the batch's row, cut there.
    meta[2] = cql.Meta((1, 1), 5, chunks=3)
    rows = [(4, None, chunks.encode(np.array([(9, 90, 1), (5, 50, 1), (1, 1, 1)]))),
            (8, chunks.encode(np.array([(5, 50)])), chunks.encode(np.array([(8, 80, 1),
                                                                          (4, 40, 1)])))]
    merge = cql.merge_op(2, rows, meta[2], 2, 8 + cql.TRIM)
    assert merge == ("home_merge", (8 + cql.TRIM, 2, 8, 2, 8,
                                    chunks.encode(np.array([(9, 90, 1), (8, 80, 1)]))))
    assert meta[2] == cql.Meta((4, 40), 2, chunks=1)
    ops = [merge, *cql.meta_ops(meta, 12)]
    _check_markers(ops)
    assert ops[1:] == [("meta_set", (2, 4, 40, 2, -1, 1, 12)),
                       ("meta_set", (3, -1, -1, 1, -1, 0, 12))]
    # A timeline of many rows is merged, however few its entries.
    many = {4: cql.Meta(size=1, chunks=cql.CHUNKS_MAX), 5: cql.Meta(chunks=cql.CHUNKS_MAX + 1)}
    assert cql.over_cap(np.zeros((0, 4), np.int64), many, cap=3, slack=1) == [5]
    assert cql.decode_meta([]) == cql.Meta()
    assert cql.decode_meta([(5, 6, 7, None, None)]) == cql.Meta((5, 6), 7)  # before step 003
    assert cql.decode_meta([(5, 6, 7, 9, 3)]) == cql.Meta((5, 6), 7, 9, 3)


def test_inactive_users_go_dormant_and_come_back() -> None:
    plan = _plan(Delta.activity(2, 50), Delta.activity(2, 40), Delta.activity(3, 5),
                 Delta.timeline_add(3, 30, 1, 20), Delta.timeline_add(3, 31, 1, 21),
                 Delta.timeline_add(4, 32, 1, 99), Delta.timeline_add(5, 33, 1, 99))
    assert cql.meta_users(plan) == [2, 3, 4, 5]
    meta = {2: cql.Meta(DORMANT, 0, 10), 3: cql.Meta((1, 1), 4, 1), 4: cql.Meta(),
            5: cql.Meta(DORMANT, 0, 2)}
    assert cql.record_reads(plan.activity, meta) == [2]  # dormant, and read
    assert (meta[2].read_at, meta[3].read_at) == (50, 5)
    entries = [Entry(9, 90, 7), Entry(8, 80, 6), Entry(7, 70, 7)]
    assert cql.regenerated(2, entries, meta[2], 2) == [(2, 9, 90, 7), (2, 8, 80, 6)]
    assert meta[2] == cql.Meta((7, 70), 2, 50)  # below the cap's entries: the query
    assert cql.regenerated(2, entries[:1], meta[2], 2) == [(2, 9, 90, 7)]
    assert meta[2] == cql.Meta(cql.NO_HORIZON, 1, 50)
    # 20 - 5 > 10: user 3 goes dormant; 4 never read; 5 is dormant already.
    assert cql.go_dormant(plan.adds, meta, 10) == [3]
    assert meta[3] == cql.Meta(DORMANT, 0, 5)
    assert cql.kept_adds(plan, meta).tolist() == [[4, 99, 32, 1]]
    assert cql.go_dormant(plan.adds, {u: cql.Meta(read_at=0) for u in (3, 4, 5)}, 0) == []
    ops = cql.drop_ops([3], 12) + cql.meta_ops({3: meta[3]}, 12)
    _check_markers(ops)
    assert ops == [("home_drop", (12, 3)), ("meta_set", (3, BIG, BIG, 0, 5, 0, 12))]


def test_bookkeeping_ops() -> None:
    plan = _plan(Delta.source_offset("tweets", 1, 41),
                 Delta.source_offset("tweets", 1, 40),
                 Delta.dead_letter("users", 0, 3, "bad", b"x"))
    ops = cql.offset_ops(plan.offsets) + cql.dead_ops(plan.dead, 99) + cql.BatchRecord(
        12_345, 1000, "d", 99, 3, 0.5, 7).ops() + [cql.clock_op(1000)]
    _check_markers(ops)
    assert ops[:2] == [("offset_set", ("tweets", 1, 41, 41)),
                       ("dead_add", ("users", 0, 3, "bad", b"x", 99, cql.first_seen_ts(99)))]
    assert ops[2] == ("batch_set", (1, 12_345, 1000, "d", 99, 3, 0.5, 7, 1000 + cql.TRIM))
    assert ops[3:] == [("last_batch_set", (1000 + cql.TRIM, 12_345)), ("clock_set", (1000, 1000))]
    assert cql.offset_ops({("t", 0): -1}) == []
    assert cql.dead_partition_ops(plan.dead + plan.dead) == [("dead_part_add", ("users", 0))]
    _check_markers(cql.dead_partition_ops(plan.dead))


def test_a_dead_letter_keeps_its_first_sighting_whatever_order_the_writes_land_in(
        cassandra_hosts: str) -> None:
    assert cql.first_seen_ts(1_000) > cql.first_seen_ts(1_001) > 0
    assert cql.first_seen_ts(int(time.time() * 1000)) < time.time() * 1e6  # in the past
    assert cql.first_seen_ts(3_534_000_000_000) > 0  # 2081-12-26
    with fresh_keyspace(cassandra_hosts) as url, writing_store(url).open() as store:
        for seen_ms, reason in ((2_000, "second"), (1_000, "first"), (3_000, "third")):
            store._run(cql.dead_ops([DeadRow("users", 0, 7, reason, b"x")], seen_ms))
        [letter] = store.dead_letters()
        assert (letter.reason, letter.seen_at) == ("first", 1_000)


def test_batch_timestamps() -> None:
    digest = cql.offsets_digest({("tweets", 0): 5, ("follows", 1): 2})
    assert digest == cql.offsets_digest({("follows", 1): 2, ("tweets", 0): 5})
    assert cql.offsets_digest({}) == ""
    assert cql.batch_timestamp(100, 50, (30, digest), digest) == 30  # a replay: same cells
    assert cql.batch_timestamp(100, 50, (30, "other"), digest) == 100  # new input: new time
    assert cql.batch_timestamp(100, 50, (30, ""), "") == 100  # no offsets: never reused
    assert cql.batch_timestamp(100, 500, None, digest) == 500  # a clock behind the floor


def test_writes_go_in_batches_per_partition_then_per_replica_set() -> None:
    ops = [("home_adds", (1, 5, b"", 7)), ("tweet_state", (50,)), ("home_adds", (2, 5, b"", 7)),
           ("home_drop", (7, 1)), ("meta_set", (1, -1, -1, 2, 9)), ("dead_add", ("t",)),
           ("celeb_on", (3, 7)), ("celeb_off", (7, 4))]
    # A partition's writes together, then small partitions of one table packed (one
    # replica set: no token map), reads and unlisted writes (dead letters) alone.
    assert cql.units(ops) == [[0, 3, 2], [1], [4], [5], [6, 7]]
    def parity(user: int | None) -> int | None:  # two replica sets; None: a constant key
        return None if user is None else user % 2

    assert cql.units(ops, parity) == [[0, 3], [1], [2], [4], [5], [6, 7]]
    many = [("home_adds", (1, i, b"", 7)) for i in range(cql.BATCH_MAX + 1)]
    many += [("home_adds", (u, 1, b"", 7)) for u in range(2, 2 + cql.PACK_MAX + 1)]
    assert [len(g) for g in cql.units(many)] == [cql.BATCH_MAX, cql.PACK_MAX, 2]
    packed = cql.units(many, parity)
    half = (cql.PACK_MAX + 2) // 2
    assert sorted(len(g) for g in packed) == [half, half, cql.BATCH_MAX]  # odd users, even users
    assert sorted(i for g in packed for i in g) == list(range(len(many)))
    # Sizes bound a pack too: the node warns of every batch over several partitions past
    # 5 KiB and refuses one past 50 KiB.
    blobs = [("home_adds", (u, 1, b"x" * n, 7)) for u, n in enumerate((2800, 1000, 2000, 5000))]
    assert [cql.data_size(params) for _, params in blobs] == [2936, 1136, 2136, 5136]
    assert cql.units(blobs) == [[0, 1], [2], [3]]
    texts = [("user_set", (u, "h" * n, "ü" * n, 1, 7)) for u, n in enumerate((1000, 400, 300))]
    assert cql.data_size(texts[0][1]) == 48 + 5 * 16 + 3 * 8 + 1000 + 2000
    assert cql.units(texts) == [[0], [1, 2]]
    # Every batched statement binds its partition key where PARTITION_KEY says it does.
    keys = {"home_chunks": "user_id", "timeline_meta": "user_id", "author_tweets": "author_id",
            "follows": "follower_id", "celebrity_follows": "user_id", "celebrities": "bucket",
            "reposts_by_original": "original_id", "relations": "user_id", "tweets": "tweet_id",
            "users": "user_id"}
    for name, (table, arg) in cql.PARTITION_KEY.items():
        assert f" {table} " in cql.STATEMENTS[name] and " IF " not in cql.STATEMENTS[name]
        assert arg is None or _bound_columns(cql.STATEMENTS[name])[arg] == keys[table], name


def test_lookups_read_many_keys_per_request() -> None:
    keys = list(range(cql.IN_MAX + 1))
    queries = {"meta_get": keys, "relations_get": [7, 8], "tweet_state": []}
    ops = cql.lookup_ops(queries)
    assert ops == [("meta_get_in", (keys[:cql.IN_MAX],)), ("meta_get_in", ([cql.IN_MAX],)),
                   ("relations_get", (7,)), ("relations_get", (8,))]
    results = [[(3, -1, -1, 2)], [], [(5, 6, 7), (4, 6, 9)], []]
    found = cql.lookup_rows(queries, results)
    assert found["meta_get"][3] == [(-1, -1, 2)] and found["meta_get"][cql.IN_MAX] == []
    assert found["relations_get"] == {7: [(5, 6, 7), (4, 6, 9)], 8: []}
    assert found["tweet_state"] == {}
    for one, many in cql.LOOKUP_IN.items():  # the same columns, the key first
        columns, text = cql.STATEMENTS[one].split(" FROM ")[0], cql.STATEMENTS[many]
        key = text.split("WHERE ")[1].split(" IN")[0]
        assert text.startswith(columns.replace("SELECT ", f"SELECT {key}, "))


def test_packed_batches_stay_under_the_nodes_batch_size_warning(cassandra_hosts: str) -> None:
    """The rows the writer packs, at sizes that fill packs: timeline rows of up to 170
    entries, tweets of up to 280 four-byte characters, profiles, metas, edges. The node
    answers no batch with a warning of its size (it logs each one past 5 KiB, where it
    logs that a batch covers several partitions once a minute)."""
    rng = np.random.default_rng(5)
    ts, base = 10**15, 7 * 10**12
    ops: list[cql.Op] = []
    for i in range(150):
        u, n = base + i, int(rng.integers(1, 1 + MAX_TEXT))
        ops += [("home_adds", (u, ts, b"\1" * 24 * int(rng.integers(1, 171)), ts + 1)),
                ("meta_set", (u, 2**40, 2**40, 1000, 2**40, 32, ts + 2)),
                ("tweet_live", (u, base, 2**40, "\N{GRINNING FACE}" * n, 0, 1, 0, ts)),
                ("user_set", (u, "h" * 15, "\N{GRINNING FACE}" * 50, 2**40, ts)),
                ("author_add", (u, 2**40, u, ts)),
                ("relation_on", (u, "block", u + 1, 2**40, ts))]
    with fresh_keyspace(cassandra_hosts) as url:
        store = writing_store(url).open()
        try:
            session = store._require()  # noqa: SLF001
            groups = cql.units(ops, store._replica)  # noqa: SLF001
            assert max(len(g) for g in groups) == cql.PACK_MAX  # packs were made
            built = requests(groups, ops, store._statements,  # noqa: SLF001
                             session.cluster.protocol_version)
            warned = []
            for (statement, params), group in zip(built, groups, strict=True):
                future = session.execute_async(statement, params)
                future.result()
                warned += [(ops[group[0]][0], len(group), w) for w in future.warnings or ()
                           if w.startswith("Batch for")]  # not "Unlogged batch covering"
            assert not warned
        finally:
            store.close()


def _bound_columns(text: str) -> list[str]:
    """The column each bind marker of a statement sets or selects on."""
    if text.startswith("INSERT"):
        columns = text.split("(")[1].split(")")[0].split(", ")
        return columns + ["timestamp"] * text.count("TIMESTAMP ?")
    return [name or "timestamp" for name in re.findall(r"(\w+) = \?|TIMESTAMP \?", text)]


def test_batch_log_partitions() -> None:
    assert cql.batch_bucket(cql.BATCH_BUCKET * 3 + 5) == 3
    assert cql.batch_buckets(cql.BATCH_BUCKET * 3 + 5, 100) == [3, 2]
    assert cql.batch_buckets(5, 100) == [0]


# -- the schema step ---------------------------------------------------------------------------

def test_schema_steps_are_numbered_and_idempotent() -> None:
    steps = load_steps()
    assert [s.label for s in steps][:2] == ["001_tables", "002_timeline_kinds"]
    rerunnable = re.compile(r"CREATE TABLE IF NOT EXISTS \w+ \(|ALTER TABLE \w+ ADD IF NOT EXISTS ")
    for step in steps:
        for statement in step.statements:
            assert rerunnable.match(statement), (step.label, statement)
    assert pending(steps, {1: "tables"}) == steps[1:]


def test_split_cql_drops_comments() -> None:
    text = "-- a comment; with a semicolon\nCREATE TABLE a (x int PRIMARY KEY); -- tail\n\n" \
           "CREATE TABLE b (\n  y int PRIMARY KEY\n);\n"
    assert split_cql(text) == ["CREATE TABLE a (x int PRIMARY KEY)",
                               "CREATE TABLE b ( y int PRIMARY KEY )"]


@pytest.mark.parametrize("names", [["1_x.cql"], ["001_X.cql"], ["001_a.cql", "001_b.cql"],
                                   ["000_zero.cql"]])
def test_misnamed_schema_files_are_refused(tmp_path: Path, names: list[str]) -> None:
    for name in names:
        (tmp_path / name).write_text("CREATE TABLE IF NOT EXISTS t (k int PRIMARY KEY);")
    with pytest.raises(SchemaError):
        load_steps(tmp_path)


def test_keyspace_ddl_takes_validated_names_only() -> None:
    assert keyspace_cql("fanout", Replication.per_dc("dc1:3").cql_map()) == (
        "CREATE KEYSPACE IF NOT EXISTS fanout WITH replication = "
        "{'class': 'NetworkTopologyStrategy', 'dc1': 3} AND durable_writes = true")
    with pytest.raises(SchemaError):
        keyspace_cql("x; DROP KEYSPACE y", "{}")


def test_apply_records_steps_once_and_check_sees_them(cassandra_hosts: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    url = keyspace_url(cassandra_hosts, new_keyspace_name())
    config = parse_url(url)
    cluster, session = connect(config, wait=60)
    try:
        with pytest.raises(SchemaError, match="does not exist"):
            require_current(session, config.keyspace)
        extra = Step(99, "extra", ("CREATE TABLE IF NOT EXISTS extra (k int PRIMARY KEY)",))
        replication = config.replication.cql_map()
        with caplog.at_level(logging.WARNING, logger="cassandra"):
            assert [s.label for s in apply_schema(session, config.keyspace, replication,
                                                  load_steps())] == [
                "001_tables", "002_timeline_kinds", "003_inactive_users", "004_page_changes",
                "005_repost_changes", "006_dead_letter_partitions", "007_page_changes_by_shard",
                "008_home_chunks", "009_tweet_refs"]
        # The data steps prepare their statements qualified: no "USE <keyspace> with
        # prepared statements" warning from the node, nor any other of this keyspace's.
        assert not [m for r in caplog.records
                    if "Server warning" in (m := r.getMessage()) and config.keyspace in m]
        require_current(session, config.keyspace)
        assert [s.label for s in apply_schema(session, config.keyspace, replication,
                                              [*load_steps(), extra])] == ["099_extra"]
        assert apply_schema(session, config.keyspace, replication, [*load_steps(), extra]) == []
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {config.keyspace}", timeout=120)
        cluster.shutdown()


def test_open_requires_the_schema_unless_auto(cassandra_hosts: str) -> None:
    with fresh_keyspace(cassandra_hosts, schema=False) as url:
        with pytest.raises(SchemaError, match="fanout schema apply"):
            CassandraStore.from_url(url).open()
        CassandraStore.from_url(f"{url}{'&' if '?' in url else '?'}schema=auto").open().close()
        CassandraStore.from_url(url).open().close()


def test_the_schema_command_is_wired(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["schema", "apply", "--store", f"sqlite:///{tmp_path}/s.db"])
    assert args.func(args) == 0
    assert (tmp_path / "s.db").exists()
    args = _parser().parse_args(["schema", "status", "--store", f"sqlite:///{tmp_path}/s.db"])
    assert args.func(args) == 0
    args = _parser().parse_args(["schema", "apply", "--store", "cassandra://h/bad-ks-"])
    assert args.func(args) == 2
    assert "needs a keyspace" in capsys.readouterr().out


# -- a batch's phases, on the real node ------------------------------------------------------

class RecordingStore(CassandraStore):
    """The real store, noting the name of every statement it runs, in order."""

    executed: list[tuple[str, tuple[Any, ...]]]

    def _run(self, ops: list[cql.Op], profile: object = WRITE_PROFILE) -> list[Any]:
        self.executed += ops
        return super()._run(ops, profile)

    def _rows(self, name: str, params: tuple[Any, ...] = (), **kwargs: Any) -> Any:
        self.executed.append((name, params))
        return super()._rows(name, params, **kwargs)


def _with(url: str, options: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{options}"


def test_a_batch_writes_in_phase_order(keyspace: str, session: Any) -> None:
    store = writing(RecordingStore, _with(keyspace, "trim_slack=0&upkeep=1"), cap=1)
    store.executed = []
    store.open()
    u, w, a, t1, t2 = 10**9 + 2, 10**9 + 3, 10**9 + 1, 10**9 + 10, 10**9 + 11
    try:
        # An entry before: the batch below takes the timeline past the cap, so it merges.
        store.apply([Delta.tweet(t1 - 1, a, 4, "z"), Delta.timeline_add(u, t1 - 1, a, 4)], 6)
        store.executed = []
        store.apply([Delta.tweet(t1, a, 5, "a"),
                     Delta.timeline_add(u, t1, a, 5), Delta.timeline_add(u, t2, a, 6),
                     *pack(a, {}, wipes=[w]),
                     Delta.repost(t2 + 1, a, 4, (t1, a), True),
                     Delta.relation(u, w, "mute", True, 3), Delta.account_deleted(w, 3),
                     Delta.source_offset("phases", 0, 4)], 7)
        names = [name for name, _ in store.executed]
        first = {n: names.index(n) for n in reversed(names)}
        last = {n: i for i, n in enumerate(names)}
        assert last["clock_set"] < first["tweet_live"]
        assert first["home_get_in"] < first["tweet_live"]
        assert last["tweet_live"] < first["home_adds"]
        assert last["home_adds"] < last["home_get_in"] < first["home_merge"] < first["offset_set"]
        assert first["offset_set"] < first["batch_set"]
        stamps = dict(store.executed)
        base = stamps["clock_set"][0]
        assert stamps["tweet_live"][-1] == base + cql.REMOVE
        assert stamps["repost_add"][-1] == stamps["relation_on"][-1] == base + cql.REMOVE
        assert stamps["user_gone"][0] == base + cql.REMOVE
        assert first["home_get_in"] < first["repost_set"] < first["home_adds"]
        assert stamps["home_adds"][-1] == base + cql.ADD
        assert stamps["home_merge"][0] == base + cql.TRIM
        # What the node stored carries those timestamps.
        assert session.execute("SELECT writetime(body) FROM tweets WHERE tweet_id = %s",
                               (t1,)).one()[0] == base + cql.REMOVE
        assert session.execute("SELECT batch_ts, writetime(adds) FROM home_chunks "
                               "WHERE user_id = %s", (u,)).one() == (base, base + cql.TRIM)
        assert session.execute("SELECT writetime(size) FROM timeline_meta WHERE user_id = %s",
                               (u,)).one()[0] == base + cql.TRIM
        assert store.cached(u, None, 5) == [Entry(6, t2, a)]
        # Batches are packed by replica set: the driver's token map names this node.
        assert store._replica is not None and len(store._replica(u)) == 1
        assert store.horizon(u) == (5, t1)
    finally:
        store.close()


def test_big_ids_fit_the_bound_types() -> None:
    plan = _plan(Delta.timeline_add(BIG, BIG - 1, BIG - 2, 2**62))
    _check_markers(cql.add_ops(np.array(list(plan.adds)), 1, {}))
    assert cql.bounded_limit(2**40) == 2**31 - 1 and cql.bounded_limit(0) == 1


# -- reposts, relations and deleted accounts, on the real node ----------------------------------

@pytest.fixture
def store(keyspace: str) -> Iterator[CassandraStore]:
    opened = writing_store(keyspace).open()
    yield opened
    opened.close()


_IDS = iter(range(1, 10**6))


def _ids(n: int) -> list[int]:
    """Ids no other test of this module uses (they share the keyspace)."""
    return [2 * 10**9 + next(_IDS) for _ in range(n)]


def test_a_late_rerun_cannot_hide_a_repost_shown_since(store: CassandraStore) -> None:
    """A repost's hidden state is not final: write timestamps order its states by batch."""
    a, b, orig_author, original, r1, r2 = _ids(6)
    store.apply([Delta.tweet(original, orig_author, 5, "o"),
                 Delta.repost(r1, a, 6, (original, orig_author), True),
                 Delta.repost(r2, b, 7, (original, orig_author), True),
                 Delta.source_offset("reposts", 0, 1)], 1)
    hide = [Delta.repost(r1, a, 6, (original, orig_author), False),
            Delta.source_offset("reposts", 0, 2)]
    store.apply(hide, 2)
    assert store.reposts_of([original]) == {original: [Entry(7, r2, b)]}
    store.apply([Delta.repost(r1, a, 6, (original, orig_author), True),
                 Delta.source_offset("reposts", 0, 3)], 3)
    store.apply(hide, 2)  # batch 2 again (its recorded timestamp), as after a crash
    assert store.reposts_of([original]) == {original: [Entry(7, r2, b), Entry(6, r1, a)]}
    assert store.author_tweets([a], None, 10) == [Entry(6, r1, a)]
    assert store.tweets([r1])[r1] == TweetRow(r1, a, 6, "", False, 0, original, orig_author)


class CutShort(CassandraStore):
    """The real store, dying once in the run that writes reposts' rows: only those land."""

    crash = True

    def _run(self, ops: list[cql.Op], profile: object = WRITE_PROFILE) -> list[Any]:
        if self.crash and any(name == "repost_set" for name, _ in ops):
            self.crash = False
            super()._run([op for op in ops if op[0] == "repost_set"], profile)
            msg = "the process died mid-batch"
            raise StoreError(msg)
        return super()._run(ops, profile)


def test_a_repost_moved_by_a_batch_cut_short_moves_when_it_runs_again(keyspace: str) -> None:
    """The rows at the old key go before the repost's row names the new one: a batch
    applied again after a crash still reads the old key (DESIGN §4b, §4)."""
    a, b, r, o1, o2, rid = _ids(6)
    store = writing(CutShort, keyspace)
    store.open()
    try:
        store.crash = False
        store.apply([Delta.tweet(o1, a, 3, "o1"), Delta.tweet(o2, b, 2, "o2"),
                     Delta.repost(rid, r, 7, (o1, a), True),
                     Delta.source_offset("moves", 0, 1)], 1)
        moved = [Delta.repost(rid, r, 5, (o2, b), True), Delta.source_offset("moves", 0, 2)]
        store.crash = True
        with pytest.raises(StoreError, match="died mid-batch"):
            store.apply(moved, 2)
        assert store.tweets([rid])[rid].created_at == 5  # the new key is stored already
        store.apply(moved, 2)
        assert store.author_tweets([r], None, 10) == [Entry(5, rid, r)]
        assert store.reposts_of([o1, o2]) == {o2: [Entry(5, rid, r)]}
        # A hidden copy at yet another time: the rows at the stored time go too.
        store.apply([Delta.repost(rid, r, 4, (o2, b), False), Delta.source_offset("moves", 0, 3)],
                    3)
        assert store.author_tweets([r], None, 10) == [] and store.reposts_of([o1, o2]) == {}
    finally:
        store.close()


def test_a_forged_delete_in_the_reposts_batch_hides_nothing(store: CassandraStore) -> None:
    """A delete naming a repost id under another user's id, in the repost's batch."""
    a, r, forger, o, rid = _ids(5)
    store.apply([Delta.tweet(o, a, 3, "o"), Delta.repost(rid, r, 0, (o, a), True),
                 Delta.tweet_deleted(rid, forger)])
    assert store.tweets([rid])[rid] == TweetRow(rid, r, 0, "", False, 0, o, a)
    assert store.author_tweets([r], None, 10) == [Entry(0, rid, r)]
    assert store.reposts_of([o]) == {o: [Entry(0, rid, r)]}


def test_a_block_is_stored_in_both_users_partitions(store: CassandraStore,
                                                    session: Any) -> None:
    u, x, y, z = _ids(4)
    store.apply([Delta.relation(u, x, "block", True, 5), Delta.relation(y, u, "block", True, 5),
                 Delta.relation(u, z, "mute", True, 6), Delta.relation(z, u, "block", True, 6),
                 Delta.relation(z, u, "block", False, 7)])  # the last of a key is written
    rows = [row for user in (u, x, z) for row in session.execute(
        "SELECT user_id, relation, other_id, created_at FROM relations WHERE user_id = %s",
        (user,))]
    assert sorted(rows) == sorted([(u, "block", x, 5), (u, "blocked_by", y, 5),
                                   (u, "mute", z, 6), (x, "blocked_by", u, 5)])
    assert store.relations(u) == Relations(frozenset({x, y}), frozenset({z}))
    store.apply([Delta.relation(u, x, "block", False, 8)])
    assert store.relations(x) == Relations() and store.relations(u).blocked == {y}


def test_an_old_keyspace_is_brought_up_to_date(cassandra_hosts: str) -> None:
    """A keyspace made by step 001 alone, with rows: steps 002 and 003 add to it, twice if
    need be."""
    with fresh_keyspace(cassandra_hosts, schema=False) as url:
        config = parse_url(url)
        cluster, session = connect(config, wait=60)
        try:
            old = load_steps()[:1]
            apply_schema(session, config.keyspace, config.replication.cql_map(), old)
            session.execute("INSERT INTO tweets (tweet_id, author_id, created_at, body, deleted) "
                            "VALUES (1, 2, 3, 'old', false)")
            session.execute("INSERT INTO users (user_id, handle, name, created_at) "
                            "VALUES (2, 'h', 'n', 3)")
            session.execute("INSERT INTO timeline_meta (user_id, horizon_created_at, "
                            "horizon_tweet_id, size) VALUES (4, 1, 10, 0)")
            with pytest.raises(SchemaError, match="lacks schema step.*002_timeline_kinds"):
                CassandraStore.from_url(url).open()
            store = writing_store(_with(url, "schema=auto"), inactive_days=1e-6).open()
            try:
                assert store.tweets([1]) == {1: TweetRow(1, 2, 3, "old", False)}
                assert store.users([2]) == {2: UserRow(2, "h", "n", False)}
                assert store.relations(2) == Relations() and store.reposts_of([1]) == {}
                # A row from before step 003 has no read: its user never goes dormant.
                store.apply([Delta.timeline_add(4, 1, 2, 10**9)])
                assert store.horizon(4) == (1, 10) and store.cached(4, None, 5) == [
                    Entry(10**9, 1, 2)]
            finally:
                store.close()
            # Step 002 run again, as after an apply cut short before it was recorded.
            session.execute("DELETE FROM schema_version WHERE version = 2")
            assert [s.label for s in apply_schema(session, config.keyspace,
                                                  config.replication.cql_map())] == [
                "002_timeline_kinds"]
            CassandraStore.from_url(url).open().close()
        finally:
            cluster.shutdown()


@contextmanager
def _upgraded(hosts: str, steps: int, rows: list[tuple[str, tuple[Any, ...]]],
              applied: list[str]) -> Iterator[str]:
    """A keyspace of the first ``steps`` schema steps holding ``rows``, then upgraded.

    The upgrade must apply the steps named ``applied``; yields the keyspace's URL.
    """
    with fresh_keyspace(hosts, schema=False) as url:
        config = parse_url(url)
        cluster, session = connect(config, wait=60)
        try:
            replication = config.replication.cql_map()
            apply_schema(session, config.keyspace, replication, load_steps()[:steps])
            for statement, values in rows:
                session.execute(statement, values)
            assert [s.label for s in apply_schema(session, config.keyspace,
                                                  replication)] == applied
        finally:
            cluster.shutdown()
        yield url


def test_step_4_copies_celebrity_edges_into_the_readers_relations(cassandra_hosts: str) -> None:
    """A keyspace of steps 1-3 with celebrity edges: after step 4, home_start finds them."""
    rows = [("INSERT INTO celebrity_follows (user_id, celebrity_id) VALUES (%s, %s)", edge)
            for edge in ((1, 7), (1, 8), (2, 7))]
    with _upgraded(cassandra_hosts, 3, rows, ["004_page_changes", "005_repost_changes",
                                              "006_dead_letter_partitions",
                                              "007_page_changes_by_shard",
                                              "008_home_chunks", "009_tweet_refs"]) as url:
        with writing_store(url).open() as store:
            assert sorted(store.home_start(1, None, 5).celebrities) == [7, 8]
            assert store.home_start(2, None, 5).celebrities == [7]
            assert store.home_start(3, None, 5).celebrities == []
            assert store.relations(1) == Relations()


def test_step_6_lists_the_partitions_of_stored_dead_letters(cassandra_hosts: str) -> None:
    """Letters stored before step 6 are counted after it; new ones list their partition."""
    rows = [("INSERT INTO dead_letters (topic, kafka_partition, kafka_offset, reason, raw, "
             "seen_at) VALUES (%s, %s, %s, 'bad', 0x00, 1)", letter)
            for letter in (("tweets", 0, 5), ("tweets", 0, 6), ("users", 2, 1))]
    with _upgraded(cassandra_hosts, 5, rows, ["006_dead_letter_partitions",
                                              "007_page_changes_by_shard",
                                              "008_home_chunks", "009_tweet_refs"]) as url:
        with writing_store(url).open() as store:
            assert store.dead_letter_count() == 3
            store.apply([Delta.dead_letter("follows", 3, 9, "bad", b"x")], 1)
            assert store.dead_letter_count() == 4
            assert sorted(store._rows("dead_parts")) == [("follows", 3), ("tweets", 0),
                                                         ("users", 2)]


def test_step_8_copies_each_home_timeline_into_one_row(cassandra_hosts: str) -> None:
    """Timelines kept a row an entry before step 8 read the same after it, then take
    a batch's adds and removes on top."""
    rows = [("INSERT INTO home_timeline (user_id, created_at, tweet_id, author_id) "
             "VALUES (%s, %s, %s, %s)", row)
            for row in ((1, 5, 50, 9), (1, 7, 70, 9), (1, 6, 60, 8), (2, 3, 30, 9))]
    with _upgraded(cassandra_hosts, 7, rows, ["008_home_chunks", "009_tweet_refs"]) as url:
        with writing_store(url).open() as store:
            assert store.cached(1, None, 5) == [Entry(7, 70, 9), Entry(6, 60, 8), Entry(5, 50, 9)]
            assert store.cached(2, None, 5) == [Entry(3, 30, 9)]
            assert store.counts()["home_timeline"] == 4
            store.apply([Delta.timeline_remove(1, 60, 8, 6), Delta.timeline_add(1, 80, 9, 8)], 1)
            assert store.cached(1, None, 5) == [Entry(8, 80, 9), Entry(7, 70, 9), Entry(5, 50, 9)]
            assert store.home_users() == [1, 2]


def test_step_9_reads_older_tweets_as_plain_posts(cassandra_hosts: str) -> None:
    """A tweet stored before step 9 has no kind of record or reference: it reads as a
    plain post's (0, 0); one written after keeps both."""
    rows = [("INSERT INTO tweets (tweet_id, author_id, created_at, body, deleted, reply_to) "
             "VALUES (%s, %s, %s, %s, false, 0)", (1, 2, 3, "old"))]
    with _upgraded(cassandra_hosts, 8, rows, ["009_tweet_refs"]) as url:
        with writing_store(url).open() as store:
            store.apply([Delta.tweet(4, 2, 5, "new", record=14, ref_id=1)], 1)
            assert store.tweets([1, 4]) == {1: TweetRow(1, 2, 3, "old", False),
                                            4: TweetRow(4, 2, 5, "new", False, 0, 0, 0, 14, 1)}


def test_a_keyspace_a_test_gives_back_is_the_next_ones_empty_or_is_dropped(
        cassandra_hosts: str) -> None:
    """The tests' keyspace pool (``tests/support/cassandra.py``): a reused keyspace holds
    no row and no tombstone of the test before (a write at an older timestamp shows), and
    one whose schema a test changed is dropped, not handed on."""
    insert = ("INSERT INTO home_chunks (user_id, batch_ts, adds) "
              "VALUES (1, 2, 0x00) USING TIMESTAMP %s")
    with fresh_keyspace(cassandra_hosts):  # held throughout: not the process's only keyspace
        with fresh_keyspace(cassandra_hosts) as url:
            used = parse_url(url).keyspace
            cluster, session = connect(parse_url(url), wait=60)
            try:
                session.set_keyspace(used)
                session.execute("INSERT INTO users (user_id, handle) VALUES (7, 'x')")
                session.execute("DELETE FROM home_chunks USING TIMESTAMP 1000 WHERE user_id = 1")
            finally:
                cluster.shutdown()
        with fresh_keyspace(cassandra_hosts) as url:
            config = parse_url(url)
            assert config.keyspace == used
            cluster, session = connect(config, wait=60)
            try:
                session.set_keyspace(used)
                require_current(session, used)
                assert list(session.execute("SELECT * FROM users")) == []
                session.execute(insert, (10,))  # older than the tombstone of the test before
                assert len(list(session.execute("SELECT * FROM home_chunks"))) == 1
                session.execute("CREATE TABLE IF NOT EXISTS extra (k int PRIMARY KEY)")
            finally:
                cluster.shutdown()
        with fresh_keyspace(cassandra_hosts) as url:
            assert parse_url(url).keyspace != used
            cluster, session = connect(parse_url(url), wait=60)
            try:
                assert session.execute("SELECT keyspace_name FROM system_schema.keyspaces "
                                       "WHERE keyspace_name = %s", (used,)).one() is None
            finally:
                cluster.shutdown()
