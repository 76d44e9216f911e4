"""ASGI middleware: a cap on request bodies, and the security headers every answer carries.

Bodies over ``max_body`` get 413 after being read and discarded up to a bound (so the client
sees a status, not a connection reset). The Content-Security-Policy forbids inline script and
style, and anything from another origin.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi.responses import JSONResponse

DRAIN_FACTOR = 16  # read at most this many times the cap before answering 413
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def _read_capped(receive: Receive, cap: int) -> tuple[bytes, bool] | None:
    """The body and whether it went over *cap* (read on up to DRAIN_FACTOR x cap); None if the client left."""
    chunks: list[bytes] = []
    size, more, too_big = 0, True, False
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        more = message.get("more_body", False)
        if size > cap:
            too_big = True
            if size > cap * DRAIN_FACTOR:
                break
        else:
            chunks.append(chunk)
    return b"".join(chunks), too_big


class BodyLimit:
    """Buffer the body up to the cap; answer 413 beyond it."""

    def __init__(self, app: Any, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        read = await _read_capped(receive, self.max_body)
        if read is None:
            return
        body, too_big = read
        if too_big:
            detail = {"detail": f"request body over {self.max_body} bytes"}
            response = JSONResponse(detail, status_code=413, headers={"Connection": "close"})
            await response(scope, receive, send)
            return
        sent = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class Headers:
    """Security headers on every answer, and ``Server-Timing: app;dur=<ms>``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - start) * 1000
                message["headers"] = [
                    *message.get("headers", []),
                    (b"content-security-policy", CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"server-timing", f"app;dur={ms:.2f}".encode()),
                ]
            await send(message)

        await self.app(scope, receive, send_with_headers)
