"""Ids in URLs: positive 64-bit integers written in decimal (DESIGN §3).

One parser for every route and dependency, so that a bad id is the same 400 with
the same message wherever it appears.
"""

from __future__ import annotations

from ingest.events import MAX_ID
from serving.errors import BadRequest


def parse_id(raw: str, field: str) -> int:
    """A positive 64-bit id from its decimal form, or :class:`BadRequest` naming ``field``."""
    if not (raw.isascii() and raw.isdigit()):
        msg = f"{field} must be a decimal integer in [1, 2^63-1], got {raw[:40]!r}"
        raise BadRequest(msg, field=field)
    value = int(raw) if len(raw) <= 20 else MAX_ID + 1
    if not 1 <= value <= MAX_ID:
        msg = f"{field} must be in [1, 2^63-1], got {raw[:40]}"
        raise BadRequest(msg, field=field)
    return value
