"""The dashboard's routes: the overview (``/``), a node's page, login and logout, and the error
pages (HTML for browsers, JSON for API clients). What every page shares (the viewer guard, the
templates) is in ``pages``; the dashboard's writes (forgetting a node, excluding an observation)
are in ``forget``.

``POST /logout`` revokes the session; ``GET /logout`` asks for that POST, whose form is checked as
the dashboard's other forms are (``forget``: our own ``Origin``, a token keyed by the session).

Templates only meet checked types: the latest report goes through the report's JSON Schema
(``reportschema.conform_report``) first, and the filters turn anything unexpected into "-".
"""

from __future__ import annotations

import hmac
import os
import re
import time
import urllib.parse
from typing import Annotated, Any

from fastapi import APIRouter, Cookie, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from markupsafe import Markup

from oomguard.manager.alerts import LIVE, STATUSES, SUPERVISOR_STATES
from oomguard.manager.bodies import label_filter
from oomguard.manager.learning import WINDOW_MS
from oomguard.manager.reportschema import conform_report
from oomguard.manager.store import DEFAULT_SORT, HISTORY_POINTS, SORT_KEYS, Store, history
from oomguard.manager.web.chart import AUTO_RANGES, RANGES, fit_range, marked_times, memory_chart, profile_chart
from oomguard.manager.web.deps import SettingsDep, StoreDep, client_of, db_read, token_ok
from oomguard.manager.web.forget import NOTICE, logout_token, observation_token, same_origin
from oomguard.manager.web.formatting import ALERTS_PAGE, ALERTS_SHOWN
from oomguard.manager.web.pages import HERE, SessionCookie, form_fields, missing_node, page, render, viewer_pages
from oomguard.manager.web.sessions import COOKIE, FailureLimiter, Sessions
from oomguard.nodes import is_valid_node_name, is_valid_profile_name

PAGE_SIZE = 50
TIMELINE_PAGE = 25  # a node's events listed per page of its timeline
RAW_REPORTS = 3000  # the most entries a chart of up to a day draws (a day at 30 s is 2,880 reports)
STATIC_DIR = os.path.join(HERE, "static")
COLUMNS = (  # sort key, heading, the direction of a first click ("-": highest first)
    ("name", "Node", ""),
    ("runtime", "Runtime", ""),
    ("status", "Status", ""),
    ("host_total_bytes", "Host RAM / limit", ""),
    ("working_set_pct", "Working set / limit", "-"),
    ("budget_bytes", "Budget", ""),
    ("memlock_soft_bytes", "Memlock", ""),
    (None, "GPUs", ""),
    (None, "Jobs", ""),
    ("alerts", "Issues", "-"),
    ("oom_kills_24h", "OOM 24h", "-"),
    ("last_seen", "Last seen", ""),
)


fleet_pages = viewer_pages()
login_pages = APIRouter(include_in_schema=False)


# The supervisor states the list says beside a node's status: those with an alert of their own
# (alerts.py: lost and gave-up critical, stopped and exited warnings), so a dead supervisor on an
# online node is seen in the list, not only on its page.
SUPERVISOR_RISKY = ("lost", "gave-up", "stopped", "exited")


def sort_link(sort: str, key: str, first: str) -> str:
    """The sort a column's heading links to: its first direction, or the other one when that is on."""
    return ("" if first == "-" else "-") + key if sort == first + key else first + key


@fleet_pages.get("/", response_class=HTMLResponse)
async def index(
    *,
    request: Request,
    store: StoreDep,
    q: str = "",
    status: str = "",
    label: str = "",
    supervisor: str = "",
    sort: str = DEFAULT_SORT,
    offset: str = "0",
    show: Annotated[str, Query(alias="alerts", max_length=64)] = "",
    alerts_offset: str = "0",
    notice: Annotated[str | None, Cookie(alias=NOTICE)] = None,
) -> Response:
    """The fleet: cards, alerts grouped by kind (*show*: the kind listed in full, ``ALERTS_PAGE``
    at a time from *alerts_offset*), a page of nodes (of the *label* ``KEY=VALUE`` and the
    *supervisor* state when given), riskiest first unless *sort* says otherwise."""
    q = q.replace("\x00", "")[:128]  # PostgreSQL text cannot hold NUL
    status = status if status in STATUSES else ""
    supervisor = supervisor if supervisor in SUPERVISOR_STATES else ""
    sort = sort if sort.lstrip("-") in SORT_KEYS else DEFAULT_SORT
    start = _offset(offset)
    label = label.replace("\x00", "")[:320]
    label_error, wanted = None, None
    try:
        wanted = label_filter(label) if label else None
    except ValueError as exc:
        label_error = str(exc)
    listing_query: dict[str, Any] = {"status": status or None, "q": q or None, "label": wanted, "sort": sort}
    listing_query |= {"supervisor": supervisor or None}
    listing_query |= {"offset": start, "limit": PAGE_SIZE}
    alerts_query = {"shown": ALERTS_SHOWN, "show_all": show, "start": _offset(alerts_offset), "page": ALERTS_PAGE}
    overview = await db_read(request, store.overview, listing_query, alerts_query)
    listing, alerts, summary = overview["listing"], overview["alerts"], overview["summary"]
    current: dict[str, Any] = {"q": q, "status": status, "label": label, "supervisor": supervisor}
    current |= {"sort": sort, "offset": start}
    forgotten = notice if notice and is_valid_node_name(notice) else None
    response = render(
        request,
        "index.html",
        listing=listing,
        alert_groups=alerts["groups"],
        alert_count=alerts["total"],
        alerts_page=ALERTS_PAGE,
        shown_kind=show,
        summary=summary,
        kept=overview["kept"],
        page_size=PAGE_SIZE,
        columns=COLUMNS,
        default_sort=DEFAULT_SORT,
        sort_link=sort_link,
        forgotten=forgotten,
        live=LIVE,
        label_error=label_error,
        supervisor_states=SUPERVISOR_STATES,
        supervisor_risky=SUPERVISOR_RISKY,
        query=lambda **kw: _query(current, kw),
        **current,
    )
    if notice is not None and request.query_params.get("fragment") != "1":
        response.delete_cookie(NOTICE, path="/", httponly=True, samesite="strict")  # shown once
    return response


def _offset(text: str) -> int:
    """An offset from the query string: digits only, at most 10,000,000; anything else is 0."""
    return min(int(text), 10_000_000) if re.fullmatch(r"[0-9]{1,9}", text) else 0


def chart_since_ms(chosen: str, now_s: float) -> int:
    """The first time (epoch ms) a chart of the range *chosen* draws."""
    return int((now_s - RANGES[chosen]) * 1000)


NO_HISTORY_MS = 2**62  # the detail's own series (by receive time) reads nothing: the chart reads its own


def node_with_chart(store: Store, name: str, chosen: str | None, now: float, events: int) -> dict[str, Any] | None:
    """The node's detail (``Store.node_detail``, its timeline's page from *events*) with the
    chart's ``history`` by the time each report was measured (``history.measured_series``) over
    the range *chosen*, or, when None, over the range that fits the node's data (``fit_range``:
    its reports and its events' marks of the last 30 days); ``range`` says which. None: no such node."""
    detail = store.node_detail(name, history_points=2, history_since_ms=NO_HISTORY_MS, timeline=(TIMELINE_PAGE, events))
    if detail is None:
        return None
    with store.engine.connect() as conn:
        node_id = history.node_id_of(conn, name)
        if chosen is None:
            widest = chart_since_ms(AUTO_RANGES[-1], now)
            first = None if node_id is None else history.first_measured_ms(conn, node_id, widest)
            marks = [t for t in marked_times(detail["events"]) if t >= widest / 1000]
            chosen = fit_range(now, [None if first is None else first / 1000, *marks])
        points = RAW_REPORTS if RANGES[chosen] <= 86400 else HISTORY_POINTS
        since = chart_since_ms(chosen, now)
        series = history.measured_series(conn, node_id, points, since) if node_id is not None else ([], 0)
    detail["history"], detail["history_count"] = series
    detail["range"] = chosen
    return detail


@fleet_pages.get("/nodes/{name}", response_class=HTMLResponse)
async def node_page(
    request: Request, store: StoreDep, settings: SettingsDep, name: str, *, range: str = "", events: str = "0"
) -> Response:
    """One node; ``?range=`` (15m, 1h, 6h, 24h, 7d, 30d) sets the chart's span, else the
    smallest of 1h to 30d that holds the node's data (``node_with_chart``). Up to a day, the chart
    draws the reports themselves while there are at most ``RAW_REPORTS`` of them (a day at the
    default 30 s is 2,880), else the worst of each of ``RAW_REPORTS`` equal time buckets; longer
    ranges draw ``HISTORY_POINTS`` buckets; each at the time it was measured. The timeline lists
    ``TIMELINE_PAGE`` events from ``?events=`` (an offset), newest first."""
    chosen = range if range in RANGES else None
    now = time.time()
    detail = (
        await db_read(request, node_with_chart, store, name, chosen, now, _offset(events))
        if is_valid_node_name(name)
        else None
    )
    if detail is None:
        return missing_node(request, name)
    span = RANGES[detail["range"]]
    chart = Markup(memory_chart(detail["history"], detail["events"], span, now))  # numbers; labels escaped
    report = conform_report(detail["latest"])
    return render(
        request,
        "node.html",
        node=detail,
        timeline=detail["timeline"],
        events_page=TIMELINE_PAGE,
        chart=chart,
        report=report,
        range=detail["range"],
        fitted=chosen is None,
        ranges=RANGES,
        can_forget=settings.admin_token is not None,
    )


@fleet_pages.get("/profiles", response_class=HTMLResponse)
async def profiles_page(request: Request, store: StoreDep) -> Response:
    """The profiles the fleet observed in the recommender's window, the most observed first."""
    return render(request, "profiles.html", profiles=await db_read(request, store.profiles_index))


@fleet_pages.get("/profiles/{profile}", response_class=HTMLResponse)
async def profile_page(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    profile: str,
    *,
    observations: str = "0",
    oomguard_session: SessionCookie = None,
) -> Response:
    """What the fleet learned of *profile* (``store/profiles.py``): declared against observed, the
    recommendation per class of node, its OOM kills and pressure stops, what applying it changes,
    and its observations (a page from ``?observations=``, an offset), each with an Exclude or
    Include button for the operator (``forget.exclude_or_include``)."""
    offset = _offset(observations)
    view = await db_read(request, store.profile_view, profile, offset) if is_valid_profile_name(profile) else None
    if view is None:
        return render(request, "missing.html", http_status=404, name=profile[:128], what="profile")
    recommended = view["fleet"].per_job_bytes
    chart = Markup(profile_chart(view["samples"], view["declared_per_job_bytes"], recommended, time.time()))
    return render(
        request,
        "profile.html",
        view=view,
        chart=chart,
        window_days=WINDOW_MS // 86_400_000,
        can_exclude=settings.admin_token is not None,
        token=observation_token(oomguard_session, profile),
    )


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
    return page("error.html", status, headers, title=title, message=message, fragment=False)


async def http_error(request: Request, exc: Exception) -> Response:
    """The app's handler of HTTP errors (404 for an unknown address, 405, ...)."""
    status = getattr(exc, "status_code", 500)
    return error_response(request, status, getattr(exc, "detail", None), getattr(exc, "headers", None))


async def server_error(request: Request, exc: Exception) -> Response:
    """The app's handler of a bug: a 500 page or JSON, never a traceback (uvicorn logs it)."""
    return error_response(request, 500, "internal server error")


def _login_page(target: str, error: str | None = None, http_status: int = 200, retry_after: int = 0) -> Response:
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return page("login.html", http_status, headers, next=target, error=error, logout=False)


@login_pages.get("/login", response_class=HTMLResponse)
def login_form(next: str = "/") -> Response:
    return _login_page(_safe_next(next))


@login_pages.post("/login")
async def login(request: Request, settings: SettingsDep) -> Response:
    """The viewer token in, a signed session cookie out; failed tokens count against the client."""
    form = await form_fields(request)
    token = form.get("token", "").strip()
    target = _safe_next(form.get("next", "/"))
    if not token_ok(settings.viewer_token, token):  # a right token always passes (issue 22)
        limiter: FailureLimiter = request.app.state.limiter
        wait = limiter.failed(client_of(request))
        if wait:
            return _login_page(target, f"Too many failed attempts; try again in {wait} s.", 429, wait)
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


CROSS_SITE_LOGOUT = "This request did not come from this manager's own form; open /logout and try again."


@login_pages.get("/logout", response_class=HTMLResponse)
def logout_form(oomguard_session: SessionCookie = None) -> Response:
    """A link cannot end a session (a GET must change nothing): this page asks for the POST, with
    the form's token (``forget.logout_token``: keyed by the session cookie)."""
    return page("login.html", next="/", error=None, logout=True, token=logout_token(oomguard_session))


@login_pages.post("/logout")
async def logout(request: Request, oomguard_session: SessionCookie = None) -> Response:
    """Revoke the session (its cookie is refused from now on, even if kept) and clear the cookie;
    only from this manager's own form, as the other forms (``forget``): our ``Origin`` and the
    form's token, else 403 with one line and the session left as it was (issue 37: another site
    could end it). Without a session there is nothing to end: 303 to the login, no cookie touched."""
    if oomguard_session is None:
        return RedirectResponse("/login", status_code=303)
    field = await form_fields(request)
    expected = logout_token(oomguard_session)
    if not same_origin(request) or not hmac.compare_digest(field.get("csrf", "").encode(), expected.encode()):
        return page("error.html", 403, title="Forbidden", message=CROSS_SITE_LOGOUT, fragment=False)
    sessions: Sessions = request.app.state.sessions
    sessions.revoke(oomguard_session)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


def _safe_next(target: str) -> str:
    """Only a local path: never redirect to another site after login."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"


def _query(current: dict[str, Any], changes: dict[str, Any]) -> str:
    """A link to the overview with *changes*; the default sort and empty values left out."""
    params = {**current, **changes}
    kept = {k: v for k, v in params.items() if v not in ("", 0, None) and not (k == "sort" and v == DEFAULT_SORT)}
    return "?" + urllib.parse.urlencode(kept) if kept else "/"


routers = (fleet_pages, login_pages)
