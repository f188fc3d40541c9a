"""A kind of record is declared once (``ingest.events.KINDS``), and everything else follows.

Every kind round-trips through what the table derives (its JSON, its flat form, the
source row), the join and the reference have a rule for each, the codes that
checkpoints and stored rows hold never move, and the JSON the table writes is, byte for
byte, what ``json.dumps`` writes of the body. A kind declared outside the table (a
"quote", as the issue that asked for the table puts it) shows what a row derives.
"""

from __future__ import annotations

import dataclasses
import json
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.checks import logtail
from ingest import events
from ingest.errors import InvalidEvent
from ingest.events import (
    FOLLOWS,
    KINDS,
    MAX_CREATED_AT,
    MAX_HANDLE,
    MAX_ID,
    MAX_NAME,
    MAX_TEXT,
    OPS,
    TOPICS,
    TWEETS,
    Follow,
    Kind,
    Post,
    decode,
    encode,
    flatten,
    unflatten,
)
from ingest.fields import id_of, only, text_of, time_of
from ingest.kinds import FLAT_COLUMNS, Columns, Record, RecordKind, flattener, writer
from serving.render import hydrated, page_body
from serving.shapes import parse_page
from serving.timeline import home_page
from views import join, reference
from views.join import Change, JoinConfig, apply_batch
from views.reference import Reference
from views.row import EVENT_COLUMNS, event_fields, to_event
from views.source import event_row
from views.stores.sqlite import SQLiteStore

T = 1_704_067_200_000

#: The codes as they were when the table replaced the enumerations: checkpoints and
#: stored rows hold them, so they never change.
CODES = {"INVALID": 0, "POST": 1, "DELETE": 2, "FOLLOW": 3, "UNFOLLOW": 4, "USER": 5,
         "REPOST": 6, "UNREPOST": 7, "BLOCK": 8, "UNBLOCK": 9, "MUTE": 10, "UNMUTE": 11,
         "USER_DELETE": 12, "ACTIVITY": 13}


def _value(name: str, kind: type, draw: st.DrawFn | None = None) -> Any:
    """A valid value of a body field (drawn, or a fixed one)."""
    if name == "created_at":
        return draw(st.integers(0, MAX_CREATED_AT)) if draw else T
    if kind is int:
        return draw(st.integers(1, MAX_ID)) if draw else 7
    limit = {"handle": MAX_HANDLE, "name": MAX_NAME}.get(name, MAX_TEXT)
    return draw(st.text(min_size=1, max_size=limit).filter(str.strip)) if draw else "hi"


def _body(kind: RecordKind, draw: st.DrawFn | None = None) -> dict[str, Any]:
    """A valid body of ``kind``: distinct ids, so no self-follow or repost of itself."""
    types = kind.field_types()
    body: dict[str, Any] = {"v": 1, "op": kind.op}
    for i, name in enumerate(kind.body):
        if name == "in_reply_to_user_id":
            continue  # optional, and a self-reply is refused: the property test adds it
        body[name] = _value(name, types[name], draw)
        if draw is None and types[name] is int and name != "created_at":
            body[name] += i
    return body


def _event(kind: RecordKind) -> Any:
    body = _body(kind)
    return decode(kind.topic, str(body[kind.columns.key]).encode(), json.dumps(body).encode())


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind.name)
def test_every_kind_round_trips_through_what_its_row_derives(kind: RecordKind) -> None:
    event = _event(kind)
    assert (type(event), event.op, event.topic) == (kind.event, kind.op, kind.topic)
    assert event.key == getattr(event, kind.columns.key)
    assert decode(kind.topic, *encode(event)) == event
    fields = event_fields(event)
    assert fields[0] == kind.kind and to_event(*fields) == event
    row = event_row(kind.topic, 3, 9, *encode(event))
    assert row[:3] == (kind.topic, 3, 9) and row[3:11] == fields


def test_codes_never_move_and_each_kind_is_declared_once() -> None:
    assert {k.name: int(k) for k in Kind} == CODES
    assert sorted(k.kind for k in KINDS) == [k for k in Kind if k != Kind.INVALID]
    assert sum(len(ops) for ops in OPS.values()) == len(KINDS)
    assert set(OPS) == set(TOPICS)


def test_the_source_rows_event_columns_are_the_flat_form() -> None:
    assert EVENT_COLUMNS == FLAT_COLUMNS


def test_the_join_and_the_reference_have_a_rule_for_every_kind() -> None:
    events = [_event(k) for k in KINDS]
    by_key: dict[int, list[Change]] = {}
    for offset, event in enumerate(events):
        by_key.setdefault(event.key, []).append(Change.of(event, offset))
    for key, changes in by_key.items():
        apply_batch(None, key, changes, JoinConfig())
    Reference().add(events).home(7, 10)


@pytest.mark.parametrize("topic", TOPICS)
def test_an_unknown_op_names_the_topics_ops(topic: str) -> None:
    ops = list(OPS[topic])
    with pytest.raises(InvalidEvent) as info:
        decode(topic, b"7", b'{"v":1,"op":"nope"}')
    expected = ops[0] if len(ops) == 1 else f"{', '.join(ops[:-1])} or {ops[-1]}"
    assert str(info.value) == f"unknown op 'nope' on topic {topic} (expected {expected})"


@st.composite
def bodies(draw: st.DrawFn) -> tuple[RecordKind, dict[str, Any]]:
    kind = draw(st.sampled_from(KINDS))
    body = _body(kind, draw)
    if kind.topic == FOLLOWS:
        body["follower_id"] = body["followee_id"] % MAX_ID + 1
    if "original_tweet_id" in body:
        body["original_tweet_id"] = body["tweet_id"] % MAX_ID + 1
    if "in_reply_to_user_id" in kind.body and draw(st.booleans()):
        body["in_reply_to_user_id"] = body["author_id"] % MAX_ID + 1
    return kind, body


@given(bodies())
def test_the_json_written_is_json_dumps_of_the_body(drawn: tuple[RecordKind, dict]) -> None:
    kind, body = drawn
    value = json.dumps(body, separators=(",", ":")).encode()
    event = decode(kind.topic, str(body[kind.columns.key]).encode(), value)
    assert encode(event)[1] == value


# -- a kind declared outside the table: what its row derives ---------------------------------

class _Codes(IntEnum):
    QUOTE = 14


@dataclasses.dataclass(frozen=True, slots=True)
class Quote(Record):
    """A post that quotes another tweet, and may reply too (not part of the contract)."""

    tweet_id: int
    author_id: int
    created_at: int
    quoted_tweet_id: int
    text: str
    in_reply_to_user_id: int = 0
    op = "quote"
    topic = TWEETS

    @property
    def key(self) -> int:
        return self.author_id


def _parse_quote(body: dict[str, Any], kind: RecordKind) -> tuple[Any, ...]:
    only(body, kind.allowed)
    reply_to = id_of(body, "in_reply_to_user_id") if "in_reply_to_user_id" in body else 0
    return (id_of(body, "tweet_id"), id_of(body, "author_id"), time_of(body),
            id_of(body, "quoted_tweet_id"), text_of(body, "text", MAX_TEXT, allow_empty=False),
            reply_to)


QUOTE = RecordKind(_Codes.QUOTE, Quote.op, Quote, _parse_quote,
                   Columns("author_id", tweet_id="tweet_id", other_id="in_reply_to_user_id",
                           ref_id="quoted_tweet_id", text="text"))


def test_a_row_derives_a_new_kinds_body_flat_form_and_json() -> None:
    quote = Quote(5, 7, T, 3, 'a "quote"')
    assert QUOTE.allowed == {"v", "op", "tweet_id", "author_id", "created_at",
                             "quoted_tweet_id", "text", "in_reply_to_user_id"}
    assert flattener([QUOTE])(quote) == (_Codes.QUOTE, 7, T, 5, 0, 3, 'a "quote"', None)
    assert QUOTE.event_of((7, T, 5, 0, 3, 'a "quote"', None)) == quote
    body = {"v": 1, "op": "quote", "tweet_id": 5, "author_id": 7, "created_at": T,
            "quoted_tweet_id": 3, "text": 'a "quote"'}
    assert writer(QUOTE, 1)(quote) == json.dumps(body, separators=(",", ":")).encode()
    fields = QUOTE.parse(body, QUOTE)
    assert QUOTE.event_from(fields) == quote
    assert QUOTE.flat_of(fields) == flattener([QUOTE])(quote)
    assert QUOTE.key_at == 1  # author_id, the join key


def test_a_row_must_give_every_body_field_a_column() -> None:
    with pytest.raises(TypeError, match="Quote.quoted_tweet_id has no column"):
        RecordKind(_Codes.QUOTE, Quote.op, Quote, _parse_quote,
                   Columns("author_id", tweet_id="tweet_id", text="text"))


def test_flatten_and_unflatten_refuse_what_no_kind_declares() -> None:
    with pytest.raises(TypeError, match="no row layout"):
        flatten(Quote(5, 7, T, 3, "q"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="row kind 14 carries no event"):
        unflatten(14, 7, T, 5, 0, 3, "q", None)


# -- the same kind, end to end: what a row of KINDS and two lines make of it ---------------------

@pytest.fixture
def quote_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    """QUOTE as a row of ``KINDS``, its rule's line and its fold's line would make it.

    Each table ``ingest.events`` derives from ``KINDS`` gains the row (its code, its op
    on ``tweets``, its flat form, its JSON); the join posts it with the post's rule and
    the reference folds it as a post, and logtail names its author (``docs/design.md``,
    "Kinds of record", lists the files a quote in the contract would touch). Nothing
    else is told of it.
    """
    assert len(join._RULES) == QUOTE.kind  # the next code: the rule goes at its index
    monkeypatch.setitem(events.BY_CODE, int(QUOTE.kind), QUOTE)
    monkeypatch.setitem(events.OPS[TWEETS], QUOTE.op, QUOTE)
    monkeypatch.setitem(events._FLATTEN, Quote, flattener([QUOTE]))
    monkeypatch.setitem(events._WRITE, Quote, writer(QUOTE, events.VERSION))
    monkeypatch.setattr(join, "_RULES", [*join._RULES, join._post])
    monkeypatch.setitem(reference._FOLDS, Quote, Reference._post)
    monkeypatch.setitem(logtail._NAMED, Quote, logtail._author)


@pytest.mark.usefixtures("quote_declared")
def test_a_quote_is_decoded_fanned_out_stored_and_served_with_the_tweet_it_quotes(
        tmp_path: Path) -> None:
    reader, author, other = 1, 7, 9
    body = {"v": 1, "op": "quote", "tweet_id": 5, "author_id": author, "created_at": T + 2,
            "quoted_tweet_id": 3, "text": "look", "in_reply_to_user_id": other}
    value = json.dumps(body, separators=(",", ":")).encode()
    quote = decode(TWEETS, str(author).encode(), value)
    assert quote == Quote(5, author, T + 2, 3, "look", other) and encode(quote)[1] == value
    assert logtail.named_users(quote) == (author,)  # type: ignore[arg-type]
    history = [Follow(reader, author, T), Follow(reader, other, T), Post(3, other, T + 1, "hi"),
               quote]
    by_key: dict[int, list[Change]] = {}
    for offset, event in enumerate(history):
        by_key.setdefault(event.key, []).append(Change.of(event, offset))
    deltas = [d for key, changes in by_key.items()
              for d in apply_batch(None, key, changes, JoinConfig())[1]]
    store = SQLiteStore(tmp_path / "view.sqlite").open()
    try:
        store.apply(deltas)
        assert store.tweets([5])[5][-2:] == (QUOTE.kind, 3)
        page = home_page(store, reader, None, 10)
        served = parse_page(page_body(reader, hydrated(store, page.entries, page.tweets,
                                                       page.users), page.next_key))
    finally:
        store.close()
    first, second = served["entries"]
    assert (first["tweet_id"], first["kind"], second["tweet_id"]) == ("5", "reply", "3")
    assert first["tweet"]["referenced_tweets"] == [{"type": "quote", "id": "3"}]
    assert first["tweet"]["in_reply_to_user_id"] == str(other)
    assert "referenced_tweets" not in second["tweet"]
    expected = Reference().add(history).home(reader, 10)
    assert [(str(r.entry_id), r.created_at) for r in expected] == [
        (e["tweet_id"], e["created_at"]) for e in served["entries"]]
