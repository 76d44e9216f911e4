"""The dashboard's writes: forgetting a node (``GET``/``POST /nodes/{name}/forget``), and excluding
one observation from what the fleet learns or including it again (``POST
/profiles/{profile}/observations``, the profile page's Exclude and Include buttons); and the checks
every form shares, which ``POST /logout`` (``views``) makes too: ``same_origin``, ``form_token``.

Each needs, besides the viewer's session (``pages.require_viewer_page``), the operator's
``--admin-token`` typed into the form (never remembered: it is no ambient credential a forged
request could ride on); forgetting, the node's name typed again too. Against cross-site requests
on top of that: the session cookie is SameSite=Strict; the form carries a token derived from the
session cookie (HMAC-SHA256 keyed by the cookie, which another site cannot read); and a browser's
``Origin`` must name this manager's own Host, or the ``X-Forwarded-Host`` a reverse proxy sends
when it rewrites Host to its upstream (deploy/proxy/: Caddy and nginx both do), believed only from
a ``--trusted-proxy`` (``web.proxies``): from anyone else that header is ignored. The pages with
these forms (the confirmation, the profile's) set ``<meta name="referrer" content="same-origin">``,
since the manager's ``Referrer-Policy: no-referrer`` would make the browser send ``Origin: null``:
Fetch standard, "append a request Origin header"). After a node is forgotten the overview says so
once (the ``NOTICE`` cookie); after an observation is excluded or included, the profile's page
shows it so.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import urllib.parse
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from oomguard.manager.bodies import ID_PATTERN
from oomguard.manager.store import Store
from oomguard.manager.web.deps import SettingsDep, StoreDep, admin_ok, db_read, db_write
from oomguard.manager.web.pages import SessionCookie, form_fields, missing_node, page, render, viewer_pages
from oomguard.manager.web.proxies import forwarded_host
from oomguard.nodes import is_valid_node_name, is_valid_profile_name

NOTICE = "oomguard_notice"  # a one-shot cookie: the node just forgotten, shown once on the overview
CROSS_SITE = "This request did not come from this manager's own form; open the node's page and try again."
DISABLED = "Forgetting nodes is disabled: start the manager with --admin-token."

router = viewer_pages()


def form_token(session: str | None, purpose: str) -> str:
    """A form's token: HMAC-SHA256 of *purpose* keyed by the session cookie (RFC 2104), so only a
    page that could read the cookie (this manager's own) can fill it in; "" without a session."""
    if not session:
        return ""
    return hmac.new(session.encode(), purpose.encode(), hashlib.sha256).hexdigest()


def forget_token(session: str | None, name: str) -> str:
    """The forget confirmation's token (``form_token``) for the node *name*."""
    return form_token(session, f"oomguard-forget:{name}")


def observation_token(session: str | None, profile: str) -> str:
    """The profile page's Exclude/Include form's token (``form_token``) for *profile*."""
    return form_token(session, f"oomguard-observation:{profile}")


def logout_token(session: str | None) -> str:
    """The log-out form's token (``form_token``; ``views.logout``)."""
    return form_token(session, "oomguard-logout")


DEFAULT_PORTS = {"http": "80", "https": "443"}


def _authority(netloc: str, scheme: str) -> str:
    """``host[:port]`` lower-cased, without the scheme's default port (``Origin`` omits it)."""
    netloc = netloc.strip().lower()
    port = DEFAULT_PORTS.get(scheme)
    return netloc[: -len(port) - 1] if port and netloc.endswith(":" + port) else netloc


def same_origin(request: Request) -> bool:
    """No ``Origin`` (not a browser), or one whose host and port are this request's Host or, behind
    a trusted proxy that rewrites Host, its ``X-Forwarded-Host`` (the first, as the client sent it)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    try:
        parts = urllib.parse.urlsplit(origin)
    except ValueError:  # an Origin urlsplit refuses (an unclosed "[")
        return False
    seen = _authority(parts.netloc, parts.scheme)
    candidates = (request.headers.get("host", ""), forwarded_host(request.scope) or "")
    hosts = {_authority(h, parts.scheme) for h in candidates if h}
    return seen != "" and seen in hosts


@dataclass(frozen=True)
class Forgetting:
    """What both routes start from: the node's *name* (as given, unchecked), the viewer's
    *session* cookie (the form token's key), and whether an admin token is configured."""

    request: Request
    store: Store
    name: str
    session: str | None
    enabled: bool


def _forgetting(
    request: Request, store: StoreDep, settings: SettingsDep, name: str, oomguard_session: SessionCookie = None
) -> Forgetting:
    return Forgetting(request, store, name, oomguard_session, settings.admin_token is not None)


ForgettingDep = Annotated[Forgetting, Depends(_forgetting)]


def _form(f: Forgetting, error: str | None = None, http_status: int = 200) -> Response:
    token = forget_token(f.session, f.name)
    return page("forget.html", http_status, name=f.name, token=token, can_forget=f.enabled, error=error, fragment=False)


def _refusal(line: str) -> Response:
    return page("error.html", 403, title="Forbidden", message=line, fragment=False)


@router.get("/nodes/{name}/forget", response_class=HTMLResponse)
async def forget_form(f: ForgettingDep) -> Response:
    """The confirmation: type the node's name and the admin token (disabled without ``--admin-token``)."""
    if (
        not is_valid_node_name(f.name)
        or await db_read(f.request, f.store.node_detail, f.name, events_limit=1, history_points=2) is None
    ):
        return missing_node(f.request, f.name)
    return _form(f)


@router.post("/nodes/{name}/forget")
async def forget(f: ForgettingDep) -> Response:
    """Forget a node (its reports and events go): 303 to the overview, which says so once; a page
    with one line for a refusal (403: wrong admin token, none configured, or not from our form)."""
    if not is_valid_node_name(f.name):
        return missing_node(f.request, f.name)
    field = await form_fields(f.request)
    expected = forget_token(f.session, f.name)
    if not same_origin(f.request) or not hmac.compare_digest(field.get("csrf", "").encode(), expected.encode()):
        return _refusal(CROSS_SITE)
    if not f.enabled:
        return _refusal(DISABLED)
    if field.get("confirm", "").strip() != f.name:
        return _form(f, "Type the node's name exactly to confirm.", 400)
    if not admin_ok(f.request, field.get("token", "").strip()):
        return _refusal("That admin token is not valid.")
    if not await db_write(f.request, f.store.forget_node(f.name)):
        return missing_node(f.request, f.name)
    response = RedirectResponse("/", status_code=303)
    secure = f.request.url.scheme == "https"
    response.set_cookie(NOTICE, f.name, max_age=60, httponly=True, samesite="strict", path="/", secure=secure)
    return response


# -- excluding an observation ----------------------------------------------------------------------

NO_EXCLUDING = "Excluding observations is disabled: start the manager with --admin-token."
CROSS_SITE_PROFILE = "This request did not come from this manager's own form; open the profile's page and try again."
NO_CHOICE = "Choose an observation's Exclude or Include button."
GONE = "There is no such observation of this profile (it may have left the window, or its node been forgotten)."


def chosen_observation(field: dict[str, str]) -> tuple[bool, str, str] | None:
    """The button pressed: ``exclude`` or ``include`` with the value ``NODE/ID`` (neither holds a
    "/": ``NODE_PATTERN``, ``ID_PATTERN``), as (excluded, node, id); None for anything else."""
    for action, excluded in (("exclude", True), ("include", False)):
        node, sep, ingest_id = field.get(action, "").partition("/")
        if sep and is_valid_node_name(node) and re.fullmatch(ID_PATTERN, ingest_id):
            return excluded, node, ingest_id
    return None


def _back_to(profile: str, offset: str) -> str:
    """The profile page the form was on (its page of observations), at the list."""
    query = f"?observations={offset}" if offset.isascii() and offset.isdigit() and offset != "0" else ""
    return f"/profiles/{urllib.parse.quote(profile, safe='')}{query}#observations"


@router.post("/profiles/{profile}/observations")
async def exclude_or_include(
    request: Request, store: StoreDep, settings: SettingsDep, profile: str, oomguard_session: SessionCookie = None
) -> Response:
    """Exclude an observation of *profile* from what the fleet learns, or include it again (the
    profile page's buttons): the admin token typed in the form, the form's token, our own Origin;
    303 back to the page; a page with one line for a refusal (403), no choice (400) or no such
    observation (404)."""
    if not is_valid_profile_name(profile):
        return render(request, "missing.html", http_status=404, name=profile[:128], what="profile")
    field = await form_fields(request)
    expected = observation_token(oomguard_session, profile)
    if not same_origin(request) or not hmac.compare_digest(field.get("csrf", "").encode(), expected.encode()):
        return _refusal(CROSS_SITE_PROFILE)
    if settings.admin_token is None:
        return _refusal(NO_EXCLUDING)
    if not admin_ok(request, field.get("token", "").strip()):
        return _refusal("That admin token is not valid.")
    chosen = chosen_observation(field)
    if chosen is None:
        return page("error.html", 400, title="Bad request", message=NO_CHOICE, fragment=False)
    excluded, node, ingest_id = chosen
    if not await db_write(request, store.set_excluded(node, ingest_id, excluded, profile)):
        return page("error.html", 404, title="Not found", message=GONE, fragment=False)
    return RedirectResponse(_back_to(profile, field.get("observations", "0")), status_code=303)
