"""The dashboard: server-rendered pages (Jinja2, autoescaped), a stylesheet and one small script.

Pages use the viewer token from the ``Authorization`` header or the ``oomguard_viewer`` cookie
that ``/login`` sets (HttpOnly, SameSite=Strict). The Content-Security-Policy forbids inline
script and style, and anything from another origin.
"""

from __future__ import annotations

import hmac
import os
import time
import urllib.parse
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from oomguard.manager.chart import memory_chart
from oomguard.manager.models import NODE_PATTERN
from oomguard.manager.settings import Settings
from oomguard.manager.store import SORT_KEYS, Store
from oomguard.units import format_size

COOKIE = "oomguard_viewer"
PAGE_SIZE = 50
HERE = os.path.dirname(__file__)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
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


def _ago(iso: str | None) -> str:
    if not iso:
        return "never"
    from datetime import datetime

    s = time.time() - datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
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


def install(app: FastAPI, settings: Settings, store: Store) -> None:
    templates = _env()
    app.mount("/static", StaticFiles(directory=os.path.join(HERE, "static")), name="static")

    def authorized(request: Request) -> bool:
        expected = settings.viewer_token
        if expected is None:
            return True
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else request.cookies.get(COOKIE, "")
        return bool(given) and hmac.compare_digest(given.encode(), expected.encode())

    def page(request: Request, template_name: str, http_status: int = 200, **context: Any) -> Response:
        if not authorized(request):
            target = urllib.parse.quote(str(request.url.path) + ("?" + request.url.query if request.url.query else ""))
            return RedirectResponse(f"/login?next={target}", status_code=303)
        fragment = request.query_params.get("fragment") == "1"
        refresh = request.query_params.get("refresh", "15")
        context["refresh"] = min(max(int(refresh), 1), 3600) if refresh.isdigit() else 15
        template = templates.get_template(template_name)
        body = template.render(fragment=fragment, **context)
        return HTMLResponse(body, status_code=http_status)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index(request: Request, q: str = "", status: str = "", sort: str = "name", offset: int = 0) -> Response:
        if not authorized(request):
            return page(request, "index.html")
        q = q[:128]
        status = status if status in ("online", "offline") else ""
        sort = sort if sort.lstrip("-") in SORT_KEYS else "name"
        offset = max(0, min(offset, 10_000_000))
        listing = store.list_nodes(status=status or None, q=q or None, limit=PAGE_SIZE, offset=offset, sort=sort)
        alerts = store.alerts()
        return page(
            request,
            "index.html",
            listing=listing,
            alerts=alerts[:50],
            alert_count=len(alerts),
            summary=store.summary(),
            q=q,
            status=status,
            sort=sort,
            offset=offset,
            page_size=PAGE_SIZE,
            columns=COLUMNS,
            query=lambda **kw: _query({"q": q, "status": status, "sort": sort, "offset": offset}, kw),
        )

    @app.get("/nodes/{name}", response_class=HTMLResponse, include_in_schema=False)
    def node_page(request: Request, name: str) -> Response:
        import re

        if not re.fullmatch(NODE_PATTERN.strip("^$"), name) or len(name) > 128:
            return page(request, "missing.html", http_status=404, name=name)
        if not authorized(request):
            return page(request, "node.html")
        detail = store.node_detail(name)
        if detail is None:
            return page(request, "missing.html", http_status=404, name=name)
        chart = Markup(memory_chart(detail["history"]))  # built from numbers; its labels are escaped
        return page(request, "node.html", node=detail, chart=chart, report=detail["latest"] or {})

    @app.get("/login", response_class=HTMLResponse, include_in_schema=False)
    def login_form(next: str = "/") -> Response:
        return HTMLResponse(templates.get_template("login.html").render(next=_safe_next(next), error=None))

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0]
        target = _safe_next((form.get("next") or ["/"])[0])
        expected = settings.viewer_token
        if expected is not None and not hmac.compare_digest(token.encode(), expected.encode()):
            body = templates.get_template("login.html").render(next=target, error="That token is not valid.")
            return HTMLResponse(body)  # the form again, with the error: no cookie is set
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE, token, httponly=True, samesite="strict", path="/", secure=request.url.scheme == "https"
        )
        return response

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:  # browsers ask for it on every page, the raw JSON included
        return Response(status_code=204)

    @app.get("/logout", include_in_schema=False)
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
