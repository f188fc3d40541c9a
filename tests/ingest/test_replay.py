"""Replay and the changelog producer: accounting, pacing, errors, and one real broker run."""

from __future__ import annotations

import argparse
import socket
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import replace

import pytest
from confluent_kafka import Consumer, TopicPartition

from ingest import cli, generator, history
from ingest.errors import BrokerUnavailable
from ingest.events import (
    TOPICS,
    AccountDelete,
    Activity,
    Event,
    Follow,
    Post,
    Relation,
    Repost,
    UserUpsert,
    decode,
    encode,
)
from ingest.history import ReadReport, iter_events, merge_by_time
from ingest.producer import ChangelogProducer, Position, ProducerStats
from ingest.replay import DryRunProducer, replay
from ingest.settings import KafkaSettings
from ingest.social import SOCIAL
from ingest.topics import TopicLayoutError
from tests.support.history import EVERY_KIND, RECORDS_CSV, jsonl
from tests.support.world import World

T = 1_704_067_200_000


# -- Java's murmur2 partitioner, the reference for co-partitioning --------------------


def java_murmur2(data: bytes) -> int:
    """org.apache.kafka.common.utils.Utils.murmur2, as an unsigned 32-bit value."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    tail = len(data) & ~3
    for i in range(0, tail, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        h = ((h * m) & mask) ^ ((k * m) & mask)
    rest = len(data) - tail
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h = ((h ^ data[tail]) * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    return h ^ (h >> 15)


def java_partition(key: bytes, partitions: int) -> int:
    return (java_murmur2(key) & 0x7FFFFFFF) % partitions


@pytest.mark.parametrize("text,expected", [  # Kafka's own UtilsTest vectors
    ("21", -973932308), ("foobar", -790332482), ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829), ("abc", 479470107),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971)])
def test_reference_murmur2_matches_java(text, expected):
    assert java_murmur2(text.encode()) == expected & 0xFFFFFFFF


# -- no broker needed -------------------------------------------------------------------


class FailingSink(DryRunProducer):
    """Gives up after ``limit`` sends, as a producer does when the broker is gone."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def send(self, event: Event, on_delivery=None) -> None:
        if self.stats.sent >= self.limit:
            raise BrokerUnavailable("broker 127.0.0.1:1 unreachable")
        super().send(event, on_delivery)


class LosingSink(DryRunProducer):
    """Every delivery fails, as when the broker is gone and records time out."""

    @property
    def stats(self) -> ProducerStats:
        sent = super().stats
        reason = "Local: Message timed out"
        return ProducerStats(sent.sent, 0, sent.sent, f"follows key=2: {reason}",
                             sent.sent_by_topic, {reason: sent.sent} if sent.sent else {})


def follows_at(*times_ms: int) -> list[Follow]:
    return [Follow(1, i + 2, t) for i, t in enumerate(times_ms)]


def test_replay_as_fast_as_possible_accounts_for_everything():
    made = generator.generate(100, 500, 300, seed=2, mix=SOCIAL)
    report = ReadReport(invalid=3)
    report.skip("self-loop", "x:1")
    summary = replay(made.events(), DryRunProducer(), progress=False, report=report)
    counts = made.counts()
    assert summary.sent_by_topic == {
        "users": counts["users"] + counts["account_deletes"],
        "follows": sum(counts[k] for k in ("follows", "unfollows", "blocks", "unblocks",
                                           "mutes", "unmutes")),
        "tweets": sum(counts[k] for k in ("posts", "replies", "deletes", "reposts",
                                          "unreposts")),
        "activity": 0}
    assert summary.delivered == summary.events == sum(counts.values())
    assert summary.ok and summary.behind_s is None
    assert (summary.invalid, summary.skipped) == (3, {"self-loop": 1})
    text = summary.render()
    assert "events/s" in text and "invalid lines skipped 3" in text and "self-loop" in text


def test_replay_paces_at_original_spacing_over_speedup():
    # Bounds far apart, so that a starved box cannot fail it: unpaced it takes ~0 s,
    # paced at 1x 20 s.
    events = follows_at(T, T + 10_000, T + 20_000)
    started = time.monotonic()
    summary = replay(events, DryRunProducer(), speedup=100, progress=False)
    elapsed = time.monotonic() - started
    assert 0.19 <= elapsed < 10, "20 s of history at 100x should take about 0.2 s"
    assert summary.events == 3 and summary.behind_s is not None


def test_replay_without_pacing_ignores_gaps():
    started = time.monotonic()
    replay(follows_at(T, T + 3_600_000), DryRunProducer(), progress=False)
    assert time.monotonic() - started < 60, "an hour's gap was waited out"


def test_replay_rejects_a_bad_speedup():
    with pytest.raises(ValueError, match="speedup"):
        replay([], DryRunProducer(), speedup=0)


def test_replay_stops_and_says_so_when_the_producer_gives_up():
    summary = replay(follows_at(*range(T, T + 10)), FailingSink(limit=4), progress=False)
    assert summary.events == 4
    assert not summary.ok
    assert "broker 127.0.0.1:1 unreachable" in (summary.aborted or "")
    assert "ABORTED" in summary.render()


def test_replay_stops_after_too_many_failed_deliveries():
    events = follows_at(*range(T, T + 5_000))
    summary = replay(events, LosingSink(), progress=False, max_failures=100)
    assert summary.events == 1_000, "checked every 1,000 events"
    assert summary.failed == 1_000 and not summary.ok
    assert "more than 100 deliveries failed" in (summary.aborted or "")
    text = summary.render()
    assert "failed (Local: Message timed out): 1,000" in text
    assert "last error: follows key=2" in text
    assert replay(events, LosingSink(), progress=False, max_failures=None).events == 5_000


def test_replay_of_an_empty_stream():
    summary = replay([], DryRunProducer(), progress=False)
    assert summary.events == 0 and summary.ok


def test_producer_constructor_does_no_io():
    producer = ChangelogProducer(KafkaSettings(bootstrap="192.0.2.1:9"))  # TEST-NET: unroutable
    assert producer.stats == ProducerStats()
    assert producer.flush(0.1) == 0


def test_producer_refuses_to_change_the_contract_settings():
    settings = KafkaSettings(bootstrap="127.0.0.1:9")
    for override in ({"acks": "1"}, {"enable_idempotence": False},
                     {"partitioner": "consistent_random"}):
        with pytest.raises(ValueError, match="fixed"):
            ChangelogProducer(settings, **override)
    ChangelogProducer(settings, linger_ms=0, **{"compression.type": "none"})


def test_producer_without_bootstrap_says_what_to_do():
    with pytest.raises(BrokerUnavailable, match="fanout up"):
        ChangelogProducer(KafkaSettings(bootstrap="")).start()


def test_producer_reports_an_unreachable_broker():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    producer = ChangelogProducer(KafkaSettings(bootstrap=f"127.0.0.1:{port}"))
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=f"127.0.0.1:{port}"):
        producer.start(timeout=1.0)
    # Far above 1 s (a starved box), below the default 10 s the call would take otherwise.
    assert time.monotonic() - started < 9, "the 1 s timeout was not kept"


def test_replay_command_without_a_broker_says_run_fanout_up(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("KAFKA_BOOTSTRAP", raising=False)
    generator.write(generator.generate(20, 50, 10, seed=1), tmp_path)
    args = parse(["replay", str(tmp_path), "--no-progress"])
    with pytest.raises(BrokerUnavailable, match="fanout up"):
        cli.resolve_bootstrap(args)
    assert args.func(args) == 2
    out = capsys.readouterr().out
    assert "fanout up" in out and "KAFKA_BOOTSTRAP" in out


def test_replay_command_dry_run_of_an_edge_list(tmp_path, capsys):
    path = tmp_path / "edges.txt"
    path.write_text("1 2\n2 3\n3 3\n3 1\nbad line here\n")
    args = parse(["replay", str(path), "--dry-run", "--no-progress", "--generate-tweets", "50"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    # 3 edges, 3 profiles, 50 posts and round(50 * 0.02) = 1 delete.
    assert "replayed 57 events" in out
    assert "invalid lines skipped 1, self-loop skipped 1" in out


def test_replay_command_of_every_kind_of_record(tmp_path, capsys):
    args = parse(["replay", str(jsonl(tmp_path / "h.jsonl", EVERY_KIND)), "--dry-run",
                  "--no-progress"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    topics = Counter(e.topic for e in EVERY_KIND)
    assert (f"replayed {len(EVERY_KIND)} events" in out and f"activity {topics['activity']}"
            in out and f"follows {topics['follows']}" in out
            and f"tweets {topics['tweets']}" in out and f"users {topics['users']}" in out)
    assert "invalid lines skipped 0" in out


class Recording(DryRunProducer):
    """A dry run that keeps what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Event] = []

    def send(self, event: Event, on_delivery=None) -> None:
        super().send(event, on_delivery)
        self.events.append(event)


def replayed(monkeypatch, argv: list[str]) -> list[Event]:
    sink = Recording()
    monkeypatch.setattr(cli, "_sink", lambda args: sink)
    args = parse(["replay", *argv, "--no-progress"])
    assert args.func(args) == 0
    return sink.events


@pytest.fixture(scope="module")
def edge_list(tmp_path_factory) -> str:
    """A follow graph as a SNAP edge list: 300 users, 4,000 edges (0-based, like SNAP's)."""
    made = generator.generate(300, 4_000, 0, seed=9, unfollow_ratio=0)
    path = tmp_path_factory.mktemp("graph") / "edges.txt"
    path.write_text("".join(f"{f.follower_id - 1} {f.followee_id - 1}\n" for f in made.follows))
    return str(path)


def test_replay_of_an_edge_list_generates_activity_along_its_graph(monkeypatch, edge_list):
    events = replayed(monkeypatch, [edge_list, "--id-offset", "1", "--generate-tweets", "1500",
                                    "--mix", "social", "--seed", "4"])
    times = [e.created_at for e in events]
    assert times == sorted(times)
    kinds = Counter(generator.kind(e) for e in events)
    assert (kinds["follows"], kinds["users"]) == (4_000, 300)
    assert (kinds["posts"] + kinds["replies"], kinds["replies"], kinds["reposts"]) == (
        1_500, round(1_500 * SOCIAL.replies), round(1_500 * SOCIAL.reposts))
    assert kinds["blocks"] and kinds["mutes"] and kinds["account_deletes"]
    # The edges the activity was drawn along are the replayed follows, at their times.
    world = World.of(events)
    for r in (e for e in events if isinstance(e, Repost)):
        sources = {world.posts[r.original_tweet_id].author_id,
                   *(q.author_id for q in world.reposted_by[r.original_tweet_id]
                     if q.created_at < r.created_at)}
        assert any(world.live(r.author_id, f, r.created_at) for f in sources), r
    for p in (e for e in events if isinstance(e, Post) and e.in_reply_to_user_id):
        assert world.live(p.author_id, p.in_reply_to_user_id, p.created_at) or world.replied(
            p.in_reply_to_user_id, p.author_id, p.created_at)
    deleted = {e.user_id for e in events if isinstance(e, AccountDelete)}
    assert deleted <= {e.followee_id for e in events if isinstance(e, Follow)}


def test_replay_of_an_edge_list_without_a_mix_is_as_before(monkeypatch, edge_list):
    events = replayed(monkeypatch, [edge_list, "--id-offset", "1", "--generate-tweets", "500"])
    kinds = Counter(generator.kind(e) for e in events)
    assert kinds == {"follows": 4_000, "users": 300, "posts": 500, "deletes": 10}


def test_replay_without_profiles_keeps_the_account_deletions(monkeypatch, edge_list):
    events = replayed(monkeypatch, [edge_list, "--id-offset", "1", "--generate-tweets", "100",
                                    "--mix", "social", "--no-profiles", "--account-deletes",
                                    "0.05", "--blocks", "0.1"])
    assert not any(isinstance(e, UserUpsert) for e in events)
    assert sum(isinstance(e, AccountDelete) for e in events) == 15
    assert sum(isinstance(e, Relation) and e.active and e.relation == "block"
               for e in events) == 10


def test_replay_of_a_csv_of_records(monkeypatch, tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("\n".join(RECORDS_CSV) + "\n")
    assert not history.is_edge_list(path)
    assert replayed(monkeypatch, [str(path)]) == EVERY_KIND


def test_replay_command_reports_missing_files(tmp_path, capsys):
    args = parse(["replay", str(tmp_path / "nope.jsonl"), "--dry-run"])
    assert args.func(args) == 2
    assert "no such file" in capsys.readouterr().out


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fanout")
    cli.register(parser.add_subparsers(required=True))
    return parser.parse_args(argv)


# -- against the local Kafka node ----------------------------------------------------------


def read_back(settings: KafkaSettings, expected: int, timeout: float = 60.0) -> list:
    """Every record of the three topics, read with assign() from offset 0.

    The broker's listed end offsets are unreliable (DESIGN §10), so read until the
    expected count has arrived, then a little longer to catch any extra record.
    """
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "enable.auto.commit": False,
                         "group.id": f"test-{uuid.uuid4().hex}"})
    try:
        topics = consumer.list_topics(timeout=10).topics
        consumer.assign([TopicPartition(t, p, 0) for t in settings.physical_topics()
                         for p in topics[t].partitions])
        records: list = []
        deadline, quiet_until = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            batch = [m for m in consumer.consume(10_000, 0.2) if m.error() is None]
            records += batch
            if len(records) >= expected and quiet_until is None:
                quiet_until = time.monotonic() + 1.0
            if quiet_until is not None and time.monotonic() > quiet_until and not batch:
                return records
        pytest.fail(f"read {len(records)} of {expected} records within {timeout}s")
    finally:
        consumer.close()


@pytest.mark.broker
def test_replay_into_the_broker_round_trips_every_event(kafka_settings, tmp_path):
    made = generator.generate(300, 3_000, 2_000, seed=5,
                              mix=replace(SOCIAL, blocks=0.02, mutes=0.02))
    generator.write(made, tmp_path)
    reads = [Activity(u, generator.DEFAULT_START_MS + 3_600_000 * u) for u in range(1, 40)]
    report = ReadReport()
    producer = ChangelogProducer(kafka_settings)
    summary = replay(merge_by_time(iter_events(tmp_path, report), reads), producer,
                     progress=False, report=report)
    assert summary.ok, summary.render()
    expected = list(merge_by_time(made.events(), reads))
    assert {generator.kind(e) for e in expected} >= set(generator.KINDS)
    assert summary.delivered == summary.events == len(expected)
    late = UserUpsert(7, "late", "Late Comer", expected[-1].created_at + 1)
    token = producer.send_sync(late)
    stats = producer.close()
    assert stats.failed == 0 and stats.in_flight == 0 and stats.last_error is None

    records = read_back(kafka_settings, len(expected) + 1)
    assert len(records) == len(expected) + 1, "no record lost or duplicated"
    by_topic: dict[str, list[Event]] = defaultdict(list)
    for r in records:
        topic = kafka_settings.logical(r.topic())
        event = decode(topic, r.key(), r.value())
        assert r.partition() == java_partition(r.key(), kafka_settings.partitions), \
            "partitioned exactly as a Java client would (co-partitioning)"
        by_topic[topic].append(event)
    assert set(by_topic) == set(TOPICS)
    assert Counter(e for es in by_topic.values() for e in es) == Counter(
        [*expected, late])
    assert_per_partition_time_order(kafka_settings, records)
    assert_position_holds(kafka_settings, token, late)


def assert_per_partition_time_order(settings: KafkaSettings, records) -> None:
    """One producer, idempotent, in time order: each partition holds its events in order."""
    last: dict[tuple[str, int], tuple[int, int]] = {}
    for r in sorted(records, key=lambda r: (r.topic(), r.partition(), r.offset())):
        place = (r.topic(), r.partition())
        created_at = decode(settings.logical(r.topic()), r.key(), r.value()).created_at
        assert (created_at, r.offset()) >= last.get(place, (0, -1))
        last[place] = (created_at, r.offset())


def assert_position_holds(settings: KafkaSettings, token: Position, event: Event) -> None:
    assert token.topic == settings.topic("users")
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": "pos",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(token.topic, token.partition, token.offset)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                assert (msg.offset(), msg.key(), msg.value()) == (token.offset, *encode(event))
                return
        pytest.fail(f"nothing at {token}")
    finally:
        consumer.close()


@pytest.mark.broker
def test_send_sync_returns_increasing_positions(kafka_settings):
    with ChangelogProducer(kafka_settings, linger_ms=0) as producer:
        first = producer.send_sync(Post(1, 42, T, "one"), timeout=10)
        second = producer.send_sync(Post(2, 42, T + 1, "two"), timeout=10)
    assert first.topic == second.topic == kafka_settings.topic("tweets")
    assert first.partition == second.partition == java_partition(b"42", 2)
    assert second.offset == first.offset + 1


@pytest.mark.broker
def test_producer_refuses_missing_topics(kafka_bootstrap):
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=f"absent{uuid.uuid4().hex}_")
    producer = ChangelogProducer(settings)
    with pytest.raises(TopicLayoutError, match="does not exist"):
        producer.start()
    assert settings.topic("tweets") not in topic_names(kafka_bootstrap), "nothing auto-created"


def topic_names(bootstrap: str) -> set[str]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "meta"})
    try:
        return set(consumer.list_topics(timeout=10).topics)
    finally:
        consumer.close()


@pytest.mark.broker
def test_on_delivery_gets_each_outcome(kafka_settings):
    outcomes = []
    producer = ChangelogProducer(kafka_settings)
    for event in follows_at(T, T + 1, T + 2):
        producer.send(event, on_delivery=lambda e, result: outcomes.append((e, result)))
    assert producer.flush(10) == 0
    # Callbacks come in order per partition only; these three keys may span both.
    assert sorted(e.created_at for e, _ in outcomes) == [T, T + 1, T + 2]
    assert all(isinstance(r, Position) for _, r in outcomes)
    assert producer.stats.delivered == 3
