"""A record's JSON body and the rules of its fields: what makes a value valid.

:func:`load_object` reads a record's value as one JSON object; :func:`only`,
:func:`id_of`, :func:`time_of` and :func:`text_of` check its fields against the
contract's value rules (DESIGN §3): ids are integers in [1, 2^63-1], event times epoch
milliseconds up to year 9999, text valid Unicode within a limit. Each raises
:class:`~ingest.errors.InvalidEvent` with a reason a person can act on. Which fields
a record has, and which rule each follows, is its kind's (``ingest.events``).
"""

from __future__ import annotations

import json
import json.scanner
from typing import Any, Final

from ingest.errors import InvalidEvent

MAX_ID: Final = 2**63 - 1
#: Event times are epoch milliseconds; anything past year 9999 is a unit mistake.
MAX_CREATED_AT: Final = 253_402_300_799_999


_SCAN: Final = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[attr-defined,arg-type]


def load_object(raw: bytes | str) -> dict[str, Any]:
    """A JSON object from ``raw``, or :class:`InvalidEvent` saying why not.

    What ``json.loads(raw)`` returns, by a shorter road for the usual record: UTF-8
    bytes holding exactly one object. ``json.loads`` would guess the encoding and
    match whitespace with a regular expression before and after the object, a third
    of a record's decode; anything else takes that road as before.
    """
    if type(raw) is bytes and raw[:1] == b"{" and raw[1:2] != b"\x00":
        try:
            text = raw.decode("utf-8", "surrogatepass")  # what json.loads would pick
            body, end = _SCAN(text, 0)
        except (UnicodeDecodeError, StopIteration, ValueError):
            pass  # json.loads below says why
        else:
            if end == len(text):
                return body  # type: ignore[no-any-return]  # an object: it began with {
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        msg = f"value is not JSON: {exc}"
        raise InvalidEvent(msg) from None
    if not isinstance(body, dict):
        msg = f"value is JSON {type(body).__name__}, not an object"
        raise InvalidEvent(msg)
    return body


def only(body: dict[str, Any], allowed: frozenset[str]) -> None:
    """Refuse a body that holds a name besides ``allowed``."""
    if body.keys() <= allowed:
        return
    extra = sorted(body.keys() - allowed)
    if extra:
        msg = f"unexpected field(s) {', '.join(extra)}"
        raise InvalidEvent(msg)


def int_of(body: dict[str, Any], field: str) -> int:
    """The integer ``field`` of ``body`` (JSON true is not one)."""
    if field not in body:
        msg = f"missing field {field}"
        raise InvalidEvent(msg)
    value = body[field]
    # bool is an int subclass in Python; JSON true is never an id.
    if not isinstance(value, int) or isinstance(value, bool):
        msg = f"{field} must be an integer, got {type(value).__name__}"
        raise InvalidEvent(msg)
    return value


def id_of(body: dict[str, Any], field: str) -> int:
    """The id ``field`` of ``body``: a positive 64-bit integer."""
    value = int_of(body, field)
    if not 1 <= value <= MAX_ID:
        msg = f"{field}={value} is not a positive 64-bit id"
        raise InvalidEvent(msg)
    return value


def time_of(body: dict[str, Any]) -> int:
    """The event time of ``body``: ``created_at`` in epoch milliseconds."""
    value = int_of(body, "created_at")
    if not 0 <= value <= MAX_CREATED_AT:
        msg = f"created_at={value} is not epoch milliseconds"
        raise InvalidEvent(msg)
    return value


def text_of(body: dict[str, Any], field: str, limit: int, *, allow_empty: bool) -> str:
    """The text ``field`` of ``body``: valid Unicode, at most ``limit`` characters."""
    if field not in body:
        msg = f"missing field {field}"
        raise InvalidEvent(msg)
    value = body[field]
    if not isinstance(value, str):
        msg = f"{field} must be a string, got {type(value).__name__}"
        raise InvalidEvent(msg)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        msg = f"{field} is not valid Unicode text (lone surrogate)"
        raise InvalidEvent(msg) from None
    if len(value) > limit:
        msg = f"{field} is {len(value)} characters, over the limit of {limit}"
        raise InvalidEvent(msg)
    if not allow_empty and not value.strip():
        msg = f"{field} is empty"
        raise InvalidEvent(msg)
    return value
