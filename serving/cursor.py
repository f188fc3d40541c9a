"""Opaque, stable cursors keyed on the timeline position (created_at, tweet_id).

A *position cursor* (``c1.``) names an entry's position. As ``?cursor=`` (a page's
``next_cursor``) it asks for what is strictly older: because the key is a position,
not an index, pages neither skip nor repeat when newer tweets arrive between
requests. As ``?since=`` (a page's ``top_cursor``) it asks for what is strictly
newer (DESIGN §7, *What is new since my top*).

A *gap cursor* (``g1.``) names a span between two positions, a floor and a ceiling:
what a ``since`` read with more new entries than its limit left out. Passed back as
``?since=``, it asks for the entries strictly inside the span, from the bottom up.
"""

from __future__ import annotations

import base64
import binascii
from typing import NamedTuple

from ingest.events import MAX_ID
from serving.errors import BadRequest
from views.delta import Key

_PREFIX = "c1."
_GAP = "g1."


class Since(NamedTuple):
    """What a ``?since=`` read asks for: the entries strictly above ``floor``.

    And strictly below ``ceiling`` (a gap's top), or up to the top of the timeline
    when ``ceiling`` is None.
    """

    floor: Key
    ceiling: Key | None = None


def encode_cursor(key: Key) -> str:
    """The opaque cursor of a timeline position."""
    return _PREFIX + _b64(f"{key[0]}:{key[1]}")


def encode_gap(floor: Key, ceiling: Key) -> str:
    """The opaque cursor of the span strictly between two positions."""
    return _GAP + _b64(f"{floor[0]}:{floor[1]}:{ceiling[0]}:{ceiling[1]}")


def decode_cursor(cursor: str) -> Key:
    """The position a cursor names, or :class:`BadRequest` saying why not."""
    if cursor.startswith(_GAP):
        msg = "a gap_cursor is passed as ?since=, not ?cursor="
        raise BadRequest(msg, field="cursor")
    if not cursor.startswith(_PREFIX) or len(cursor) > 80:
        msg = "cursor is not one this API issued"
        raise BadRequest(msg, field="cursor")
    created, tweet = _numbers(cursor[len(_PREFIX):], 2, "cursor")
    return (created, tweet)


def decode_since(since: str) -> Since:
    """What a ``?since=`` value asks for, or :class:`BadRequest` saying why not.

    A position cursor (a page's ``top_cursor``, or any ``next_cursor``) or a gap cursor
    (a since page's ``gap_cursor``).
    """
    if since.startswith(_PREFIX) and len(since) <= 80:
        created, tweet = _numbers(since[len(_PREFIX):], 2, "since")
        return Since((created, tweet))
    if since.startswith(_GAP) and len(since) <= 140:
        a, b, c, d = _numbers(since[len(_GAP):], 4, "since")
        if (a, b) >= (c, d):
            msg = "since names an empty gap"
            raise BadRequest(msg, field="since")
        return Since((a, b), (c, d))
    msg = "since is not a cursor this API issued"
    raise BadRequest(msg, field="since")


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _numbers(body: str, n: int, field: str) -> list[int]:
    """The ``n`` colon-separated numbers of a cursor's body, each in [0, MAX_ID]."""
    try:
        parts = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).split(b":")
        numbers = [int(p) for p in parts]
    except (binascii.Error, ValueError):
        numbers = []
    if len(numbers) != n:
        msg = f"{field} is malformed"
        raise BadRequest(msg, field=field)
    if not all(0 <= x <= MAX_ID for x in numbers):
        msg = f"{field} is out of range"
        raise BadRequest(msg, field=field)
    return numbers
