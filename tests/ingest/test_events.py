"""The changelog contract: every event round-trips, every broken record is rejected
with a reason a person can act on (DESIGN §3)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.errors import InvalidEvent
from ingest.events import (
    ACTIVITY,
    BLOCK,
    FOLLOWS,
    MAX_CREATED_AT,
    MAX_HANDLE,
    MAX_ID,
    MAX_NAME,
    MAX_TEXT,
    MUTE,
    TOPICS,
    TWEETS,
    USERS,
    AccountDelete,
    Activity,
    Delete,
    Follow,
    Post,
    Relation,
    Repost,
    Unrepost,
    UserUpsert,
    decode,
    decode_flat,
    encode,
    encode_key,
    flatten,
    load_object,
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
    # DESIGN §4b
    Post(11, 2, T, "@3 a reply", in_reply_to_user_id=3),
    Post(BIG, 1, T, "reply", in_reply_to_user_id=BIG - 1),
    Repost(12, 2, 11, 3, T),
    Repost(BIG, BIG, 1, BIG, MAX_CREATED_AT),  # a repost of one's own tweet is allowed
    Unrepost(12, 2, T),
    Relation(1, 2, T, BLOCK),
    Relation(1, 2, T, BLOCK, active=False),
    Relation(BIG, 1, T, MUTE),
    Relation(BIG, 1, 0, MUTE, active=False),
    AccountDelete(BIG, T),
    Activity(7, T),
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


@pytest.mark.parametrize(("event", "topic", "key", "op"), [
    (Post(1, 2, T, "x", in_reply_to_user_id=3), TWEETS, 2, "post"),
    (Repost(5, 2, 1, 3, T), TWEETS, 2, "repost"),  # the reposter's key, not the author's
    (Unrepost(5, 2, T), TWEETS, 2, "unrepost"),
    (Relation(1, 2, T, BLOCK), FOLLOWS, 2, "block"),  # keyed by the user acted on
    (Relation(1, 2, T, BLOCK, active=False), FOLLOWS, 2, "unblock"),
    (Relation(1, 2, T, MUTE), FOLLOWS, 2, "mute"),
    (Relation(1, 2, T, MUTE, active=False), FOLLOWS, 2, "unmute"),
    (AccountDelete(3, T), USERS, 3, "delete"),
    (Activity(3, T), ACTIVITY, 3, "read"),
])
def test_topics_keys_and_ops_of_the_new_records(event, topic, key, op):
    assert (event.topic, event.key, event.op) == (topic, key, op)
    assert encode(event)[0] == str(key).encode()


def test_new_values_are_compact_json_in_contract_shape():
    assert encode(Post(5, 7, T, "hi", 8))[1] == (
        b'{"v":1,"op":"post","tweet_id":5,"author_id":7,"created_at":%d,"text":"hi",'
        b'"in_reply_to_user_id":8}' % T)
    assert encode(Repost(9, 7, 5, 8, T))[1] == (
        b'{"v":1,"op":"repost","tweet_id":9,"author_id":7,"original_tweet_id":5,'
        b'"original_author_id":8,"created_at":%d}' % T)
    assert encode(Unrepost(9, 7, T))[1] == (
        b'{"v":1,"op":"unrepost","tweet_id":9,"author_id":7,"created_at":%d}' % T)
    assert encode(Relation(1, 2, T, MUTE, active=False))[1] == (
        b'{"v":1,"op":"unmute","follower_id":1,"followee_id":2,"created_at":%d}' % T)
    assert encode(AccountDelete(3, T))[1] == b'{"v":1,"op":"delete","user_id":3,"created_at":%d}' % T


def test_a_post_that_is_not_a_reply_carries_no_reply_field():
    assert b"in_reply_to_user_id" not in encode(Post(5, 7, T, "hi"))[1]
    assert decode(TWEETS, b"7", encode(Post(5, 7, T, "hi"))[1]).in_reply_to_user_id == 0


def test_a_relation_is_a_block_or_a_mute():
    with pytest.raises(ValueError, match="block or mute"):
        Relation(1, 2, T, "follow")


def test_value_is_compact_json_in_contract_shape():
    _, value = encode(Post(5, 7, T, "hi"))
    assert value == b'{"v":1,"op":"post","tweet_id":5,"author_id":7,"created_at":%d,"text":"hi"}' % T


ids = st.integers(1, MAX_ID)
times = st.integers(0, MAX_CREATED_AT)
texts = st.text(min_size=1, max_size=MAX_TEXT).filter(str.strip)


def other(a: int, b: int) -> int:
    """``b``, or another valid id when it equals ``a``."""
    return b if b != a else (a % MAX_ID) + 1


@st.composite
def events(draw):
    kind = draw(st.sampled_from(["post", "reply", "delete", "repost", "unrepost", "follow",
                                 "relation", "upsert", "account_delete", "read"]))
    if kind == "post":
        return Post(draw(ids), draw(ids), draw(times), draw(texts))
    if kind == "reply":
        author = draw(ids)
        return Post(draw(ids), author, draw(times), draw(texts), other(author, draw(ids)))
    if kind in ("delete", "unrepost"):
        return (Delete if kind == "delete" else Unrepost)(draw(ids), draw(ids), draw(times))
    if kind == "repost":
        tweet = draw(ids)
        return Repost(tweet, draw(ids), other(tweet, draw(ids)), draw(ids), draw(times))
    if kind == "follow":
        a = draw(ids)
        return Follow(a, other(a, draw(ids)), draw(times), draw(st.booleans()))
    if kind == "relation":
        a = draw(ids)
        return Relation(a, other(a, draw(ids)), draw(times), draw(st.sampled_from([BLOCK, MUTE])),
                        draw(st.booleans()))
    if kind == "account_delete":
        return AccountDelete(draw(ids), draw(times))
    if kind == "read":
        return Activity(draw(ids), draw(times))
    return UserUpsert(draw(ids), draw(st.text(min_size=1, max_size=MAX_HANDLE).filter(str.strip)),
                      draw(st.text(max_size=MAX_NAME)), draw(times))


@given(events())
def test_round_trip_property(event):
    assert decode(event.topic, *encode(event)) == event


@given(events())
def test_the_flat_decode_is_the_flat_form_of_the_decoded_event(event):
    key, value = encode(event)
    flat = decode_flat(event.topic, key, value)
    assert flat == flatten(decode(event.topic, key, value))
    assert [type(v) for v in flat] == [type(v) for v in flatten(event)]


# -- invalid records ---------------------------------------------------------------

POST = {"v": 1, "op": "post", "tweet_id": 10, "author_id": 2, "created_at": T, "text": "hi"}
DELETE = {"v": 1, "op": "delete", "tweet_id": 10, "author_id": 2, "created_at": T}
FOLLOW = {"v": 1, "op": "follow", "follower_id": 1, "followee_id": 2, "created_at": T}
UPSERT = {"v": 1, "op": "upsert", "user_id": 2, "handle": "h", "name": "n", "created_at": T}
BODIES = {TWEETS: POST, FOLLOWS: FOLLOW, USERS: UPSERT}


def reject(topic: str, body, key: bytes | None = b"2", match: str = "") -> str:
    """The reason ``decode`` refuses the record with; ``decode_flat`` gives the same."""
    value = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    with pytest.raises(InvalidEvent, match=match) as info:
        decode(topic, key, value)
    reason = str(info.value)
    assert reason, "a rejection must carry a reason"
    with pytest.raises(InvalidEvent) as flat:
        decode_flat(topic, key, value)
    assert str(flat.value) == reason
    return reason


def changed(body: dict, **fields) -> dict:
    return {**body, **fields}


def without(body: dict, field: str) -> dict:
    return {k: v for k, v in body.items() if k != field}


@pytest.mark.parametrize("value", [b"{not json", b"", b"\xff\xfe\x00", b'{"v":1,'])
def test_non_json(value):
    reject(TWEETS, value, match="not JSON")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8)


def _loaded(raw: bytes) -> object:
    """What ``load_object`` gives for ``raw``: the object, or its refusal's words."""
    try:
        return load_object(raw)
    except InvalidEvent as exc:
        return f"refused: {exc}"


def _expected(raw: bytes) -> object:
    """The same through plain ``json.loads`` (the definition ``load_object`` shortens)."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"refused: value is not JSON: {exc}"
    if not isinstance(body, dict):
        return f"refused: value is JSON {type(body).__name__}, not an object"
    return body


@given(st.dictionaries(st.text(), json_values, max_size=5),
       st.sampled_from(["", " ", "\n", "\t "]), st.sampled_from(["", " ", "\n", "x", "{}"]),
       st.sampled_from(["utf-8", "utf-16", "utf-16-le", "utf-32", "utf-8-sig"]))
def test_load_object_is_json_loads(body, before, after, encoding):
    raw = (before + json.dumps(body, ensure_ascii=False) + after).encode(encoding, "surrogatepass")
    assert _loaded(raw) == _expected(raw)


@given(st.binary(max_size=40).map(lambda b: b"{" + b))
def test_load_object_refuses_what_json_loads_refuses(raw):
    assert _loaded(raw) == _expected(raw)


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
                                      (FOLLOWS, "post"), (FOLLOWS, "FOLLOW"), (USERS, "remove"),
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


# -- invalid records of DESIGN §4b: a dead-letter reason for each malformed kind -----------

REPLY = changed(POST, in_reply_to_user_id=3)
REPOST = {"v": 1, "op": "repost", "tweet_id": 11, "author_id": 2, "original_tweet_id": 10,
          "original_author_id": 3, "created_at": T}
UNREPOST = {"v": 1, "op": "unrepost", "tweet_id": 11, "author_id": 2, "created_at": T}
RELATION_OPS = ("block", "unblock", "mute", "unmute")
ACCOUNT_DELETE = {"v": 1, "op": "delete", "user_id": 2, "created_at": T}
READ = {"v": 1, "op": "read", "user_id": 2, "created_at": T}
NEW_BODIES = [(TWEETS, REPLY), (TWEETS, REPOST), (TWEETS, UNREPOST),
              *[(FOLLOWS, changed(FOLLOW, op=op)) for op in RELATION_OPS],
              (USERS, ACCOUNT_DELETE), (ACTIVITY, READ)]
NEW_IDS = pytest.mark.parametrize("topic,body", NEW_BODIES, ids=lambda b: b if isinstance(b, str)
                                  else b["op"] + ("_reply" if "in_reply_to_user_id" in b else ""))


@NEW_IDS
def test_the_valid_new_bodies_decode(topic, body):
    event = decode(topic, b"2", json.dumps(body).encode())
    assert (event.topic, event.op, event.key) == (topic, body["op"], 2)
    assert json.loads(encode(event)[1]) == body


@NEW_IDS
def test_missing_fields_of_new_records(topic, body):
    for field in set(body) - {"v", "op", "in_reply_to_user_id"}:
        reject(topic, without(body, field), match=f"missing field {field}")


@NEW_IDS
def test_extra_fields_of_new_records(topic, body):
    reject(topic, changed(body, relation="block"), match="unexpected field.*relation")


@pytest.mark.parametrize("topic,body,field", [
    (TWEETS, REPLY, "in_reply_to_user_id"), (TWEETS, REPOST, "original_tweet_id"),
    (TWEETS, REPOST, "original_author_id"), (TWEETS, UNREPOST, "tweet_id"),
    (USERS, ACCOUNT_DELETE, "user_id"), (ACTIVITY, READ, "user_id")])
def test_wrong_types_and_ranges_of_new_ids(topic, body, field):
    reject(topic, changed(body, **{field: "3"}), match=f"{field} must be an integer, got str")
    reject(topic, changed(body, **{field: True}), match=f"{field} must be an integer, got bool")
    key = b"2" if field != "user_id" else b"0"
    reject(topic, changed(body, **{field: 0}), key=key,
           match=f"{field}=0 is not a positive 64-bit id")


def test_a_reply_needs_a_positive_user_and_null_is_not_zero():
    # 0 means "not a reply" inside the program only; on the wire the field is left out.
    reject(TWEETS, changed(POST, in_reply_to_user_id=None), match="got NoneType")
    reject(TWEETS, changed(POST, in_reply_to_user_id=-3), match="not a positive 64-bit id")


def test_self_reply():
    reason = reject(TWEETS, changed(POST, in_reply_to_user_id=2),
                    match="in_reply_to_user_id=2 is the author")
    assert "self-reply" in reason


@pytest.mark.parametrize("op", RELATION_OPS)
def test_self_block_and_self_mute(op):
    reject(FOLLOWS, changed(FOLLOW, op=op, follower_id=2, followee_id=2),
           match=f"user 2 cannot {op} themselves")


def test_repost_with_its_original_id():
    reject(TWEETS, changed(REPOST, tweet_id=10),
           match="repost tweet_id=10 equals original_tweet_id: a repost has its own id")


@pytest.mark.parametrize("topic,op", [
    (TWEETS, "retweet"), (TWEETS, "undo_repost"), (TWEETS, "Repost"), (TWEETS, "block"),
    (FOLLOWS, "blocks"), (FOLLOWS, "Mute"), (FOLLOWS, "repost"), (FOLLOWS, "unretweet"),
    (USERS, "deleted"), (USERS, "block"), (ACTIVITY, "write"), (ACTIVITY, "delete")])
def test_unknown_op_among_the_new_ones(topic, op):
    body = {TWEETS: REPOST, FOLLOWS: FOLLOW, USERS: ACCOUNT_DELETE, ACTIVITY: READ}[topic]
    reason = reject(topic, changed(body, op=op), match=f"unknown op {op!r} on topic {topic}")
    assert "expected" in reason


@pytest.mark.parametrize("topic,op", [(TWEETS, None), (FOLLOWS, None), (USERS, None),
                                      (ACTIVITY, None)])
def test_missing_op(topic, op):
    body = {TWEETS: REPOST, FOLLOWS: FOLLOW, USERS: ACCOUNT_DELETE, ACTIVITY: READ}[topic]
    reject(topic, without(body, "op"), match=f"unknown op None on topic {topic}")


def test_the_two_deletes_are_told_apart_by_their_fields():
    # DESIGN §4b: the users topic's delete names user_id alone, the tweets topic's
    # delete names tweet_id and author_id; each is refused on the other's topic.
    assert decode(USERS, b"2", json.dumps(ACCOUNT_DELETE).encode()) == AccountDelete(2, T)
    assert decode(TWEETS, b"2", json.dumps(DELETE).encode()) == Delete(10, 2, T)
    reject(USERS, DELETE, match=r"unexpected field\(s\) author_id, tweet_id")
    reject(TWEETS, ACCOUNT_DELETE, match=r"unexpected field\(s\) user_id")
    reject(USERS, changed(UPSERT, op="delete"), match=r"unexpected field\(s\) handle, name")


@pytest.mark.parametrize("topic,body,wrong,right", [
    (TWEETS, REPOST, b"3", 2),       # the original author's key: the reposter's is right
    (TWEETS, UNREPOST, b"3", 2),
    (TWEETS, REPLY, b"3", 2),        # the replied-to user's key: the author's is right
    (FOLLOWS, changed(FOLLOW, op="block"), b"1", 2),  # the acting user's key
    (FOLLOWS, changed(FOLLOW, op="unmute"), b"1", 2),
    (USERS, ACCOUNT_DELETE, b"3", 2),
    (ACTIVITY, READ, b"", 2)])
def test_wrong_key_of_new_records(topic, body, wrong, right):
    reject(topic, body, key=wrong, match=f"does not match the join key {right}")
    reject(topic, body, key=None, match=f"no key .expected {right}")


def test_every_topic_is_covered():
    assert set(TOPICS) == {topic for topic, _ in NEW_BODIES}
