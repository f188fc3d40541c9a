"""The write path over real HTTP: records in the changelog, tokens, read-your-writes, 503s.

Writes go through the app's real producer to the session's Kafka node (fresh
topics per test) and are read back with ``assign()``; the view is simulated by
applying OFFSET deltas to the store, which is all ``?after=`` looks at.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ingest.consistency import Applied, decode_token, encode_token
from ingest.errors import InvalidToken
from ingest.events import (
    BLOCK,
    MAX_TEXT,
    MUTE,
    AccountDelete,
    Delete,
    Follow,
    Post,
    Relation,
    Repost,
    Unrepost,
)
from ingest.settings import KafkaSettings
from ingest.snowflake import EPOCH_MS, Snowflake
from serving.app import STALLED_MS, write_producer
from serving.writes import NOT_ONLY_SPACE
from tests.support.api import (
    assert_error,
    bearer,
    open_store,
    read_record,
    serve,
    settings,
    unreachable_kafka,
)
from views.delta import Delta
from views.stores.sqlite import SQLiteStore

ME, OTHER = 42, 2**63 - 1
T0 = 1_700_000_000_000


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    store = open_store(tmp_path)
    yield store
    store.close()


@pytest.fixture
def client(store: SQLiteStore, kafka_settings: KafkaSettings) -> Iterator[httpx.Client]:
    with serve(settings(store), store, kafka_settings) as c:
        yield c


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """The app with its broker unreachable: input errors must answer before producing.

    Its store knows the tweets and reposts of :func:`_known`.
    """
    store = open_store(tmp_path_factory.mktemp("offline"))
    _known(store)
    config = settings(store, write_timeout_ms=500, retry_after_s=3, broker_check_s=0.2)
    with serve(config, store, unreachable_kafka()) as c:
        yield c
    store.close()


def _applied(store: SQLiteStore, token: str) -> None:
    where = decode_token(token)
    store.apply([Delta.source_offset(where.topic, where.partition, where.offset, T0)],
                batch_id=1)


# -- records in the changelog -------------------------------------------------------------
@pytest.mark.broker
def test_post_lands_in_tweets_with_a_token(client: httpx.Client, kafka_settings: KafkaSettings):
    before = time.time_ns() // 1_000_000
    response = client.post("/v1/tweets", json={"text": "hello ✓"}, headers=bearer(ME))
    assert response.status_code == 202, response.text
    body = response.json()
    assert set(body) == {"tweet_id", "token"}
    key, event = read_record(kafka_settings, body["token"])
    assert key == str(ME).encode()
    assert isinstance(event, Post)
    assert (str(event.tweet_id), event.author_id, event.text) == (body["tweet_id"], ME, "hello ✓")
    assert before <= event.created_at <= time.time_ns() // 1_000_000
    assert decode_token(body["token"]).topic == "tweets"


@pytest.mark.broker
def test_tweet_ids_are_time_ordered(client: httpx.Client):
    ids = [int(client.post("/v1/tweets", json={"text": f"t{i}"}, headers=bearer(ME))
               .json()["tweet_id"]) for i in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5


@pytest.mark.broker
def test_delete_follow_unfollow_land_as_records(client: httpx.Client,
                                                kafka_settings: KafkaSettings):
    answers = [client.delete("/v1/tweets/1234", headers=bearer(ME)),
               client.put(f"/v1/users/{ME}/following/{OTHER}", headers=bearer(ME)),
               client.delete(f"/v1/users/{ME}/following/{OTHER}", headers=bearer(ME))]
    assert [r.status_code for r in answers] == [202, 202, 202], [r.text for r in answers]
    assert all(set(r.json()) == {"token"} for r in answers)
    events = [read_record(kafka_settings, r.json()["token"]) for r in answers]
    (k1, delete), (k2, follow), (k3, unfollow) = events
    assert isinstance(delete, Delete) and (delete.tweet_id, delete.author_id) == (1234, ME)
    assert k1 == str(ME).encode()
    assert isinstance(follow, Follow) and follow.active
    assert (follow.follower_id, follow.followee_id) == (ME, OTHER)
    assert k2 == k3 == str(OTHER).encode()  # keyed by followee: co-partitioned with tweets
    assert isinstance(unfollow, Follow) and not unfollow.active


@pytest.mark.broker
def test_delete_of_a_known_tweet_of_another_author_is_403(client: httpx.Client,
                                                         store: SQLiteStore):
    store.apply([Delta.tweet(77, OTHER, T0, "x"), Delta.tweet(78, ME, T0, "y")])
    body = assert_error(client.delete("/v1/tweets/77", headers=bearer(ME)), 403)
    assert body["error"] == "forbidden"
    assert client.delete("/v1/tweets/78", headers=bearer(ME)).status_code == 202


# -- read your writes -----------------------------------------------------------------------
@pytest.mark.broker
@pytest.mark.parametrize("route", ["home", "tweets"])
def test_after_waits_bounded_then_reports_consistency(client: httpx.Client, store: SQLiteStore,
                                                      route: str):
    token = client.post("/v1/tweets", json={"text": "mine"}, headers=bearer(ME)).json()["token"]
    path = f"/v1/users/{ME}/{route}"
    plain = client.get(path, headers=bearer(ME))
    assert plain.status_code == 200 and "consistent" not in plain.json()

    started = time.monotonic()
    stale = client.get(path, params={"after": token}, headers=bearer(ME))
    waited = time.monotonic() - started
    assert stale.status_code == 200 and stale.json()["consistent"] is False
    assert 0.4 <= waited < 4.5, f"waited {waited:.2f}s for a 0.4s bound (not the default 5 s)"

    _applied(store, token)
    fresh = client.get(path, params={"after": token}, headers=bearer(ME))
    assert fresh.json()["consistent"] is True  # at once: the next test, against a long bound


@pytest.mark.broker
def test_after_returns_as_soon_as_the_view_applies(store: SQLiteStore,
                                                   kafka_settings: KafkaSettings):
    # A bound far past the apply: on a starved box the apply can take longer than the
    # other tests' 0.4 s; an answer before the bound is the view's, not the timeout's.
    bound_s = 60
    with serve(settings(store, after_timeout_ms=bound_s * 1000), store, kafka_settings) as client:
        token = client.put(f"/v1/users/{ME}/following/7", headers=bearer(ME)).json()["token"]
        applier = threading.Timer(0.1, _applied, (store, token))
        started = time.monotonic()
        applier.start()
        try:
            body = client.get(f"/v1/users/{ME}/home", params={"after": token},
                              headers=bearer(ME), timeout=bound_s * 2).json()
        finally:
            applier.join()
        waited = time.monotonic() - started
        started = time.monotonic()
        again = client.get(f"/v1/users/{ME}/home", params={"after": token},
                           headers=bearer(ME), timeout=bound_s * 2).json()
        again_waited = time.monotonic() - started
    assert body["consistent"] is True
    assert waited < bound_s, f"answered after {waited:.1f}s: at the bound, not at the apply"
    assert again["consistent"] is True
    assert again_waited < bound_s, f"an applied token waited {again_waited:.1f}s, the bound"


@pytest.mark.parametrize("token", ["", "nope", "k1.", "k1.!!", "k1." + "A" * 100,
                                   "k1.dHdlZXRzOjA6LTE", "k1.bm9wZTowOjA", "k1.dHdlZXRzOjA6MQ=x"])
def test_bad_after_token_is_400(offline: httpx.Client, token: str):
    body = assert_error(offline.get("/v1/users/1/tweets", params={"after": token}), 400)
    assert body["field"] == "after"


def test_consistency_token_round_trip_and_rejects():
    token = encode_token("follows", 3, 2**63 - 1)
    assert decode_token(token) == Applied("follows", 3, 2**63 - 1)
    for bad in ["k1.dHdlZXRzOisxOjE", "k1.dHdlZXRzOjE6IDE", "x" + token, token + "AAAA"]:
        with pytest.raises(InvalidToken):
            decode_token(bad)
    with pytest.raises(InvalidToken):
        encode_token("nope", 0, 0)


# -- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize(("body", "field"), [
    ('{"text": "%s"}' % ("x" * (MAX_TEXT + 1)), "text"),
    ('{"text": ""}', "text"),
    ('{"text": "hi", "author_id": 1}', "author_id"),
    ("{}", "text"),
    ('{"text": 5}', "text"),
    ('{"text": "\\ud800"}', "text"),  # a lone surrogate has no UTF-8 form
    ("[]", None),
    ("{", None),
    ("null", None),
])
def test_bad_tweet_bodies_are_400(offline: httpx.Client, body: str, field: str | None):
    headers = bearer(ME) | {"content-type": "application/json"}
    got = assert_error(offline.post("/v1/tweets", content=body, headers=headers), 400)
    assert got.get("field") == field


def test_blank_text_and_self_follow_are_400_before_producing(offline: httpx.Client):
    blank = offline.post("/v1/tweets", json={"text": " \n\t "}, headers=bearer(ME))
    self_follow = offline.put(f"/v1/users/{ME}/following/{ME}", headers=bearer(ME))
    bad_id = offline.put(f"/v1/users/{ME}/following/0", headers=bearer(ME))
    bad_tweet = offline.delete("/v1/tweets/-5", headers=bearer(ME))
    assert assert_error(blank, 400)["field"] == "text"
    assert assert_error(self_follow, 400)["field"] == "other_id"
    assert assert_error(bad_id, 400)["field"] == "other_id"
    assert assert_error(bad_tweet, 400)["field"] == "tweet_id"


@pytest.mark.broker
def test_text_of_exactly_280_characters_is_accepted(client: httpx.Client):
    response = client.post("/v1/tweets", json={"text": "é" * MAX_TEXT}, headers=bearer(ME))
    assert response.status_code == 202, response.text


def test_body_over_the_limit_is_413_json(offline: httpx.Client):
    big = b'{"text": "' + b"x" * 20_000 + b'"}'

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(big), 1000):
            yield big[i:i + 1000]

    headers = bearer(ME) | {"content-type": "application/json"}
    declared = offline.post("/v1/tweets", content=big, headers=headers)
    streamed = offline.post("/v1/tweets", content=chunks(), headers=headers)
    assert "16384 bytes" in assert_error(declared, 413)["message"]
    assert assert_error(streamed, 413)["error"] == "request_entity_too_large"


# -- the broker is unreachable --------------------------------------------------------------
def test_unreachable_broker_answers_503_fast_with_retry_after(offline: httpx.Client,
                                                            caplog: pytest.LogCaptureFixture):
    started = time.monotonic()
    first = offline.post("/v1/tweets", json={"text": "lost?"}, headers=bearer(ME))
    first_took = time.monotonic() - started
    caplog.clear()
    second = offline.put(f"/v1/users/{ME}/following/7", headers=bearer(ME))
    health = offline.get("/healthz")
    reads = offline.get(f"/v1/users/{ME}/tweets")
    for response in (first, second):
        assert assert_error(response, 503)["error"] == "unavailable"
        assert response.headers["retry-after"] == "3"
        assert "127.0.0.1" not in response.text  # no internals in the answer
    assert first_took < 3.0, f"the first write took {first_took:.2f}s"
    # Within the cool-down a write fails fast: refused before any attempt to produce
    # (the app serves in this process: its log is the test's).
    assert "refused with 503: broker unreachable a moment ago" in caplog.text
    assert health.status_code == 503
    assert health.json()["status"] == "degraded" and health.json()["broker"] == "unreachable"
    assert reads.status_code == 200  # reads do not need the broker


@pytest.mark.broker
def test_healthz_reports_a_reachable_broker(client: httpx.Client):
    body = client.get("/healthz").json()
    assert (body["status"], body["broker"]) == ("ok", "ok")


# -- snowflake ids --------------------------------------------------------------------------
def test_snowflake_ids_are_unique_ordered_and_positive_under_threads():
    flake = Snowflake(worker=1023, clock=lambda: EPOCH_MS + 5)  # a stuck clock
    out: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        mine = [flake.next()[0] for _ in range(3000)]
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == len(out) == 12_000
    assert all(0 < i < 2**63 for i in out)


def test_snowflake_borrows_the_next_millisecond_and_never_goes_back():
    now = [EPOCH_MS + 100]
    flake = Snowflake(worker=0, clock=lambda: now[0])
    ids = [flake.next() for _ in range(4097)]
    assert ids[-1][1] == EPOCH_MS + 101  # sequence full: next millisecond
    now[0] = EPOCH_MS + 50  # the clock steps back
    tweet_id, ms = flake.next()
    assert ms == EPOCH_MS + 101 and tweet_id > ids[-1][0]
    with pytest.raises(ValueError, match="worker"):
        Snowflake(worker=1024)


def test_documented_text_pattern_is_exactly_the_contracts_whitespace_rule():
    pattern = re.compile(NOT_ONLY_SPACE)
    for code in range(0x110000):
        char = chr(code)
        assert (pattern.fullmatch(char) is None) == (not char.strip()), hex(code)


# -- reposts, replies, blocks, mutes, account deletes (DESIGN §4b) --------------------------
def _known(store: SQLiteStore) -> None:
    """Posts 500 (OTHER's), 501 (ME's), 502 (deleted), repost 600 of 500 by 7,
    ME's repost 601 of 503, and 7's hidden repost 602 of 503."""
    store.apply([Delta.tweet(500, OTHER, T0, "theirs"), Delta.tweet(501, ME, T0, "mine"),
                 Delta.tweet(502, OTHER, T0, "gone"),
                 Delta.tweet_deleted(502, OTHER, T0 + 1),
                 Delta.tweet(503, 7, T0, "popular"),
                 Delta.repost(600, 7, T0 + 1, (500, OTHER), shown=True),
                 Delta.repost(601, ME, T0 + 1, (503, 7), shown=True),
                 Delta.repost(602, 7, T0 + 2, (503, 7), shown=False)])


@pytest.mark.broker
def test_repost_lands_with_the_original_resolved(client: httpx.Client, store: SQLiteStore,
                                                 kafka_settings: KafkaSettings):
    _known(store)
    direct = client.post("/v1/tweets/500/reposts", headers=bearer(ME))
    of_a_repost = client.post("/v1/tweets/600/reposts", headers=bearer(ME))  # 600 is of 500
    own = client.post("/v1/tweets/501/reposts", headers=bearer(ME))
    for response in (direct, of_a_repost, own):
        assert response.status_code == 202, response.text
        assert set(response.json()) == {"repost_id", "original_id", "token"}
    assert of_a_repost.json()["original_id"] == "500"
    key, event = read_record(kafka_settings, of_a_repost.json()["token"])
    assert key == str(ME).encode()
    assert isinstance(event, Repost)
    assert (str(event.tweet_id), event.author_id, event.original_tweet_id,
            event.original_author_id) == (of_a_repost.json()["repost_id"], ME, 500, OTHER)
    assert read_record(kafka_settings, own.json()["token"])[1].original_author_id == ME


@pytest.mark.broker
def test_reply_names_the_author_it_answers(client: httpx.Client, store: SQLiteStore,
                                           kafka_settings: KafkaSettings):
    _known(store)
    answers = {target: client.post("/v1/tweets", json={"text": "re", "in_reply_to": target},
                                   headers=bearer(ME))
               for target in ("500", 600, "501")}  # a post, a repost (as a number), my own
    for response in answers.values():
        assert response.status_code == 202, response.text
    assert answers["500"].json()["in_reply_to_user_id"] == str(OTHER)
    assert answers[600].json()["in_reply_to_user_id"] == str(OTHER)  # the original's author
    assert "in_reply_to_user_id" not in answers["501"].json()  # a self-reply carries none
    events = {t: read_record(kafka_settings, r.json()["token"])[1] for t, r in answers.items()}
    assert all(isinstance(e, Post) and e.author_id == ME for e in events.values())
    assert [e.in_reply_to_user_id for e in events.values()] == [OTHER, OTHER, 0]  # type: ignore[union-attr]


@pytest.mark.broker
def test_unrepost_relations_and_account_delete_land_as_records(
        client: httpx.Client, store: SQLiteStore, kafka_settings: KafkaSettings):
    _known(store)
    calls = [("DELETE", "/v1/reposts/601"), ("DELETE", "/v1/reposts/999"),  # not seen yet
             ("PUT", f"/v1/users/{ME}/blocks/{OTHER}"), ("DELETE", f"/v1/users/{ME}/blocks/7"),
             ("PUT", f"/v1/users/{ME}/mutes/7"), ("DELETE", f"/v1/users/{ME}/mutes/{OTHER}"),
             ("DELETE", f"/v1/users/{ME}")]
    answers = [client.request(m, p, headers=bearer(ME)) for m, p in calls]
    assert [r.status_code for r in answers] == [202] * len(calls), [r.text for r in answers]
    records = [read_record(kafka_settings, r.json()["token"]) for r in answers]
    events = [e for _, e in records]
    assert events[0] == Unrepost(601, ME, events[0].created_at)
    assert events[1] == Unrepost(999, ME, events[1].created_at)
    assert [(type(e), e.follower_id, e.followee_id, e.relation, e.active)  # type: ignore[union-attr]
            for e in events[2:6]] == [(Relation, ME, OTHER, BLOCK, True),
                                      (Relation, ME, 7, BLOCK, False),
                                      (Relation, ME, 7, MUTE, True),
                                      (Relation, ME, OTHER, MUTE, False)]
    assert [k for k, _ in records[2:6]] == [str(u).encode() for u in (OTHER, 7, 7, OTHER)]
    assert events[6] == AccountDelete(ME, events[6].created_at)
    assert records[6][0] == str(ME).encode()


def test_repost_and_reply_of_what_the_views_do_not_show_are_404(offline: httpx.Client):
    for path in ("/v1/tweets/404404/reposts", "/v1/tweets/502/reposts"):
        body = assert_error(offline.post(path, headers=bearer(ME)), 404)
        assert (body["error"], body["field"]) == ("not_found", "tweet_id")
    for target in ("404404", "502"):
        reply = offline.post("/v1/tweets", json={"text": "re", "in_reply_to": target},
                             headers=bearer(ME))
        assert assert_error(reply, 404)["field"] == "in_reply_to"


def test_second_repost_of_a_tweet_is_409(offline: httpx.Client):
    for path in ("/v1/tweets/503/reposts", "/v1/tweets/601/reposts"):  # 601 is ME's of 503
        body = assert_error(offline.post(path, headers=bearer(ME)), 409)
        assert body["error"] == "conflict" and "601" in body["message"]
    # 7 shows a repost of 500 (600), not of 503 (602 is hidden): only the second is
    # let through, to the (unreachable) changelog.
    assert assert_error(offline.post("/v1/tweets/500/reposts", headers=bearer(7)), 409)
    assert assert_error(offline.post("/v1/tweets/503/reposts", headers=bearer(7)), 503)


def test_unrepost_of_a_post_or_of_anothers_repost_is_refused(offline: httpx.Client):
    post = assert_error(offline.delete("/v1/reposts/501", headers=bearer(ME)), 404)
    assert post["field"] == "repost_id" and "DELETE /v1/tweets/501" in post["message"]
    theirs = assert_error(offline.delete("/v1/reposts/600", headers=bearer(ME)), 403)
    assert theirs["field"] == "repost_id"
    # A repost the views know as the caller's goes on to the (unreachable) changelog.
    assert assert_error(offline.delete("/v1/reposts/601", headers=bearer(ME)), 503)


@pytest.mark.parametrize(("method", "path", "body", "status", "field"), [
    ("PUT", f"/v1/users/{ME}/blocks/{ME}", None, 400, "other_id"),
    ("DELETE", f"/v1/users/{ME}/mutes/{ME}", None, 400, "other_id"),
    ("PUT", f"/v1/users/{ME}/mutes/0", None, 400, "other_id"),
    ("PUT", f"/v1/users/{ME}/blocks/x", None, 400, "other_id"),
    ("PUT", f"/v1/users/{OTHER}/blocks/7", None, 403, "user_id"),
    ("DELETE", f"/v1/users/{OTHER}/mutes/7", None, 403, "user_id"),
    ("DELETE", f"/v1/users/{OTHER}", None, 403, "user_id"),
    ("DELETE", "/v1/users/abc", None, 400, "user_id"),
    ("POST", "/v1/tweets/abc/reposts", None, 400, "tweet_id"),
    ("DELETE", f"/v1/reposts/{2**63}", None, 400, "repost_id"),
    ("POST", "/v1/tweets", {"text": "re", "in_reply_to": "abc"}, 400, "in_reply_to"),
    ("POST", "/v1/tweets", {"text": "re", "in_reply_to": "0"}, 400, "in_reply_to"),
    ("POST", "/v1/tweets", {"text": "re", "in_reply_to": True}, 400, "in_reply_to"),
    ("POST", "/v1/tweets", {"text": "re", "in_reply_to": 1.5}, 400, "in_reply_to"),
    ("POST", "/v1/tweets", {"text": "re", "in_reply_to": -3}, 400, "in_reply_to"),
    ("POST", "/v1/tweets", {"text": "re", "in_reply_to": str(2**63)}, 400, "in_reply_to"),
])
def test_bad_timeline_writes_are_4xx_before_producing(offline: httpx.Client, method: str,
                                                      path: str, body: object, status: int,
                                                      field: str):
    response = offline.request(method, path, json=body, headers=bearer(ME))
    assert assert_error(response, status)["field"] == field


def test_a_write_record_is_tried_past_a_failover_with_one_request_in_flight(tmp_path: Path):
    # A record that times out in flight, or an out-of-order answer behind a failed
    # request, bumps the idempotent producer's epoch, and records retried under the new
    # epoch can be written twice (the soak found one): the request answers 503 at the
    # write timeout while the record is tried on.
    store = open_store(tmp_path)
    try:
        config = settings(store, write_timeout_ms=2_000, delivery_timeout_ms=45_000)
        producer = write_producer(config, unreachable_kafka()).config
        assert producer["message.timeout.ms"] == 45_000
        assert producer["max.in.flight.requests.per.connection"] == 1
        # A request stalled on a dead connection is given up and sent again well inside
        # the delivery timeout, and the broker's own ack timeout comes before that.
        assert producer["socket.timeout.ms"] == STALLED_MS
        assert producer["socket.connection.setup.timeout.ms"] == STALLED_MS
        assert producer["request.timeout.ms"] < producer["socket.timeout.ms"]
        short = write_producer(settings(store, write_timeout_ms=500, delivery_timeout_ms=2_000),
                               unreachable_kafka()).config
        assert short["socket.timeout.ms"] <= short["message.timeout.ms"] // 2
        assert producer["enable.idempotence"] is True
        with pytest.raises(ValueError, match="shorter than write_timeout_ms"):
            settings(store, write_timeout_ms=5_000, delivery_timeout_ms=1_000)
    finally:
        store.close()
