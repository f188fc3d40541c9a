"""The changelog contract: every event round-trips, every broken record is rejected
with a reason a person can act on (DESIGN §3)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.errors import InvalidEvent
from ingest.events import (
    FOLLOWS,
    MAX_CREATED_AT,
    MAX_HANDLE,
    MAX_ID,
    MAX_NAME,
    MAX_TEXT,
    TWEETS,
    USERS,
    Delete,
    Follow,
    Post,
    UserUpsert,
    decode,
    encode,
    encode_key,
)

BIG = 2**63 - 1
T = 1_704_067_200_000

EXAMPLES = [
    Post(1, 2, T, "hello"),
    Post(BIG, BIG, MAX_CREATED_AT, "x" * MAX_TEXT),
    Post(BIG - 1, 1, 0, "ünïcödé 🐦 \"quotes\" \\ and\nnewlines"),
    Delete(BIG, BIG, T),
    Follow(1, BIG, T),
    Follow(BIG, 1, T, active=False),
    UserUpsert(BIG, "h" * MAX_HANDLE, "n" * MAX_NAME, T),
    UserUpsert(1, "ada", "", T),
]


@pytest.mark.parametrize("event", EXAMPLES, ids=repr)
def test_round_trip(event):
    key, value = encode(event)
    assert key == str(event.key).encode()
    assert decode(event.topic, key, value) == event


def test_topics_and_keys():
    assert (Post(1, 2, T, "x").topic, Post(1, 2, T, "x").key) == (TWEETS, 2)
    assert (Delete(1, 2, T).topic, Delete(1, 2, T).key) == (TWEETS, 2)
    assert (Follow(1, 2, T).topic, Follow(1, 2, T).key) == (FOLLOWS, 2)
    assert (UserUpsert(3, "h", "n", T).topic, UserUpsert(3, "h", "n", T).key) == (USERS, 3)
    assert Follow(1, 2, T, active=False).op == "unfollow"


def test_value_is_compact_json_in_contract_shape():
    _, value = encode(Post(5, 7, T, "hi"))
    assert value == b'{"v":1,"op":"post","tweet_id":5,"author_id":7,"created_at":%d,"text":"hi"}' % T


ids = st.integers(1, MAX_ID)
times = st.integers(0, MAX_CREATED_AT)
texts = st.text(min_size=1, max_size=MAX_TEXT).filter(str.strip)


@st.composite
def events(draw):
    kind = draw(st.sampled_from(["post", "delete", "follow", "upsert"]))
    if kind == "post":
        return Post(draw(ids), draw(ids), draw(times), draw(texts))
    if kind == "delete":
        return Delete(draw(ids), draw(ids), draw(times))
    if kind == "follow":
        a, b = draw(ids), draw(ids)
        return Follow(a, b if b != a else (a % MAX_ID) + 1, draw(times), draw(st.booleans()))
    return UserUpsert(draw(ids), draw(st.text(min_size=1, max_size=MAX_HANDLE).filter(str.strip)),
                      draw(st.text(max_size=MAX_NAME)), draw(times))


@given(events())
def test_round_trip_property(event):
    assert decode(event.topic, *encode(event)) == event


# -- invalid records ---------------------------------------------------------------

POST = {"v": 1, "op": "post", "tweet_id": 10, "author_id": 2, "created_at": T, "text": "hi"}
DELETE = {"v": 1, "op": "delete", "tweet_id": 10, "author_id": 2, "created_at": T}
FOLLOW = {"v": 1, "op": "follow", "follower_id": 1, "followee_id": 2, "created_at": T}
UPSERT = {"v": 1, "op": "upsert", "user_id": 2, "handle": "h", "name": "n", "created_at": T}
BODIES = {TWEETS: POST, FOLLOWS: FOLLOW, USERS: UPSERT}


def reject(topic: str, body, key: bytes | None = b"2", match: str = "") -> str:
    value = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    with pytest.raises(InvalidEvent, match=match) as info:
        decode(topic, key, value)
    reason = str(info.value)
    assert reason, "a rejection must carry a reason"
    return reason


def changed(body: dict, **fields) -> dict:
    return {**body, **fields}


def without(body: dict, field: str) -> dict:
    return {k: v for k, v in body.items() if k != field}


@pytest.mark.parametrize("value", [b"{not json", b"", b"\xff\xfe\x00", b'{"v":1,'])
def test_non_json(value):
    reject(TWEETS, value, match="not JSON")


@pytest.mark.parametrize("value", [b"[1, 2]", b"42", b'"post"', b"null", b"true"])
def test_not_an_object(value):
    reject(TWEETS, value, match="not an object")


def test_null_value_is_a_tombstone():
    reject(USERS, None, match="no value")


def test_unknown_topic():
    reject("retweets", POST, match="unknown topic")


@pytest.mark.parametrize("field", ["tweet_id", "author_id", "created_at"])
@pytest.mark.parametrize("bad,kind", [("12", "str"), (True, "bool"), (False, "bool"),
                                      (12.0, "float"), (None, "NoneType"), ([1], "list")])
def test_wrong_types_of_ids(field, bad, kind):
    reject(TWEETS, changed(POST, **{field: bad}), match=f"{field} must be an integer, got {kind}")


@pytest.mark.parametrize("topic,field", [(FOLLOWS, "follower_id"), (FOLLOWS, "followee_id"),
                                         (USERS, "user_id")])
def test_wrong_types_of_ids_on_other_topics(topic, field):
    reject(topic, changed(BODIES[topic], **{field: True}), match=f"{field} must be an integer")
    reject(topic, changed(BODIES[topic], **{field: 2.0}), match=f"{field} must be an integer")


@pytest.mark.parametrize("topic,field", [(TWEETS, "text"), (USERS, "handle"), (USERS, "name")])
def test_wrong_types_of_text(topic, field):
    reject(topic, changed(BODIES[topic], **{field: 5}), match=f"{field} must be a string, got int")
    reject(topic, changed(BODIES[topic], **{field: None}), match=f"{field} must be a string")


@pytest.mark.parametrize("topic,body", [(TWEETS, POST), (TWEETS, DELETE), (FOLLOWS, FOLLOW),
                                        (USERS, UPSERT)])
def test_missing_fields(topic, body):
    for field in set(body) - {"v", "op"}:
        reject(topic, without(body, field), match=f"missing field {field}")


@pytest.mark.parametrize("topic,op", [(TWEETS, "retweet"), (TWEETS, "follow"), (TWEETS, None),
                                      (FOLLOWS, "post"), (FOLLOWS, "FOLLOW"), (USERS, "delete"),
                                      (USERS, 1)])
def test_unknown_op(topic, op):
    body = without(BODIES[topic], "op") if op is None else changed(BODIES[topic], op=op)
    reject(topic, body, match=f"unknown op {op!r} on topic {topic}")


@pytest.mark.parametrize("v", [0, 2, "1", None, True, [1]])
def test_unknown_version(v):
    reason = reject(TWEETS, changed(POST, v=v), match="unsupported version")
    assert "expected 1" in reason


def test_missing_version():
    reject(TWEETS, without(POST, "v"), match="unsupported version")


def test_float_version():
    reject(TWEETS, changed(POST, v=1.0), match="unsupported version")


@pytest.mark.parametrize("value", [0, -1, -(2**63), 2**63, 2**64, 10**30])
@pytest.mark.parametrize("field", ["tweet_id", "author_id"])
def test_ids_out_of_range(field, value):
    key = b"2" if field == "tweet_id" else str(value).encode()
    reject(TWEETS, changed(POST, **{field: value}), key=key,
           match=f"{field}={value} is not a positive 64-bit id")


@pytest.mark.parametrize("value", [-1, MAX_CREATED_AT + 1, 2**63])
def test_created_at_out_of_range(value):
    reject(TWEETS, changed(POST, created_at=value), match="not epoch milliseconds")


def test_text_limits():
    reason = reject(TWEETS, changed(POST, text="x" * (MAX_TEXT + 1)),
                    match=f"{MAX_TEXT + 1} characters, over the limit of {MAX_TEXT}")
    assert "text" in reason
    reject(TWEETS, changed(POST, text=""), match="text is empty")
    reject(TWEETS, changed(POST, text="  \n"), match="text is empty")
    assert decode(TWEETS, b"2", json.dumps(changed(POST, text="🐦" * MAX_TEXT)).encode())


def test_profile_limits():
    reject(USERS, changed(UPSERT, handle="h" * (MAX_HANDLE + 1)), match="handle is")
    reject(USERS, changed(UPSERT, name="n" * (MAX_NAME + 1)), match="name is")
    reject(USERS, changed(UPSERT, handle=" "), match="handle is empty")


@pytest.mark.parametrize("op", ["follow", "unfollow"])
def test_self_follow(op):
    body = changed(FOLLOW, op=op, follower_id=2, followee_id=2)
    reject(FOLLOWS, body, match=f"user 2 cannot {op} themselves")


@pytest.mark.parametrize("topic,body", [(TWEETS, POST), (TWEETS, DELETE), (FOLLOWS, FOLLOW),
                                        (USERS, UPSERT)])
def test_extra_fields(topic, body):
    reject(topic, changed(body, retweets=3, zz=1), match="unexpected field.*retweets, zz")


def test_delete_with_text_is_an_extra_field():
    reject(TWEETS, changed(DELETE, text="hi"), match="unexpected field.*text")


@pytest.mark.parametrize("key", [b"3", b"02", b"2 ", b"", b"\xff", b"author-2"])
def test_key_mismatch(key):
    reject(TWEETS, POST, key=key, match="does not match the join key 2")


def test_missing_key():
    reject(FOLLOWS, FOLLOW, key=None, match="no key .expected 2")


def test_key_of_each_topic_is_its_join_key():
    assert decode(FOLLOWS, encode_key(2), json.dumps(FOLLOW).encode()).key == 2
    reject(FOLLOWS, FOLLOW, key=encode_key(1), match="join key 2")  # follower, not followee
    reject(USERS, UPSERT, key=encode_key(3), match="join key 2")


def test_lone_surrogate_text_is_invalid():
    import json as _json

    from ingest.errors import InvalidEvent
    from ingest.events import decode

    body = _json.dumps({"v": 1, "op": "post", "tweet_id": 1, "author_id": 2,
                        "created_at": 3, "text": "\ud800"}).encode()
    with pytest.raises(InvalidEvent, match="surrogate"):
        decode("tweets", b"2", body)
