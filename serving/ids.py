"""Ids in URLs: positive 64-bit integers written in decimal (DESIGN §3).

One parser for every route and dependency, reads and writes, so that a bad id is
the same 400 with the same message wherever it appears; and one way to document
an id (:data:`ID_NOTE`, :data:`ID_PATH_SCHEMA`) in the OpenAPI schema.
"""

from __future__ import annotations

from typing import Any

from ingest.events import MAX_ID
from serving.errors import BadRequest

ID_NOTE = ("Ids are positive 64-bit integers up to 2^63-1 and are emitted as decimal "
           "JSON strings: JavaScript numbers hold integers exactly only up to 2^53.")

#: OpenAPI schema of an id in a path. The parameter is parsed as text by the route
#: (exact beyond 2^53, one error message), but documented as what it means.
ID_PATH_SCHEMA: dict[str, Any] = {"type": "integer", "format": "int64", "minimum": 1,
                                  "maximum": MAX_ID}


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
