"""Opaque, stable page cursors keyed on the timeline position (created_at, tweet_id).

A cursor names the last entry a client has seen; the next page is everything
strictly older. Because the key is a position, not an index, pages neither skip
nor repeat when newer tweets arrive between requests.
"""

from __future__ import annotations

import base64
import binascii

from ingest.events import MAX_ID
from serving.errors import BadRequest
from views.delta import Key

_PREFIX = "c1."


def encode_cursor(key: Key) -> str:
    """The opaque cursor of a timeline position."""
    raw = f"{key[0]}:{key[1]}".encode()
    return _PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> Key:
    """The position a cursor names, or :class:`BadRequest` saying why not."""
    if not cursor.startswith(_PREFIX) or len(cursor) > 80:
        msg = "cursor is not one this API issued"
        raise BadRequest(msg, field="cursor")
    body = cursor[len(_PREFIX):]
    try:
        created, tweet = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).split(b":")
        key = (int(created), int(tweet))
    except (binascii.Error, ValueError):
        msg = "cursor is malformed"
        raise BadRequest(msg, field="cursor") from None
    if not (0 <= key[0] <= MAX_ID and 0 <= key[1] <= MAX_ID):
        msg = "cursor is out of range"
        raise BadRequest(msg, field="cursor")
    return key
