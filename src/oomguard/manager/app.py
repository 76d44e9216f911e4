"""The manager's ASGI app, wired: the API (``web.api``), the dashboard (``web.views``,
``web.forget``), their middleware, and the retention thread for the app's lifetime.

Routes reach the store, the settings, the database health, the sessions and the failure limiter
through ``app.state`` (``web.deps``). A database that fails or hangs answers 503 with ``Retry-After``
(not the client's fault: agents keep the report in their spool), counted and logged once per
episode (``store.health``). A request its envelope refuses answers 422 with the reasons, never echoing
the input back (FastAPI's default handler does, and fails on NaN). The API is described by
``/openapi.json``; there is no ``/docs`` or ``/redoc`` page, whose scripts would come from a CDN
that the Content-Security-Policy (rightly) blocks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from oomguard._version import __version__
from oomguard.manager.db import make_engine
from oomguard.manager.redact import Redactor
from oomguard.manager.retention import RetentionThread
from oomguard.manager.settings import Settings
from oomguard.manager.store import Store
from oomguard.manager.store.health import DatabaseUnavailable, DbHealth
from oomguard.manager.web import api, forget, pages, views
from oomguard.manager.web.middleware import AllowedHosts, BodyLimit, Headers
from oomguard.manager.web.sessions import FailureLimiter, Sessions

DESCRIPTION = (
    "Every node's memory truth and OOM history. Agents POST reports and events; readers GET nodes, alerts and metrics."
)
RETRY_AFTER_S = 5


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Retention passes while the app serves."""
    retention = RetentionThread(app.state.store.thin, app.state.settings.thin_every_s).start()
    yield
    retention.stop()


def _unavailable(kind: str) -> JSONResponse:
    return JSONResponse(
        {"detail": f"the database is unavailable ({kind}); try again later"},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 for a database failure: from ``deps.db_read``/``db_write`` (counted there already), or
    any other that escaped a route (counted and logged here)."""
    if not isinstance(exc, DatabaseUnavailable):
        health: DbHealth = request.app.state.health
        exc = health.failure("writes" if request.method == "POST" else "reads", exc)
    assert isinstance(exc, DatabaseUnavailable)
    return _unavailable(exc.kind)


async def validation_failed(request: Request, exc: Exception) -> JSONResponse:
    """422 with where and why (at most 20 reasons), without the input: never an echo of the body."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    detail = [
        {
            "loc": [p if isinstance(p, int) else str(p)[:100] for p in e.get("loc", ())],
            "msg": str(e.get("msg", ""))[:300],
            "type": str(e.get("type", "")),
        }
        for e in errors[:20]
    ]
    return JSONResponse({"detail": detail}, status_code=422)


def create_app(settings: Settings, store: Store | None = None) -> FastAPI:
    """The ASGI app. The schema must exist already (``oomguard.manager.db.migrate``)."""
    if store is None:
        engine = make_engine(settings.db_url, timeout_s=settings.db_timeout_s)
        store = Store(
            engine,
            default_interval_s=settings.interval_s,
            retention_s=settings.retention_s,
            forget_after_s=settings.forget_after_s,
        )
    app = FastAPI(
        title="oomguard manager",
        version=__version__,
        lifespan=lifespan,
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
    )
    app.state.store = store
    app.state.settings = settings
    app.state.health = DbHealth(Redactor(settings.secrets()))
    app.state.sessions = Sessions(settings.viewer_token, settings.session_ttl_s)
    app.state.limiter = FailureLimiter(settings.login_burst, settings.login_refill_s)
    for exc_class in (DatabaseUnavailable, DBAPIError, PoolTimeout):
        app.add_exception_handler(exc_class, database_unavailable)
    app.add_exception_handler(RequestValidationError, validation_failed)
    app.add_exception_handler(pages.LoginRequired, pages.login_redirect)
    app.add_exception_handler(StarletteHTTPException, views.http_error)  # HTML for browsers, JSON for API clients
    app.add_exception_handler(Exception, views.server_error)
    app.add_middleware(BodyLimit, max_body=settings.max_body, body_timeout_s=settings.body_timeout_s)
    app.add_middleware(AllowedHosts, hosts=settings.hosts())
    app.add_middleware(Headers)
    for router in (*api.routers, *views.routers, forget.router):
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=views.STATIC_DIR), name="static")
    return app
