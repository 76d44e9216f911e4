"""The manager's ASGI app, wired: the API (``web.api``), the dashboard (``web.views``,
``web.forget``), their middleware, and the retention thread for the app's lifetime.

Routes reach the store, the settings, the database health, the sessions, the failure limiter,
the new-node cap and the per-node quotas (``web.quotas``) through ``app.state`` (``web.deps``).
Outermost, ``web.proxies.TrustedProxies`` puts the client's address and scheme in the scope: the
peer's, or a ``--trusted-proxy``'s word.
A database that fails or hangs answers 503 with ``Retry-After`` (not the client's fault: agents
keep the report in their spool), counted and logged once per episode (``store.health``). A
request its envelope refuses answers 422 with the reasons, never echoing the input back
(FastAPI's default handler does, and fails on NaN). The API is described by ``/openapi.json``
and browsed at ``/docs`` (Swagger UI, behind the viewer token like every page), its assets
served from here: see ``docs_page``. There is no ``/redoc``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from html import escape
from importlib import resources
from json import dumps
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import swagger_ui_default_parameters
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from oomguard._version import __version__
from oomguard.manager import bodies
from oomguard.manager.db import make_engine
from oomguard.manager.redact import Redactor
from oomguard.manager.retention import RetentionThread
from oomguard.manager.settings import Settings
from oomguard.manager.store import Store
from oomguard.manager.store.health import DatabaseUnavailable, DbHealth
from oomguard.manager.web import api, forget, pages, views
from oomguard.manager.web.credentials import MAX_KNOWN, NewNodes
from oomguard.manager.web.deps import Revoked
from oomguard.manager.web.middleware import AllowedHosts, BodyLimit, Headers
from oomguard.manager.web.observed import HttpMetrics, Observed
from oomguard.manager.web.pages import viewer_pages
from oomguard.manager.web.proxies import TrustedProxies
from oomguard.manager.web.quotas import Quotas
from oomguard.manager.web.sessions import FailureLimiter, Sessions

DESCRIPTION = (
    "Every node's memory truth and OOM history. Agents POST reports and events; readers GET nodes, alerts and metrics."
)
log = logging.getLogger("oomguard.manager")
RETRY_AFTER_S = 5
DOCS_ASSETS = "/docs/assets"
# Swagger UI's start, read from the page's data-config: the CSP (web/middleware.py) allows scripts
# from 'self' only, so the page cannot carry FastAPI's inline <script> (get_swagger_ui_html) and
# keeps the CSP of every other page (CSP Level 3, "script-src": an inline script needs
# 'unsafe-inline', a nonce or a hash, https://www.w3.org/TR/CSP3/#directive-script-src).
DOCS_INIT_JS = """"use strict";
(function () {
  var config = JSON.parse(document.getElementById("swagger-ui").dataset.config);
  config.presets = [SwaggerUIBundle.presets.apis];
  window.ui = SwaggerUIBundle(config);
})();
"""


async def warm(app: FastAPI) -> None:
    """The fleet's node names, read once at start (``Store.warm``): the writer knows their ids and
    the new-node cap knows they exist, so the first report of each of them after a restart is no
    database read and no lookup (``deps.may_write``, ``Writer._node_id``). Without the database
    now, the first reports look each node up instead, as they would anyway."""
    try:
        app.state.new_nodes.seed(await app.state.store.warm(MAX_KNOWN))
    except Exception as exc:  # nothing of it is needed: each lookup is made later instead
        log.warning("oomguard manager: the node names were not read at start (%s); each is looked up later", exc)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Retention passes while the app serves; the node names read once, beside the first requests."""
    retention = RetentionThread(app.state.store.thin, app.state.settings.thin_every_s).start()
    warming = asyncio.create_task(warm(app))
    yield
    warming.cancel()
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
            "loc": bodies.safe_loc(e.get("loc", ())),  # a client's own keys are not echoed
            "msg": str(e.get("msg", ""))[:300],
            "type": str(e.get("type", "")),
        }
        for e in errors[:20]
    ]
    return JSONResponse({"detail": detail}, status_code=422)


def docs_page(app: FastAPI) -> None:
    """``/docs``: Swagger UI on this host, behind the viewer token (``pages.viewer_pages``: without
    it, a redirect to ``/login`` like every page). FastAPI's recipe, "Custom Docs UI Static Assets
    (Self-Hosting)" (https://fastapi.tiangolo.com/how-to/custom-docs-ui-assets/), with the assets
    of the ``fastapi-offline`` package (its ``static/``: Swagger UI 5's ``swagger-ui-bundle.js`` and
    ``swagger-ui.css``, https://github.com/turettn/fastapi_offline) and the start script above
    instead of an inline one. ``validatorUrl: null``: Swagger UI would otherwise send the schema
    to validator.swagger.io (Swagger UI's configuration docs, "validatorUrl")."""
    static = resources.files("fastapi_offline") / "static"
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(static)), name="docs-assets")
    config = {**swagger_ui_default_parameters, "url": app.openapi_url, "validatorUrl": None}
    body = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(app.title)}: API</title>"
        f'<link rel="stylesheet" href="{DOCS_ASSETS}/swagger-ui.css"></head>'
        f'<body><div id="swagger-ui" data-config="{escape(dumps(config))}"></div>'
        f'<script src="{DOCS_ASSETS}/swagger-ui-bundle.js"></script><script src="/docs/init.js"></script>'
        "</body></html>\n"
    )
    router = viewer_pages()

    @router.get("/docs", response_class=HTMLResponse)
    def docs() -> HTMLResponse:
        return HTMLResponse(body)

    @router.get("/docs/init.js")
    def docs_init() -> Response:
        return Response(DOCS_INIT_JS, media_type="text/javascript")

    app.include_router(router)


OPEN_PATHS = ("/healthz", "/readyz", "/livez")  # no token asked (api.health)
BEARER = {"bearer": {"type": "http", "scheme": "bearer", "description": "the agent's, viewer's or admin's token"}}


def declared_security(app: FastAPI) -> None:
    """OpenAPI's ``securitySchemes``: every operation asks for a bearer token (the role's: the
    agent's, the viewer's or the admin's, as its description says) but the open health checks;
    Swagger UI then shows its Authorize button (OpenAPI 3.1, "Security Scheme Object" and
    "Security Requirement Object": https://spec.openapis.org/oas/v3.1.0#security-scheme-object).
    The routes check the header themselves (``web.deps``); this only declares it."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = plain()
        schema.setdefault("components", {}).setdefault("securitySchemes", {}).update(BEARER)
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                if isinstance(operation, dict):
                    operation["security"] = [] if path in OPEN_PATHS else [{"bearer": []}]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings, store: Store | None = None) -> FastAPI:
    """The ASGI app. The schema must exist already (``oomguard.manager.db.migrate``)."""
    if store is None:
        engine = make_engine(settings.db_url, timeout_s=settings.db_timeout_s)
        store = Store(
            engine,
            default_interval_s=settings.interval_s,
            retention_s=settings.retention_s,
            forget_after_s=settings.forget_after_s,
            working_set_line=settings.working_set_line,
            write_queue_bytes=settings.write_queue_bytes,
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
    store.caps.set_limits(**settings.caps())  # distinct profiles and classes (store/claims.py)
    app.state.settings = settings
    app.state.health = DbHealth(Redactor(settings.secrets()))
    app.state.sessions = Sessions(settings.viewer_token, settings.session_ttl_s)
    app.state.limiter = FailureLimiter(settings.login_burst, settings.login_refill_s, settings.failed_tokens_per_minute)
    app.state.new_nodes = NewNodes(settings.max_new_nodes)
    app.state.quotas = Quotas(settings.max_events_per_node, settings.max_observations_per_node)
    app.state.revoked = Revoked()  # the revoked nodes, read again every second (web.deps)
    app.state.observed = Observed()  # the manager's own series: failed tokens, requests, process
    for exc_class in (DatabaseUnavailable, DBAPIError, PoolTimeout):
        app.add_exception_handler(exc_class, database_unavailable)
    app.add_exception_handler(RequestValidationError, validation_failed)
    app.add_exception_handler(pages.LoginRequired, pages.login_redirect)
    app.add_exception_handler(StarletteHTTPException, views.http_error)  # HTML for browsers, JSON for API clients
    app.add_exception_handler(Exception, views.server_error)
    app.add_middleware(BodyLimit, max_body=settings.max_body, body_timeout_s=settings.body_timeout_s)
    app.add_middleware(AllowedHosts, hosts=settings.hosts())
    app.add_middleware(Headers)
    app.add_middleware(TrustedProxies, networks=settings.trusted_proxies)  # the last added is the outermost
    app.add_middleware(HttpMetrics, observed=app.state.observed)  # outside all: every answer counted
    for router in (*api.routers, *views.routers, forget.router):
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=views.STATIC_DIR), name="static")
    docs_page(app)
    declared_security(app)
    return app
