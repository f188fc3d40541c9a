"""The live stream's window law and its ids (:mod:`serving.streamids`).

The ids round-trip any window (any keys in [0, 2^63-1], newest first) and refuse what
they did not make: a cut, a flipped byte, another user's id, another version. The law:
a client that folds the events of each change into what it holds — and, at any
moment, drops the connection and resumes from the last id it received — holds each
window as served, with no add of a key it held, no remove of one it did not, and every
id naming exactly the window it holds after that event.
"""

from __future__ import annotations

import base64
import time

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from ingest.events import MAX_ID
from ingest.snowflake import EPOCH_MS
from serving.errors import BadRequest
from serving.streamids import MAX_KEYS, Event, Window, changes, decode, encode, fold, steps
from views.delta import Key

USER = 7


def windows(universe: list[Key], limit: int) -> st.SearchStrategy[list[Key]]:
    return st.lists(st.sampled_from(universe), max_size=limit, unique=True).map(
        lambda keys: sorted(keys, reverse=True))


keys_any = st.lists(st.tuples(st.integers(0, MAX_ID), st.integers(0, MAX_ID)),
                    max_size=MAX_KEYS, unique=True).map(lambda k: tuple(sorted(k, reverse=True)))


@settings(max_examples=300, deadline=None)
@given(keys=keys_any, view=st.integers(0, 2**40), at=st.integers(0, 2**40),
       user=st.integers(1, MAX_ID))
def test_an_id_round_trips_any_window(keys, view, at, user):
    window = Window(keys, view, at)
    assert decode(encode(window, user), user) == window


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _raw(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@settings(max_examples=200, deadline=None)
@given(keys=keys_any.filter(bool), cut=st.integers(1, 1000), flip=st.integers(0, 10_000),
       bit=st.integers(0, 7))
def test_a_damaged_or_foreign_id_is_refused(keys, cut, flip, bit):
    text = encode(Window(keys, 1, 2), USER)
    raw = _raw(text)
    damaged = bytearray(raw)
    damaged[flip % len(raw)] ^= 1 << bit
    for bad in (text[:-(cut % len(text)) or -1], _b64(bytes(damaged)), text + "A",
                "", "!!not base64!!", "A" * 10_000):
        with pytest.raises(BadRequest) as caught:
            decode(bad, USER)
        assert caught.value.field == "Last-Event-ID"
    with pytest.raises(BadRequest):
        decode(text, USER + 1)  # another user's stream


def test_another_version_is_refused_with_its_number():
    text = encode(Window(((5, 1),), 0, 0), USER)
    raw = bytearray(_raw(text)[:-4])
    raw[0] = 9
    from serving.streamids import _crc  # the check of a well-formed id of version 9
    with pytest.raises(BadRequest, match="version 9"):
        decode(_b64(bytes(raw) + _crc(USER, bytes(raw))), USER)


def test_an_id_at_twenty_entries_is_small():
    """Snowflake keys a few seconds apart, as a busy home holds: the measure DESIGN §7 cites."""
    now = int(time.time() * 1000)
    keys, at = [], now
    for i in range(20):
        at -= 2_000 + 997 * i
        keys.append((at, ((at - EPOCH_MS) << 22) | (17 << 12) | i % 4))
    text = encode(Window(tuple(keys), 3, now // 1000), USER)
    assert len(text) <= 120, len(text)  # 112 when measured
    plain = tuple((1_700_000_000_000 - 1000 * i, 500 + i) for i in range(20))  # small ids
    assert len(encode(Window(plain, 0, 0), USER)) <= 100


# -- the law ------------------------------------------------------------------------------

class Client:
    """Folds events; counts what a correct stream never sends."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held, self.last = limit, [], None
        self.duplicated = self.phantom = 0

    def take(self, ev: Event, ident: str) -> None:
        if (ev.kind == "add") == (ev.key in self.held):
            self.duplicated += ev.kind == "add"  # an add of a key it holds
            self.phantom += ev.kind == "remove"  # a remove of a key it does not
        self.held = fold(self.held, ev, self.limit)
        assert decode(ident, USER).keys == tuple(self.held)  # the id is the state
        self.last = ident


def _send(client: Client, old: list[Key], new: list[Key], stop: int | None) -> None:
    """The events of old → new, as the server sends them; the client leaves after ``stop``."""
    for i, (ev, window) in enumerate(steps(old, new, client.limit)):
        if stop is not None and i >= stop:
            return
        client.take(ev, encode(Window(tuple(window), 0, 0), USER))


@settings(max_examples=400, deadline=None)
@given(data=st.data(), limit=st.integers(1, 6), size=st.integers(1, 14))
def test_folding_the_events_gives_each_window_even_across_resumes(data, limit, size):
    universe = [(t // 2, t) for t in range(size)]
    pages = data.draw(st.lists(windows(universe, limit), min_size=1, max_size=12))
    client = Client(limit)
    served: list[Key] = []  # what the server's stream last sent this client up to
    for page in pages:
        leave = data.draw(st.none() | st.integers(0, 2 * limit))
        _send(client, served, page, leave)
        if leave is not None:  # reconnect (any process): the server diffs the id's window
            resumed = list(decode(client.last, USER).keys) if client.last else []
            event("resumed mid-change" if resumed != page else "resumed after a change")
            _send(client, resumed, page, None)
        served = page
        assert client.held == page  # none missed, none extra, in order
    assert client.duplicated == client.phantom == 0


@given(old=st.lists(st.integers(0, 30), unique=True), new=st.lists(st.integers(0, 30),
                                                                   unique=True),
       limit=st.integers(1, 8))
def test_a_key_pushed_off_the_bottom_is_not_removed(old, new, limit):
    old_w = sorted(((k, k) for k in old), reverse=True)[:limit]
    new_w = sorted(((k, k) for k in new), reverse=True)[:limit]
    removed = {e.key for e in changes(old_w, new_w, limit) if e.kind == "remove"}
    for key in set(old_w) - set(new_w):
        pushed = len(new_w) == limit and key < new_w[-1]
        assert (key in removed) != pushed
