"""ASGI middleware: the Host allow-list, a cap and a deadline on request bodies, strict JSON for
the API, and the security headers every answer carries.

- ``AllowedHosts``: a Host header outside ``--allowed-hosts`` gets 400 (a DNS-rebinding page
  names its own host, so it cannot reach a manager on loopback).
- ``BodyLimit``: bodies over ``max_body`` get 413 after being read and discarded up to a bound
  (so the client sees a status, not a connection reset); a body not received within
  ``body_timeout_s`` gets 408 and the connection is closed (a client that trickles its body
  cannot hold it open); an API body that is not strict JSON (``oomguard.manager.bodies``) gets 422
  before any route or validator sees it. A GET, HEAD or OPTIONS request that announces a body
  (``Content-Length`` above 0, or any ``Transfer-Encoding``) gets 400 and the connection is closed,
  before anything reads it: such a body has no meaning (RFC 9110, section 9.3.1: "content received
  in a GET request has no generally defined semantics ... and might lead some implementations to
  reject the request"), and reading it would let the client hold the connection.
- ``Headers``: the Content-Security-Policy forbids inline script and style, and anything from
  another origin.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from fastapi.responses import JSONResponse

from oomguard.manager.bodies import parse_strict

BODYLESS = ("GET", "HEAD", "OPTIONS")
DRAIN_FACTOR = 16  # read at most this many times the cap before answering 413
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Scope = MutableMapping[str, Any]


def host_name(header: str) -> str:
    """The host of a Host header value: lower case, without port, brackets or a trailing dot."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


class AllowedHosts:
    """400 for a Host header not in the list (``*`` allows any, ``*.example.com`` its subdomains)."""

    def __init__(self, app: Any, hosts: Sequence[str]) -> None:
        self.app = app
        self.any = "*" in hosts
        self.exact = {host_name(h) for h in hosts if not h.startswith("*")}
        self.suffixes = tuple(h[1:].lower() for h in hosts if h.startswith("*."))

    def allowed(self, header: str) -> bool:
        name = host_name(header)
        return bool(name) and (name in self.exact or (bool(self.suffixes) and name.endswith(self.suffixes)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.any:
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        if self.allowed(header):
            await self.app(scope, receive, send)
            return
        response = JSONResponse({"detail": "this Host is not allowed (see --allowed-hosts)"}, status_code=400)
        await response(scope, receive, send)


async def _read_capped(receive: Receive, cap: int, timeout_s: float) -> tuple[bytes, bool] | str | None:
    """The body and whether it went over *cap* (read on up to DRAIN_FACTOR x cap); None if the
    client left; ``"timeout"`` when the whole body did not arrive within *timeout_s*."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    chunks: list[bytes] = []
    size, more, too_big = 0, True, False
    while more:
        try:
            message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.001))
        except asyncio.TimeoutError:
            return "timeout"
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


def announces_body(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """Whether a request's headers (lower-case names, as h11 and ASGI give them) say a body follows."""
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


class BodyLimit:
    """Buffer the body up to the cap, within the deadline; 413, 408 or (API) 422 when it does not do."""

    def __init__(self, app: Any, max_body: int, body_timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s

    def _refusal(self, scope: Scope, read: tuple[bytes, bool] | str) -> JSONResponse | None:
        close = {"Connection": "close"}
        if read == "timeout":
            detail = f"the request body did not arrive within {self.body_timeout_s:g}s"
            return JSONResponse({"detail": detail}, status_code=408, headers=close)
        assert isinstance(read, tuple)
        body, too_big = read
        if too_big:
            return JSONResponse({"detail": f"request body over {self.max_body} bytes"}, status_code=413, headers=close)
        if str(scope.get("path", "")).startswith("/api/") and body:
            problem = parse_strict(body)[1]
            if problem:
                return JSONResponse({"detail": problem}, status_code=422)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] in BODYLESS:
            if announces_body(scope.get("headers", ())):
                detail = f"a {scope['method']} request may not carry a body"
                no_body = JSONResponse({"detail": detail}, status_code=400, headers={"Connection": "close"})
                await no_body(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        read = await _read_capped(receive, self.max_body, self.body_timeout_s)
        if read is None:
            return
        refusal = self._refusal(scope, read)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        assert isinstance(read, tuple)
        body = read[0]
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
