"""Consistency tokens: where a write landed in the changelog, as an opaque string.

A write through the HTTP API returns the (logical topic, partition, offset) of its
record. The view store records the highest applied offset per (logical topic,
partition), so a read that carries the token can wait until that offset is applied
(read-your-writes, DESIGN §7). The token is base64url of ``topic:partition:offset``
behind a version prefix; it is opaque to clients but not secret and not signed — a
forged token can only make its own read wait (bounded) and say ``consistent: false``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final, NamedTuple

from ingest.errors import InvalidToken
from ingest.events import MAX_ID, TOPICS

_PREFIX: Final = "k1."
#: Longer than any token :func:`encode_token` makes; bounds the decoding work.
MAX_TOKEN: Final = 80
_MAX_PARTITION: Final = 2**31 - 1


class Applied(NamedTuple):
    """A changelog position by logical topic: what a token names."""

    topic: str
    partition: int
    offset: int


def encode_token(topic: str, partition: int, offset: int) -> str:
    """The token of a record at ``offset`` of ``partition`` of logical ``topic``."""
    _check(Applied(topic, partition, offset))
    raw = f"{topic}:{partition}:{offset}".encode("ascii")
    return _PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_token(token: str) -> Applied:
    """The position a token names, or :class:`InvalidToken` saying why not."""
    if not token.startswith(_PREFIX) or len(token) > MAX_TOKEN or not token.isascii():
        msg = "not a consistency token issued by this API"
        raise InvalidToken(msg)
    body = token[len(_PREFIX):]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("ascii")
        topic, partition, offset = raw.split(":")
        position = Applied(topic, _decimal(partition), _decimal(offset))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        msg = "consistency token is malformed"
        raise InvalidToken(msg) from None
    _check(position)
    return position


def _decimal(text: str) -> int:
    # int() also takes "+1", " 1", "1_0" and non-ASCII digits; a token never holds those.
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        msg = f"not a decimal offset: {text[:20]!r}"
        raise ValueError(msg)
    return int(text)


def _check(position: Applied) -> None:
    if position.topic not in TOPICS:
        msg = f"consistency token names an unknown topic {position.topic[:20]!r}"
        raise InvalidToken(msg)
    if not (0 <= position.partition <= _MAX_PARTITION and 0 <= position.offset <= MAX_ID):
        msg = "consistency token is out of range"
        raise InvalidToken(msg)
