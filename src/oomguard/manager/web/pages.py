"""What every dashboard page shares: the viewer guard, the Jinja2 environment and the ways a
page is answered. The routes are in ``views`` (overview, node, login, errors) and ``forget``.

Pages need the viewer token, from the ``Authorization`` header, or the session cookie that
``/login`` sets (HttpOnly, SameSite=Strict, signed, with an expiry: ``oomguard.manager.sessions``);
without it they redirect to ``/login`` (``LoginRequired``, answered by ``login_redirect``).

Templates are autoescaped and only meet checked types: the filters (``formatting.FILTERS``) turn
anything unexpected into "-".
"""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Annotated, Any

from fastapi import APIRouter, Cookie, Depends, Header, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from oomguard.manager.web.deps import viewer_ok
from oomguard.manager.web.formatting import FILTERS
from oomguard.manager.web.sessions import COOKIE

HERE = os.path.dirname(__file__)
SessionCookie = Annotated[str | None, Cookie(alias=COOKIE)]


class LoginRequired(Exception):
    """A page asked for without the viewer token: the app answers with a redirect to ``/login``."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


async def login_redirect(request: Request, exc: Exception) -> Response:
    """The app's handler of ``LoginRequired``: 303 to the login form, which comes back here after."""
    target = exc.target if isinstance(exc, LoginRequired) else "/"
    return RedirectResponse(f"/login?next={urllib.parse.quote(target)}", status_code=303)


async def require_viewer_page(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    oomguard_session: SessionCookie = None,
) -> None:
    if not viewer_ok(request, authorization, oomguard_session):
        raise LoginRequired(request.url.path + ("?" + request.url.query if request.url.query else ""))


def viewer_pages() -> APIRouter:
    """A router of pages that need the viewer (``require_viewer_page`` on every route)."""
    return APIRouter(include_in_schema=False, dependencies=[Depends(require_viewer_page)])


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


def refresh_seconds(text: str | None) -> int:
    """``?refresh=``: 1 to 3600 seconds; 15 for anything else (ASCII digits only: "²" is no number)."""
    if text is None or not re.fullmatch(r"[0-9]{1,5}", text):
        return 15
    return min(max(int(text), 1), 3600)


def render(request: Request, template_name: str, http_status: int = 200, **context: Any) -> Response:
    """A live page, or with ``?fragment=1`` its changing part only (the script's refresh)."""
    fragment = request.query_params.get("fragment") == "1"
    context["refresh"] = refresh_seconds(request.query_params.get("refresh"))
    body = TEMPLATES.get_template(template_name).render(fragment=fragment, **context)
    return HTMLResponse(body, status_code=http_status)


def page(template_name: str, http_status: int = 200, headers: dict[str, str] | None = None, **context: Any) -> Response:
    """A page with nothing live in it (a form, an error): *context* as it is."""
    body = TEMPLATES.get_template(template_name).render(**context)
    return HTMLResponse(body, status_code=http_status, headers=headers)


def missing_node(request: Request, name: str) -> Response:
    """404: no node of that name (the name shown cut at 128 characters)."""
    return render(request, "missing.html", http_status=404, name=name[:128])


async def form_fields(request: Request) -> dict[str, str]:
    """A posted form (``application/x-www-form-urlencoded``): each field's first value."""
    form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
    return {k: v[0] for k, v in form.items()}
