"""ASGI middleware of the API: request body limit and error containment.

Both are plain ASGI classes (not ``BaseHTTPMiddleware``), so they add no task per
request and see the raw byte stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Final

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

TOO_LARGE: Final = HTTPStatus.REQUEST_ENTITY_TOO_LARGE


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with a JSON 413.

    A declared Content-Length over the limit is refused before the app runs; a
    chunked body is counted as it streams and refused once it passes the limit
    (the app's body read raises an HTTPException the error handlers turn into
    JSON), so no body larger than the limit is ever buffered whole.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse()(scope, receive, send)
            return
        seen = 0

        async def counting() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise HTTPException(TOO_LARGE, detail=self._message())
            return message

        await self.app(scope, counting, send)

    def _message(self) -> str:
        return f"request body is larger than {self.limit} bytes"

    def _refuse(self) -> Response:
        code = TOO_LARGE.phrase.lower().replace(" ", "_")
        return JSONResponse({"error": code, "message": self._message()}, status_code=TOO_LARGE,
                            headers={"Connection": "close"})


class ContainErrors:
    """Answer an unexpected exception with the JSON 500 and keep the connection.

    The app's ``Exception`` handler alone is not enough: Starlette's
    ServerErrorMiddleware re-raises after answering (so servers can log), and
    uvicorn then closes the keep-alive connection under the client. This sits inside
    it and stops the exception once the 500 has been sent.
    """

    def __init__(self, app: ASGIApp,
                 answer: Callable[[Request, Exception], Awaitable[Response]]) -> None:
        self.app, self.answer = app, answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as exc:
            if started:
                raise
            response = await self.answer(Request(scope), exc)
            await response(scope, receive, send)
