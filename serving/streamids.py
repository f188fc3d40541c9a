"""The live stream's window law and its event ids (DESIGN §7, *Live stream*).

A stream (:mod:`serving.stream`) follows a *window*: the keys of the user's first home
page at ``limit`` N, newest first, as ``GET /home`` serves it. Blocks, mutes, deleted
accounts and one entry per original are decided at read time, so the store's row
deltas are not the changes a reader sees; the stream diffs the served window instead.

**The law.** :func:`changes` turns an old window into a new one as ``remove`` events
(keys that left and were not merely pushed off the bottom), then ``add`` events (keys
that are new to the window, the newest first). :func:`fold` is what a client does with
one event: take the key out or put it in, then keep the newest N. Folding the events
of ``changes(old, new)`` into ``old`` gives ``new`` exactly, whatever the two windows
are (``tests/serving/test_stream_ids.py`` holds it on random sequences of windows).
A key pushed off the bottom needs no event: the client's own "keep the newest N"
drops it, and an entry pulled back in from below after a removal is an ``add``.

**Ids.** Each event's SSE id is the window *after* that event, self-contained, so a
client reconnecting with ``Last-Event-ID`` — to any API process, after any restart —
is sent ``changes(its window, the window now)``: exactly what it missed, none twice.
:func:`encode` packs a :class:`Window` into base64url bytes: a version byte and a
mode byte, the view number (a rebuilt or switched view resets, see
:mod:`serving.stream`), the second the window was current (ids past the retention
reset), N's keys — the first key whole, then each next one as the drop in
``created_at`` and its tweet id, either as the change from the previous id or, for
snowflake ids (:mod:`ingest.snowflake`), as the change in the worker and sequence bits
left over when the id its ``created_at`` predicts is taken away; unsigned LEB128 varints, zig-zag where a value may be
negative, the shorter of the two modes — and the CRC-32 of the user and the
bytes, so a corrupt id, or one of another user's stream, is refused (400) rather
than diffed (but for one in 2^32). At N=20 an id of snowflake keys a few seconds
apart is 112 characters (131 when two API workers minted them alternately).
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, NoReturn

from ingest.events import MAX_ID
from ingest.snowflake import EPOCH_MS, SEQUENCE_BITS, WORKER_BITS
from serving.errors import BadRequest
from views.delta import Key

VERSION: Final = 1
#: The largest window an id holds (a stream's ``limit`` is at most this).
MAX_KEYS: Final = 200
#: The longest id accepted (characters): MAX_KEYS keys of two 10-byte varints, and more.
MAX_ID_CHARS: Final = 6_000
_PLAIN, _SNOWFLAKE = 0, 1
_SHIFT: Final = WORKER_BITS + SEQUENCE_BITS
_FIELD: Final = "Last-Event-ID"


@dataclass(frozen=True)
class Window:
    """A window's keys (newest first), the view it was read from, and when (unix seconds)."""

    keys: tuple[Key, ...]
    view: int = 0
    at: int = 0


class Event(NamedTuple):
    """One change to a window: ``add`` or ``remove`` of ``key``."""

    kind: str
    key: Key


# -- the law -------------------------------------------------------------------------------

def changes(old: Sequence[Key], new: Sequence[Key], limit: int) -> list[Event]:
    """The events that take window ``old`` to ``new`` (both newest first) under :func:`fold`.

    Removes first (a key of ``old`` missing from ``new`` unless ``new`` is full and the
    key is below its lowest: pushed off, which the fold drops by itself), then adds,
    the newest first.
    """
    kept, had = set(new), set(old)
    full = len(new) >= limit
    lowest = new[-1] if new else None
    removes = [Event("remove", k) for k in old
               if k not in kept and not (full and lowest is not None and k < lowest)]
    return removes + [Event("add", k) for k in new if k not in had]


def fold(window: Sequence[Key], event: Event, limit: int) -> list[Key]:
    """A client's step: ``window`` (newest first) with ``event`` applied, the newest N kept."""
    if event.kind == "remove":
        return [k for k in window if k != event.key]
    if event.key in window:
        return list(window)
    return sorted([*window, event.key], reverse=True)[:limit]


def steps(old: Sequence[Key], new: Sequence[Key], limit: int
          ) -> Iterator[tuple[Event, list[Key]]]:
    """Each event of :func:`changes` with the window after it (what its id encodes)."""
    window = list(old)
    for event in changes(old, new, limit):
        window = fold(window, event, limit)
        yield event, window


# -- the ids -------------------------------------------------------------------------------

def encode(window: Window, user: int) -> str:
    """``window`` as an SSE id bound to ``user`` (module doc)."""
    head = bytes((VERSION,))
    body = min((_body(window, mode) for mode in (_PLAIN, _SNOWFLAKE)), key=len)
    raw = head + body
    return _b64(raw + _crc(user, raw))


def decode(text: str, user: int) -> Window:
    """The window an id of ``user``'s stream holds, or :class:`BadRequest` saying why not."""
    if not text or len(text) > MAX_ID_CHARS:
        _bad("is not an id this stream sent")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        _bad("is not base64url")
    if len(raw) < 6 or _crc(user, raw[:-4]) != raw[-4:]:
        _bad("is not an id of this user's stream (or is corrupt)")
    if raw[0] != VERSION:
        _bad(f"has version {raw[0]}; this server reads {VERSION}")
    try:
        return _parse(raw[1:-4])
    except (IndexError, ValueError):
        _bad("is malformed")


def _body(window: Window, mode: int) -> bytes:
    out = bytearray((mode,))
    _varint(out, window.view)
    _varint(out, window.at)
    _varint(out, len(window.keys))
    prev: Key | None = None
    residual = 0  # a snowflake id's worker and sequence bits: mostly one worker's
    for created, tweet in window.keys:
        _varint(out, created if prev is None else prev[0] - created)
        if mode == _SNOWFLAKE:
            now = tweet - ((created - EPOCH_MS) << _SHIFT)
            _varint(out, _zigzag(now - residual))
            residual = now
        else:
            _varint(out, tweet if prev is None else _zigzag(tweet - prev[1]))
        prev = (created, tweet)
    return bytes(out)


def _parse(raw: bytes) -> Window:
    mode, at = raw[0], [1]
    if mode not in (_PLAIN, _SNOWFLAKE):
        msg = "mode"
        raise ValueError(msg)
    view, when, n = _read(raw, at), _read(raw, at), _read(raw, at)
    if n > MAX_KEYS:
        msg = "too many keys"
        raise ValueError(msg)
    keys: list[Key] = []
    residual = 0
    for i in range(n):
        first, second = _read(raw, at), _read(raw, at)
        created = first if i == 0 else keys[-1][0] - first
        if mode == _SNOWFLAKE:
            residual += _unzigzag(second)
            tweet = ((created - EPOCH_MS) << _SHIFT) + residual
        else:
            tweet = second if i == 0 else keys[-1][1] + _unzigzag(second)
        key = (created, tweet)
        if not (0 <= created <= MAX_ID and 0 <= tweet <= MAX_ID) or (keys and key >= keys[-1]):
            msg = "keys out of range or order"
            raise ValueError(msg)
        keys.append(key)
    if at[0] != len(raw):
        msg = "trailing bytes"
        raise ValueError(msg)
    return Window(tuple(keys), view, when)


def _varint(out: bytearray, value: int) -> None:
    if value < 0:
        msg = f"varint of a negative number {value}"
        raise ValueError(msg)
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read(raw: bytes, at: list[int]) -> int:
    value = shift = 0
    while True:
        byte = raw[at[0]]
        at[0] += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
        if shift > 70:
            msg = "varint too long"
            raise ValueError(msg)


def _zigzag(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


def _unzigzag(value: int) -> int:
    return value // 2 if value % 2 == 0 else -(value + 1) // 2


def _crc(user: int, raw: bytes) -> bytes:
    return zlib.crc32(raw, zlib.crc32(user.to_bytes(8, "big"))).to_bytes(4, "big")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _bad(why: str) -> NoReturn:
    msg = f"{_FIELD} {why}"
    raise BadRequest(msg, field=_FIELD)
