"""The query-parameter guard every route uses: unknown parameters are a 400, not ignored.

A typo such as ``?limt=5`` would otherwise be dropped silently and the client would
get a default it did not ask for; routes that take no query parameters refuse any.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Set

from fastapi import Request

from serving.errors import BadRequest


def only_query(allowed: Set[str] = frozenset()) -> Callable[[Request], Awaitable[None]]:
    """A dependency refusing query parameters outside ``allowed`` (typos, mostly).

    Async although it does no I/O: FastAPI runs a sync dependency on a worker thread.
    """
    takes = ", ".join(sorted(allowed)) or "none"

    async def check(request: Request) -> None:
        unknown = sorted(set(request.query_params) - allowed)
        if unknown:
            name = unknown[0][:40]
            msg = f"unknown query parameter {name!r}; this route takes {takes}"
            raise BadRequest(msg, field=name)

    return check
