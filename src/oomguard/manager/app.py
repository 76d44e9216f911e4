"""The manager's ASGI app: the API (``api``), the dashboard (``views``), their middleware, and
the retention thread for the app's lifetime.

Routes reach the store and the settings through ``app.state`` (``deps``). A database that cannot
be reached answers 503 with ``Retry-After``: not the client's fault, and agents keep the report
in their spool.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import DBAPIError

from oomguard._version import __version__
from oomguard.manager import api, views
from oomguard.manager.db import make_engine
from oomguard.manager.middleware import BodyLimit, Headers
from oomguard.manager.retention import RetentionThread
from oomguard.manager.settings import Settings
from oomguard.manager.store import Store

DESCRIPTION = (
    "Every node's memory truth and OOM history. Agents POST reports and events; readers GET nodes, alerts and metrics."
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Retention passes while the app serves."""
    retention = RetentionThread(app.state.store.thin, app.state.settings.thin_every_s).start()
    yield
    retention.stop()


async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(
        {"detail": "the database is unavailable; try again later"}, status_code=503, headers={"Retry-After": "5"}
    )


def create_app(settings: Settings, store: Store | None = None) -> FastAPI:
    """The ASGI app. The schema must exist already (``oomguard.manager.db.migrate``)."""
    if store is None:
        engine = make_engine(settings.db_url)
        store = Store(engine, default_interval_s=settings.interval_s, retention_s=settings.retention_s)
    app = FastAPI(title="oomguard manager", version=__version__, lifespan=lifespan, description=DESCRIPTION)
    app.state.store = store
    app.state.settings = settings
    app.add_exception_handler(DBAPIError, database_unavailable)
    app.add_exception_handler(views.LoginRequired, views.login_redirect)
    app.add_middleware(BodyLimit, max_body=settings.max_body)
    app.add_middleware(Headers)
    for router in (*api.routers, *views.routers):
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=views.STATIC_DIR), name="static")
    return app
