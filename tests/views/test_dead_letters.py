"""Every class of bad changelog record is dead-lettered; the job keeps going (DESIGN §3).

Raw records that break the contract in each way we know of are produced between the
events of a valid history, the view job drains the topics (``availableNow``, small
micro-batches so that bad records land mid-stream), and then: the valid events are
all applied (verify: 0 divergent users, no lagging partition), each bad record sits in
``dead_letters`` under its own topic, partition and offset with a reason naming its
problem, ``fanout dead-letters`` lists them, and ``/metrics`` counts them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer

from infra import cli, webclient
from infra.checks.verify import verify
from ingest.events import MAX_ID
from ingest.generator import generate
from ingest.settings import KafkaSettings
from serving.app import create_app
from serving.settings import ServingSettings
from tests.support.api import running
from tests.support.changelog import produce
from views.job import start_query
from views.settings import ViewSettings
from views.stores.sqlite import SQLiteStore

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.timeout(600)]

CAP = 40


def _post(**fields: object) -> bytes:
    body = {"v": 1, "op": "post", "tweet_id": 900, "author_id": 5, "created_at": 1000,
            "text": "hello"} | fields
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


#: class -> (logical topic, key, value, pattern the reason must match)
BAD: dict[str, tuple[str, bytes | None, bytes | None, str]] = {
    "non-JSON": ("tweets", b"5", b"{not json", r"not JSON"),
    "invalid UTF-8": ("tweets", b"5", b"\xff\xfe{}", r"not JSON"),
    "JSON array": ("tweets", b"5", b"[1, 2, 3]", r"JSON list, not an object"),
    "JSON string": ("follows", b"5", b'"follow"', r"JSON str, not an object"),
    "string id": ("tweets", b"5", _post(tweet_id="900"), r"tweet_id must be an integer, got str"),
    "float id": ("tweets", b"5", _post(tweet_id=9.5), r"tweet_id must be an integer, got float"),
    "bool id": ("tweets", b"5", _post(author_id=True), r"author_id must be an integer, got bool"),
    "missing field": ("tweets", b"5", _post(text=...), r"missing field text"),
    "missing time": ("follows", b"5", b'{"v":1,"op":"follow","follower_id":6,"followee_id":5}',
                     r"missing field created_at"),
    "unknown op": ("tweets", b"5", _post(op="retweet"), r"unknown op 'retweet'"),
    "unknown version": ("tweets", b"5", _post(v=2), r"unsupported version v=2"),
    "v=1.0": ("tweets", b"5", _post(v=1.0), r"unsupported version v=1\.0"),
    "no version": ("tweets", b"5", _post(v=...), r"unsupported version v=None"),
    "zero id": ("tweets", b"5", _post(tweet_id=0), r"tweet_id=0 is not a positive 64-bit id"),
    "negative id": ("tweets", b"5", _post(tweet_id=-3), r"tweet_id=-3 is not a positive"),
    "id over 2^63-1": ("tweets", b"5", _post(tweet_id=MAX_ID + 1),
                       rf"tweet_id={MAX_ID + 1} is not a positive 64-bit id"),
    "text over 280": ("tweets", b"5", _post(text="x" * 281), r"281 characters, over the limit"),
    "empty text": ("tweets", b"5", _post(text=""), r"text is empty"),
    "blank text": ("tweets", b"5", _post(text=" \n\t"), r"text is empty"),
    "lone surrogate": ("tweets", b"5", b'{"v":1,"op":"post","tweet_id":900,"author_id":5,'
                       b'"created_at":1000,"text":"a\\ud800b"}', r"lone surrogate"),
    "self-follow": ("follows", b"7", b'{"v":1,"op":"follow","follower_id":7,"followee_id":7,'
                    b'"created_at":1000}', r"cannot follow themselves"),
    "extra field": ("tweets", b"5", _post(extra=1), r"unexpected field\(s\) extra"),
    "wrong key": ("tweets", b"6", _post(), r"key '6' does not match the join key 5"),
    "null key": ("tweets", None, _post(), r"record has no key \(expected 5\)"),
    "tombstone": ("tweets", b"5", None, r"no value \(tombstone\)"),
    "user tombstone": ("users", b"5", None, r"no value \(tombstone\)"),
    "bad time": ("tweets", b"5", _post(created_at=-1), r"created_at=-1 is not epoch"),
    # The records of DESIGN §4b.
    "self-reply": ("tweets", b"5", _post(in_reply_to_user_id=5), r"a self-reply carries none"),
    "repost of itself": ("tweets", b"5", b'{"v":1,"op":"repost","tweet_id":9,"author_id":5,'
                         b'"original_tweet_id":9,"original_author_id":6,"created_at":1000}',
                         r"a repost has its own id"),
    "repost without original": ("tweets", b"5", b'{"v":1,"op":"repost","tweet_id":9,'
                                b'"author_id":5,"original_author_id":6,"created_at":1000}',
                                r"missing field original_tweet_id"),
    "self-block": ("follows", b"7", b'{"v":1,"op":"block","follower_id":7,"followee_id":7,'
                   b'"created_at":1000}', r"cannot block themselves"),
    "tweet delete on users": ("users", b"5", b'{"v":1,"op":"delete","tweet_id":9,'
                              b'"author_id":5,"created_at":1000}', r"unexpected field"),
    "unknown activity op": ("activity", b"5", b'{"v":1,"op":"write","user_id":5,'
                            b'"created_at":1000}', r"unknown op 'write' on topic activity"),
}


def _produce_bad(kafka: KafkaSettings) -> dict[tuple[str, int, int], str]:
    """Produce every bad record; return its (logical topic, partition, offset) -> class."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all",
                         "allow.auto.create.topics": False})
    where: dict[tuple[str, int, int], str] = {}
    errors: list[KafkaError] = []

    def delivered(name: str, topic: str, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            where[(topic, msg.partition() or 0, msg.offset() or 0)] = name

    for name, (topic, key, value, _) in BAD.items():
        producer.produce(kafka.topic(topic), key=key, value=value,
                         on_delivery=lambda err, msg, n=name, t=topic: delivered(n, t, err, msg))
    assert producer.flush(30) == 0 and not errors, errors
    assert len(where) == len(BAD)
    return where


def test_every_bad_record_class_is_dead_lettered(spark, kafka_settings, tmp_path: Path,
                                                 monkeypatch, capsys):
    events = list(generate(150, 1200, 800, seed=4).events())
    half = len(events) // 2
    produce(kafka_settings, events[:half])
    where = _produce_bad(kafka_settings)
    produce(kafka_settings, events[half:])
    store_path = tmp_path / "views.sqlite"
    view = ViewSettings(store_url=f"sqlite:///{store_path}", checkpoint_dir=tmp_path / "ck",
                        timeline_cap=CAP, celebrity_threshold=30, max_records_per_batch=400,
                        shuffle_partitions=2)
    with SQLiteStore(store_path, cap=CAP) as store:
        query = start_query(spark, kafka_settings, view, store, available_now=True)
        assert query.awaitTermination(300), "the job did not drain the topics within 300 s"
        assert query.exception() is None, query.exception()
        batches = len(store.batches())
        result = verify(kafka_settings, store, CAP)
        assert result.ok, result.render()
        letters = {(d.topic, d.partition, d.offset): d for d in store.dead_letters(1000)}
        count = store.dead_letter_count()
    assert batches > 3, "bad records should sit between micro-batches"
    assert set(letters) == set(where)
    for position, name in where.items():
        topic, key, value, pattern = BAD[name]
        letter = letters[position]
        assert re.search(pattern, letter.reason), (name, letter.reason)
        assert letter.raw == (value or b""), name
    assert count == len(BAD)

    monkeypatch.setenv("FANOUT_STORE", f"sqlite:///{store_path}")
    assert cli.main(["--run-dir", str(tmp_path / "run"), "dead-letters", "--limit", "100"]) == 0
    listed = capsys.readouterr().out
    for topic, partition, offset in where:
        assert f"{topic}[{partition}]@{offset}: " in listed
    assert f"{len(BAD)} dead letter(s) shown" in listed

    app = create_app(ServingSettings(store_url=f"sqlite:///{store_path}", auth=False),
                     kafka=kafka_settings)
    with running(app) as base:
        metrics = webclient.get(f"{base}/metrics", timeout=10).text
    counter = re.search(r"^fanout_dead_letters_total (\S+)$", metrics, re.MULTILINE)
    assert counter is not None, metrics
    assert float(counter.group(1)) == len(BAD)
    print(f"\ndead letters: {len(BAD)} classes tested, {count} dead-lettered, "
          f"{result.events} valid events applied over {batches} micro-batches; "
          f"{result.render()}")
