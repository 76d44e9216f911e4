"""The manager's HTTP service: ingest, read API, Prometheus metrics, health.

Security: agents write with ``Authorization: Bearer <agent token>``, readers with the viewer
token; a role without a token is open (allowed only on loopback, see Settings.check). Tokens
are compared in constant time. Bodies over ``max_body`` get 413 after being read and discarded
up to a bound; invalid JSON or a body that does not fit the models gets 422.
"""

from __future__ import annotations

import hmac
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Cookie, Depends, FastAPI, Header, HTTPException, Path, Query, Response
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError

from oomguard._version import __version__
from oomguard.manager.db import make_engine
from oomguard.manager.metrics import render_metrics
from oomguard.manager.models import NODE_PATTERN, EventEnvelope, ReportEnvelope, Stored
from oomguard.manager.settings import Settings
from oomguard.manager.store import SORT_KEYS, Store, parse_iso_ms
from oomguard.manager.views import CSP

DRAIN_FACTOR = 16  # read at most this many times the cap before answering 413


class BodyLimit:
    """ASGI middleware: buffer the body up to the cap; answer 413 beyond it (after draining a bounded amount)."""

    def __init__(self, app: Any, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more, too_big = 0, True, False
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            more = message.get("more_body", False)
            if size > self.max_body:
                too_big = True
                if size > self.max_body * DRAIN_FACTOR:
                    break
            else:
                chunks.append(chunk)
        if too_big:
            response = JSONResponse(
                {"detail": f"request body over {self.max_body} bytes"}, status_code=413, headers={"Connection": "close"}
            )
            await response(scope, receive, send)  # type: ignore[arg-type]
            return
        body = b"".join(chunks)
        sent = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class Headers:
    """ASGI middleware: security headers on every answer, and ``Server-Timing: app;dur=<ms>``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
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


def _bearer(authorization: str | None) -> str | None:
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None


def _check(expected: str | None, authorization: str | None) -> None:
    if expected is None:
        return
    given = _bearer(authorization)
    if given is None or not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})


def create_app(settings: Settings, store: Store | None = None) -> FastAPI:
    """The ASGI app. The schema must exist already (``oomguard.manager.db.migrate``)."""
    store = store or Store(
        make_engine(settings.db_url), default_interval_s=settings.interval_s, retention_s=settings.retention_s
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()

        def thinner() -> None:
            while not stop.wait(settings.thin_every_s):
                try:
                    store.thin()
                except Exception as exc:
                    print(f"oomguard manager: retention pass failed: {exc}", flush=True)

        t = threading.Thread(target=thinner, name="oomguard-retention", daemon=True)
        t.start()
        yield
        stop.set()

    app = FastAPI(
        title="oomguard manager",
        version=__version__,
        lifespan=lifespan,
        description="Every node's memory truth and OOM history. Agents POST reports and events; "
        "readers GET nodes, alerts and metrics.",
    )
    app.state.store = store

    @app.exception_handler(DBAPIError)
    async def database_unavailable(request: Any, exc: DBAPIError) -> JSONResponse:
        # Not the client's fault and worth a retry: agents keep the report in their spool.
        return JSONResponse(
            {"detail": "the database is unavailable; try again later"}, status_code=503, headers={"Retry-After": "5"}
        )

    app.add_middleware(BodyLimit, max_body=settings.max_body)
    app.add_middleware(Headers)

    def agent(authorization: Annotated[str | None, Header()] = None) -> None:
        _check(settings.agent_token, authorization)

    def viewer(
        authorization: Annotated[str | None, Header()] = None,
        oomguard_viewer: Annotated[str | None, Cookie()] = None,
    ) -> None:
        if authorization is None and oomguard_viewer is not None:  # the dashboard's cookie (raw JSON links)
            authorization = f"Bearer {oomguard_viewer}"
        _check(settings.viewer_token, authorization)

    @app.post(
        "/api/v1/reports",
        response_model=Stored,
        dependencies=[Depends(agent)],
        responses={413: {"description": "body too large"}},
    )
    async def post_report(body: ReportEnvelope) -> Stored:
        report = body.report.model_dump()  # python mode: NaN stays NaN, and is refused below
        try:
            report_json = json.dumps(report, allow_nan=False)
        except ValueError:
            raise HTTPException(422, "the report contains NaN or infinite numbers") from None
        stored = await store.ingest_report_async(body, report_json, parse_iso_ms(body.time))
        return Stored(stored=stored, id=body.id)

    @app.post(
        "/api/v1/events",
        response_model=Stored,
        dependencies=[Depends(agent)],
        responses={413: {"description": "body too large"}},
    )
    async def post_event(body: EventEnvelope) -> Stored:
        try:
            body_json = json.dumps(body.event.model_dump(), allow_nan=False)
        except ValueError:
            raise HTTPException(422, "the event contains NaN or infinite numbers") from None
        return Stored(stored=await store.ingest_event_async(body, body_json), id=body.id)

    @app.get("/api/v1/nodes", dependencies=[Depends(viewer)])
    def get_nodes(
        status: Annotated[str | None, Query(pattern="^(online|offline)$")] = None,
        q: Annotated[str | None, Query(max_length=128)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
        sort: Annotated[str, Query(pattern="^-?(" + "|".join(SORT_KEYS) + ")$")] = "name",
    ) -> dict[str, Any]:
        return store.list_nodes(status=status, q=q, limit=limit, offset=offset, sort=sort)

    @app.get("/api/v1/nodes/{name}", dependencies=[Depends(viewer)])
    def get_node(name: Annotated[str, Path(pattern=NODE_PATTERN, max_length=128)]) -> dict[str, Any]:
        detail = store.node_detail(name)
        if detail is None:
            raise HTTPException(404, f"no node named {name!r}")
        return detail

    @app.get("/api/v1/alerts", dependencies=[Depends(viewer)])
    def get_alerts() -> dict[str, Any]:
        return {"alerts": store.alerts()}

    @app.get("/metrics", dependencies=[Depends(viewer)], response_class=Response)
    def metrics() -> Response:
        text, content_type = render_metrics(store.metric_rows())
        return Response(text, media_type=content_type)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    from oomguard.manager.views import install

    install(app, settings, store)
    return app
