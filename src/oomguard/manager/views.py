"""The dashboard: server-rendered pages (Jinja2, autoescaped), a stylesheet and one small script.

Pages need the viewer token, from the ``Authorization`` header, or the session cookie that
``/login`` sets (HttpOnly, SameSite=Strict, signed, with an expiry: ``oomguard.manager.sessions``);
without it they redirect to ``/login``. ``POST /logout`` revokes the session; ``GET /logout``
asks for that POST.

Templates only meet checked types: the latest report goes through the report's JSON Schema
(``reportschema.conform_report``) first, and the filters turn anything unexpected into "-".
"""

from __future__ import annotations

import os
import re
import time
import urllib.parse
from collections import Counter
from typing import Annotated, Any

from fastapi import APIRouter, Cookie, Depends, Header, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from oomguard.manager.chart import RANGES, memory_chart
from oomguard.manager.deps import SettingsDep, StoreDep, checked, client_of, db_read, token_ok, viewer_ok
from oomguard.manager.formatting import FILTERS, group_alerts
from oomguard.manager.models import NODE_PATTERN
from oomguard.manager.reportschema import conform_report
from oomguard.manager.sessions import COOKIE, FailureLimiter, Sessions
from oomguard.manager.store import SORT_KEYS

PAGE_SIZE = 50
RAW_REPORTS = 3000  # the most stored reports a chart of up to a day draws (a day at 30 s is 2,880)
HERE = os.path.dirname(__file__)
STATIC_DIR = os.path.join(HERE, "static")
COLUMNS = (  # sort key, heading
    ("name", "Node"),
    ("runtime", "Runtime"),
    ("status", "Status"),
    ("host_total_bytes", "Host RAM / limit"),
    ("budget_bytes", "Budget"),
    ("memlock_soft_bytes", "Memlock"),
    (None, "GPUs"),
    (None, "Jobs"),
    (None, "Issues"),
    ("oom_kills_24h", "OOM 24h"),
    ("last_seen", "Last seen"),
)


class LoginRequired(Exception):
    """A page asked for without the viewer token: the app answers with a redirect to ``/login``."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


async def login_redirect(request: Request, exc: Exception) -> Response:
    """The app's handler of ``LoginRequired``: 303 to the login form, which comes back here after."""
    target = exc.target if isinstance(exc, LoginRequired) else "/"
    return RedirectResponse(f"/login?next={urllib.parse.quote(target)}", status_code=303)


def require_viewer_page(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    oomguard_session: Annotated[str | None, Cookie(alias=COOKIE)] = None,
) -> None:
    if not viewer_ok(request, authorization, oomguard_session):
        raise LoginRequired(request.url.path + ("?" + request.url.query if request.url.query else ""))


def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(os.path.join(HERE, "templates")),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(FILTERS)
    return env


TEMPLATES = _env()
pages = APIRouter(include_in_schema=False, dependencies=[Depends(require_viewer_page)])
login_pages = APIRouter(include_in_schema=False)


def refresh_seconds(text: str | None) -> int:
    """``?refresh=``: 1 to 3600 seconds; 15 for anything else (ASCII digits only: "²" is no number)."""
    if text is None or not re.fullmatch(r"[0-9]{1,5}", text):
        return 15
    return min(max(int(text), 1), 3600)


def _render(request: Request, template_name: str, http_status: int = 200, **context: Any) -> Response:
    """A page, or with ``?fragment=1`` its changing part only (the script's refresh)."""
    fragment = request.query_params.get("fragment") == "1"
    context["refresh"] = refresh_seconds(request.query_params.get("refresh"))
    body = TEMPLATES.get_template(template_name).render(fragment=fragment, **context)
    return HTMLResponse(body, status_code=http_status)


@pages.get("/", response_class=HTMLResponse)
async def index(
    *,
    request: Request,
    store: StoreDep,
    q: str = "",
    status: str = "",
    sort: str = "name",
    offset: str = "0",
    show: Annotated[str, Query(alias="alerts", max_length=64)] = "",
) -> Response:
    """The fleet: cards, alerts grouped by kind (*show*: the kind listed in full), a page of nodes."""
    q = q.replace("\x00", "")[:128]  # PostgreSQL text cannot hold NUL
    status = status if status in ("online", "offline") else ""
    sort = sort if sort.lstrip("-") in SORT_KEYS else "name"
    start = min(int(offset), 10_000_000) if re.fullmatch(r"[0-9]{1,9}", offset) else 0
    listing = await db_read(
        request, store.list_nodes, status=status or None, q=q or None, limit=PAGE_SIZE, offset=start, sort=sort
    )
    alerts = await db_read(request, store.alerts)
    summary = await db_read(request, store.summary)
    current: dict[str, Any] = {"q": q, "status": status, "sort": sort, "offset": start}
    return _render(
        request,
        "index.html",
        listing=listing,
        alert_groups=group_alerts(alerts, show),
        alerts_by_node=Counter(a.get("node") for a in alerts),
        alert_count=len(alerts),
        summary=summary,
        page_size=PAGE_SIZE,
        columns=COLUMNS,
        query=lambda **kw: _query(current, kw),
        **current,
    )


@pages.get("/nodes/{name}", response_class=HTMLResponse)
async def node_page(request: Request, store: StoreDep, name: str, range: str = "30d") -> Response:
    """One node; ``?range=`` (1h, 24h, 7d, 30d) sets the chart's span. Ranges up to a day draw the
    stored reports themselves (the newest ``RAW_REPORTS``), longer ones the store's downsampled series."""
    valid = re.fullmatch(NODE_PATTERN.strip("^$"), name) is not None and len(name) <= 128
    detail = await db_read(request, store.node_detail, name) if valid else None
    if detail is None:
        return _render(request, "missing.html", http_status=404, name=name[:128])
    chosen = range if range in RANGES else "30d"
    history = detail["history"]
    if RANGES[chosen] <= 86400:
        page = await db_read(request, store.node_history, name, limit=RAW_REPORTS)
        history = list(reversed(page["history"])) if page else history
    chart = Markup(memory_chart(history, detail["events"], RANGES[chosen], time.time()))  # numbers; labels escaped
    report = conform_report(detail["latest"])
    return _render(request, "node.html", node=detail, chart=chart, report=report, range=chosen, ranges=RANGES)


ERROR_WORDS = {
    404: ("Not found", "There is no page at this address."),
    405: ("Method not allowed", "This address does not take that method."),
    500: ("Server error", "The manager failed to answer this request; the error is in its log."),
}


def wants_html(request: Request) -> bool:
    """A browser (its Accept names text/html) gets an HTML page; API clients get JSON."""
    return "text/html" in request.headers.get("accept", "")


def error_response(
    request: Request, status: int, detail: Any = None, headers: dict[str, str] | None = None
) -> Response:
    """An error as an HTML page for browsers, as ``{"detail": ...}`` for everything else."""
    title, message = ERROR_WORDS.get(status, (f"Error {status}", str(detail or "")))
    if not wants_html(request):
        return JSONResponse({"detail": detail if detail is not None else title}, status_code=status, headers=headers)
    body = TEMPLATES.get_template("error.html").render(title=title, message=message, fragment=False)
    return HTMLResponse(body, status_code=status, headers=headers)


async def http_error(request: Request, exc: Exception) -> Response:
    """The app's handler of HTTP errors (404 for an unknown address, 405, ...)."""
    status = getattr(exc, "status_code", 500)
    return error_response(request, status, getattr(exc, "detail", None), getattr(exc, "headers", None))


async def server_error(request: Request, exc: Exception) -> Response:
    """The app's handler of a bug: a 500 page or JSON, never a traceback (uvicorn logs it)."""
    return error_response(request, 500, "internal server error")


def _login_page(target: str, error: str | None = None, http_status: int = 200, retry_after: int = 0) -> Response:
    body = TEMPLATES.get_template("login.html").render(next=target, error=error, logout=False)
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return HTMLResponse(body, status_code=http_status, headers=headers)


@login_pages.get("/login", response_class=HTMLResponse)
def login_form(next: str = "/") -> Response:
    return _login_page(_safe_next(next))


@login_pages.post("/login")
async def login(request: Request, settings: SettingsDep) -> Response:
    """The viewer token in, a signed session cookie out; failed tokens count against the client."""
    form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0].strip()
    target = _safe_next((form.get("next") or ["/"])[0])
    limiter: FailureLimiter = request.app.state.limiter
    wait = limiter.retry_after(client_of(request))
    if wait:
        return _login_page(target, f"Too many failed attempts; try again in {wait} s.", 429, wait)
    if not checked(request, lambda: token_ok(settings.viewer_token, token)):
        return _login_page(target, "That token is not valid.")  # the form again: no cookie is set
    sessions: Sessions = request.app.state.sessions
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE,
        sessions.issue(),
        max_age=int(sessions.ttl_s),
        httponly=True,
        samesite="strict",
        path="/",
        secure=request.url.scheme == "https",
    )
    return response


@login_pages.get("/favicon.ico")
def favicon() -> Response:  # browsers ask for it on every page, the raw JSON included
    return Response(status_code=204)


@login_pages.get("/logout", response_class=HTMLResponse)
def logout_form() -> Response:
    """A link cannot end a session (a GET must change nothing): this page asks for the POST."""
    return HTMLResponse(TEMPLATES.get_template("login.html").render(next="/", error=None, logout=True))


@login_pages.post("/logout")
def logout(request: Request, oomguard_session: Annotated[str | None, Cookie(alias=COOKIE)] = None) -> Response:
    """Revoke the session (its cookie is refused from now on, even if kept) and clear the cookie."""
    sessions: Sessions = request.app.state.sessions
    sessions.revoke(oomguard_session)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


def _safe_next(target: str) -> str:
    """Only a local path: never redirect to another site after login."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"


def _query(current: dict[str, Any], changes: dict[str, Any]) -> str:
    params = {**current, **changes}
    return "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v not in ("", 0, None)})


routers = (pages, login_pages)
