"""The dashboard: server-rendered pages (Jinja2, autoescaped), a stylesheet and one small script.

Pages need the viewer token, from the ``Authorization`` header or the ``oomguard_viewer`` cookie
that ``/login`` sets (HttpOnly, SameSite=Strict); without it they redirect to ``/login``.
"""

from __future__ import annotations

import os
import re
import time
import urllib.parse
from typing import Annotated, Any

from fastapi import APIRouter, Cookie, Depends, Header, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from oomguard.manager.chart import memory_chart
from oomguard.manager.deps import COOKIE, SettingsDep, StoreDep, token_ok, viewer_ok
from oomguard.manager.models import NODE_PATTERN
from oomguard.manager.store import SORT_KEYS
from oomguard.manager.times import parse_iso_ms
from oomguard.units import format_size

PAGE_SIZE = 50
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
    settings: SettingsDep,
    authorization: Annotated[str | None, Header()] = None,
    oomguard_viewer: Annotated[str | None, Cookie()] = None,
) -> None:
    if not viewer_ok(settings, authorization, oomguard_viewer):
        raise LoginRequired(request.url.path + ("?" + request.url.query if request.url.query else ""))


def _ago(iso: str | None) -> str:
    ms = parse_iso_ms(iso)
    if ms is None:
        return "never"
    s = time.time() - ms / 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit} ago"
    return f"{max(int(s), 0)}s ago"


def _size(n: Any) -> str:
    return format_size(n) if isinstance(n, int) else "-"


def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(os.path.join(HERE, "templates")),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["size"] = _size
    env.filters["ago"] = _ago
    return env


TEMPLATES = _env()
pages = APIRouter(include_in_schema=False, dependencies=[Depends(require_viewer_page)])
login_pages = APIRouter(include_in_schema=False)


def _render(request: Request, template_name: str, http_status: int = 200, **context: Any) -> Response:
    """A page, or with ``?fragment=1`` its changing part only (the script's refresh)."""
    fragment = request.query_params.get("fragment") == "1"
    refresh = request.query_params.get("refresh", "15")
    context["refresh"] = min(max(int(refresh), 1), 3600) if refresh.isdigit() else 15
    body = TEMPLATES.get_template(template_name).render(fragment=fragment, **context)
    return HTMLResponse(body, status_code=http_status)


@pages.get("/", response_class=HTMLResponse)
def index(
    *, request: Request, store: StoreDep, q: str = "", status: str = "", sort: str = "name", offset: int = 0
) -> Response:
    q = q[:128]
    status = status if status in ("online", "offline") else ""
    sort = sort if sort.lstrip("-") in SORT_KEYS else "name"
    offset = max(0, min(offset, 10_000_000))
    listing = store.list_nodes(status=status or None, q=q or None, limit=PAGE_SIZE, offset=offset, sort=sort)
    alerts = store.alerts()
    current: dict[str, Any] = {"q": q, "status": status, "sort": sort, "offset": offset}
    return _render(
        request,
        "index.html",
        listing=listing,
        alerts=alerts[:50],
        alert_count=len(alerts),
        summary=store.summary(),
        page_size=PAGE_SIZE,
        columns=COLUMNS,
        query=lambda **kw: _query(current, kw),
        **current,
    )


@pages.get("/nodes/{name}", response_class=HTMLResponse)
def node_page(request: Request, store: StoreDep, name: str) -> Response:
    detail = store.node_detail(name) if re.fullmatch(NODE_PATTERN.strip("^$"), name) and len(name) <= 128 else None
    if detail is None:
        return _render(request, "missing.html", http_status=404, name=name)
    chart = Markup(memory_chart(detail["history"]))  # built from numbers; its labels are escaped
    return _render(request, "node.html", node=detail, chart=chart, report=detail["latest"] or {})


@login_pages.get("/login", response_class=HTMLResponse)
def login_form(next: str = "/") -> Response:
    return HTMLResponse(TEMPLATES.get_template("login.html").render(next=_safe_next(next), error=None))


@login_pages.post("/login")
async def login(request: Request, settings: SettingsDep) -> Response:
    form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0]
    target = _safe_next((form.get("next") or ["/"])[0])
    if not token_ok(settings.viewer_token, token):
        body = TEMPLATES.get_template("login.html").render(next=target, error="That token is not valid.")
        return HTMLResponse(body)  # the form again, with the error: no cookie is set
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/", secure=request.url.scheme == "https")
    return response


@login_pages.get("/favicon.ico")
def favicon() -> Response:  # browsers ask for it on every page, the raw JSON included
    return Response(status_code=204)


@login_pages.get("/logout")
def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


def _safe_next(target: str) -> str:
    """Only a local path: never redirect to another site after login."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"


def _query(current: dict[str, Any], changes: dict[str, Any]) -> str:
    params = {**current, **changes}
    return "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v not in ("", 0, None)})


routers = (pages, login_pages)
