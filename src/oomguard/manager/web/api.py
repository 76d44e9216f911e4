"""The HTTP API: agents POST reports, events and observations (the node's own token, or the fleet-wide agent
token: ``deps.require_agent``; the body's ``node`` must be the token's, ``deps.may_write``; a node's
events and observations a minute are capped: ``web.quotas``);
readers GET nodes, alerts, a profile's recommendation and Prometheus metrics (viewer token); the operator DELETEs a node
and excludes or includes one observation (admin token); ``/healthz`` is open and checks the database.

No client input gets a 5xx: a body that is not strict JSON is refused by the middleware
(``oomguard.manager.bodies``), one that does not fit its envelope (``bodies``) or a report that
does not fit its contract (``oomguard.manager.contract``: schema.json and what the manager needs)
gets 422, and so does a query parameter out of its bounds, and an observation that cannot be a run
of its node (``bodies.observation_problem``, against its latest report's effective limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from sqlalchemy import Engine, text

from oomguard.manager import contract
from oomguard.manager.alerts import STATUSES, SUPERVISOR_STATES
from oomguard.manager.bodies import (
    CLASS_PATTERN,
    ID_PATTERN,
    EventEnvelope,
    ObservationEnvelope,
    ReportEnvelope,
    Stored,
    label_filter,
    observation_problem,
    whole_bytes,
)
from oomguard.manager.store import DEFAULT_SORT, SORT_KEYS, Store
from oomguard.manager.store.claims import CAP_RETRY_AFTER_S, Refused
from oomguard.manager.store.health import DatabaseUnavailable, DbHealth, classify
from oomguard.manager.times import parse_iso_ms
from oomguard.manager.web.answers import (
    Alerts,
    Alive,
    Events,
    Excluded,
    Health,
    History,
    Invalid,
    NodeDetail,
    Nodes,
    Problem,
    Profiles,
    Recommendation,
    RevokedList,
    RevokeResult,
)
from oomguard.manager.web.deps import (
    DB_FAILURES,
    AgentDep,
    ReaderOrAgentDep,
    StoreDep,
    compute_read,
    db_read,
    db_write,
    get_store,
    may_write,
    not_revoked,
    require_admin,
    require_agent,
    require_operator,
    require_viewer,
)
from oomguard.manager.web.metrics import render_metrics
from oomguard.manager.web.quotas import NodeQuota, Quotas
from oomguard.nodes import NODE_PATTERN, PROFILE_PATTERN
from oomguard.units import MAX_SIZE

HEALTH_TIMEOUT_S = 2.0
NO_NUL = r"^[^\x00]*$"
# The answers besides a route's own (``response_model``: ``web.answers``). Every error body is
# ``{"detail": ...}``: ``answers.Problem``, a 422's ``answers.Invalid``.
Responses = dict[int | str, dict[str, Any]]
REFUSALS: Responses = {
    401: {"model": Problem, "description": "no valid bearer token (or session)"},
    408: {"model": Problem, "description": "the body did not arrive in time"},
    413: {"model": Problem, "description": "body too large"},
    422: {"model": Invalid, "description": "the request does not fit its parameters or body"},
    429: {
        "model": Problem,
        "description": (
            "too many failed tokens (this client's, or all clients'), new nodes an hour, or the node's "
            "events or observations a minute (Retry-After)"
        ),
    },
    503: {"model": Problem, "description": "the database is unavailable; retry later (Retry-After)"},
}
OTHER_NODES: Responses = {403: {"model": Problem, "description": "the token is another node's"}}
NO_NODE: Responses = {404: {"model": Problem, "description": "no such node"}}
NO_OBSERVATION: Responses = {404: {"model": Problem, "description": "no such observation"}}
UNAVAILABLE: Responses = {503: {"model": Health, "description": "the database cannot be read or written"}}

ingest = APIRouter(
    prefix="/api/v1",
    dependencies=[Depends(require_agent)],
    responses={**REFUSALS, **OTHER_NODES},
)
reads = APIRouter(dependencies=[Depends(require_viewer)], responses=REFUSALS)
admin = APIRouter(
    prefix="/api/v1",
    dependencies=[Depends(require_admin)],
    responses={**REFUSALS, 403: {"model": Problem, "description": "the manager has no admin token (--admin-token)"}},
)
health = APIRouter()
# A profile's learned size: for readers and for the agents that plan with it (deps.require_reader_or_agent).
advice = APIRouter(responses={**REFUSALS, **OTHER_NODES})
OTHER_NODE_READ = "this token is another node's: a node's token reads that node's recommendation only"


def _json(value: Any, what: str) -> str:
    """JSON text of *value*; 422 when it holds NaN or an infinity (a database cannot keep those)."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        raise HTTPException(422, f"the {what} contains NaN or infinite numbers") from None


@ingest.post("/reports", response_model=Stored)
async def post_report(request: Request, body: ReportEnvelope, store: StoreDep, credential: AgentDep) -> Stored:
    problem = contract.problem(body.report)
    if problem is not None:
        raise HTTPException(422, problem)
    report_json = _json(body.report, "report")  # as the agent sent it
    await may_write(request, credential, body.node)
    stored = await db_write(request, store.ingest_report_async(body, report_json, parse_iso_ms(body.time)))
    return Stored(stored=stored, id=body.id)


def within_quota(request: Request, quota: NodeQuota, node: str) -> None:
    """429 with ``Retry-After`` and the quota's one line when *node* is over *quota* this minute,
    by the store's clock (the receive time every row gets; a test's or a benchmark's own)."""
    wait = quota.take(node, get_store(request).clock() / 1000)
    if wait:
        raise HTTPException(429, quota.reason(), headers={"Retry-After": str(wait)})


def quotas_of(request: Request) -> Quotas:
    quotas: Quotas = request.app.state.quotas
    return quotas


@ingest.post("/events", response_model=Stored)
async def post_event(request: Request, body: EventEnvelope, store: StoreDep, credential: AgentDep) -> Stored:
    """A supervisor's event or heartbeat, or the entrypoint gate's; 429 past the node's events a
    minute (``--max-events-per-node``: ``web.quotas``)."""
    body_json = _json(body.event.model_dump(), "event")
    await may_write(request, credential, body.node)
    within_quota(request, quotas_of(request).events, body.node)
    return Stored(stored=await db_write(request, store.ingest_event_async(body, body_json)), id=body.id)


@ingest.post("/observations", response_model=Stored)
async def post_observation(
    request: Request, body: ObservationEnvelope, store: StoreDep, credential: AgentDep
) -> Stored:
    """What one run of a profiled worker really used (docs/manager.md, "The fleet learns"); an
    idempotent retry of an id stored before answers ``stored: false``. 422 naming the field where
    the run cannot have fitted the effective limit of the node's latest report
    (``bodies.observation_problem``); a node without a report (run-only) is not checked. 429 past
    the node's observations a minute (``--max-observations-per-node``: ``web.quotas``). A node posts
    only for its own class (422 naming the field otherwise), and a new profile or class past a cap
    (``--max-profiles``, ``--max-classes`` and their ``-per-node``) is 429 with ``Retry-After`` a
    day, which the agent takes as lasting (``store/claims.py``)."""
    await may_write(request, credential, body.node)
    limit = await db_read(request, store.reported_limit, body.node)
    problem = None if limit is None else observation_problem(body.observation, limit)
    if problem is not None:
        raise HTTPException(422, problem)
    within_quota(request, quotas_of(request).observations, body.node)
    stored = await db_write(request, store.ingest_observation_async(body))
    if isinstance(stored, Refused):  # another class than the node's own (422), or past a cap (429)
        headers = {"Retry-After": str(CAP_RETRY_AFTER_S)} if stored.status == 429 else None
        raise HTTPException(stored.status, stored.reason, headers=headers)
    return Stored(stored=stored, id=body.id)


@reads.get("/api/v1/profiles", response_model=Profiles)
async def get_profiles(request: Request, store: StoreDep) -> dict[str, Any]:
    """The profiles observed in the recommender's window (14 days), the most observed first: each
    one's runs (``samples``), ``nodes``, ``failures`` (OOM kills and pressure stops) and the time
    of its newest run (``updated``); at most 200."""
    return {"profiles": await db_read(request, store.profiles_index)}


@advice.get("/api/v1/profiles/{profile}/recommendation", response_model=Recommendation)
async def get_recommendation(
    *,
    request: Request,
    store: StoreDep,
    credential: ReaderOrAgentDep,
    profile: Annotated[str, Path(pattern=PROFILE_PATTERN, max_length=128)],
    node: Annotated[str | None, Query(pattern=NODE_PATTERN, max_length=128)] = None,
    node_class: Annotated[str | None, Query(pattern=CLASS_PATTERN, max_length=64)] = None,
    budget_bytes: Annotated[int | None, Query(ge=1, le=MAX_SIZE), BeforeValidator(whole_bytes)] = None,
) -> dict[str, Any]:
    """The size to plan *profile*'s jobs at on *node* (of *node_class*: default the node's): the
    node's own samples, else its class's, else the fleet's, else the size declared (``source``),
    with the floor an OOM kill or pressure stop raised, the samples and rule it came from
    (``explanation``) and its ``confidence``; beside it, a forecast of one job's P95 peak
    (``peak_p95_per_job_bytes``: not a size to plan at). With *budget_bytes* (the run's budget), the size
    that fits the most jobs whose summed peaks keep ``learning.RUN_Z`` standard deviations under it, where the
    node's or its class's samples allow (docs/manager.md). A reader's token (or session) asks for any node; an
    agent's for its own (``plan --learned``, ``run --learned``): a node's token for that node
    only (the default *node*), 403 for another."""
    if credential is not None and credential.node is not None:
        if node is not None and node != credential.node:
            raise HTTPException(403, OTHER_NODE_READ)
        node = credential.node
        await not_revoked(request, node)
    return await db_read(request, store.recommendation, profile, node, node_class, budget_bytes)


@reads.get("/api/v1/nodes", response_model=Nodes)
async def get_nodes(
    *,
    request: Request,
    store: StoreDep,
    status: Annotated[str | None, Query(pattern="^(" + "|".join(STATUSES) + ")$")] = None,
    q: Annotated[str | None, Query(max_length=128, pattern=NO_NUL)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    sort: Annotated[str, Query(pattern="^-?(" + "|".join(SORT_KEYS) + ")$")] = DEFAULT_SORT,
    label: Annotated[str | None, Query(max_length=320, pattern=NO_NUL, description="KEY=VALUE")] = None,
    supervisor: Annotated[str | None, Query(pattern="^(" + "|".join(SUPERVISOR_STATES) + ")$")] = None,
) -> dict[str, Any]:
    """Node summaries, a page at a time. Without *status*, every node but the archived ones.
    *sort* ``risk`` (the default): the live nodes first (online, run-only, refused), by working
    set over limit, then open alerts, then OOM kills in 24 h; the offline ones after them.
    *label* ``KEY=VALUE``: the nodes whose latest labels hold it. *supervisor*: the nodes whose
    supervisor is in that state (``lost``: silent for 3 heartbeat intervals)."""
    wanted = parse_label(label)
    query = {"status": status, "q": q, "limit": limit, "offset": offset, "sort": sort, "label": wanted}
    return await db_read(request, store.list_nodes, **query, supervisor=supervisor)


def parse_label(text: str | None) -> tuple[str, str] | None:
    """``KEY=VALUE`` of the label filter, as (key, value); 422 for anything else."""
    try:
        return None if text is None else label_filter(text)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None


NodeName = Annotated[str, Path(pattern=NODE_PATTERN, max_length=128)]


@reads.get("/api/v1/nodes/{name}", response_model=NodeDetail, response_model_exclude_unset=True, responses=NO_NODE)
async def get_node(
    request: Request,
    store: StoreDep,
    name: NodeName,
    points: Annotated[int, Query(ge=2, le=2000)] = 500,
) -> dict[str, Any]:
    """The node, its events and its history downsampled to at most *points* entries (the chart)."""
    detail = await db_read(request, store.node_detail, name, history_points=points)
    if detail is None:
        raise HTTPException(404, f"no node named {name!r}")
    return detail


@reads.get("/api/v1/nodes/{name}/history", response_model=History, responses=NO_NODE)
async def get_node_history(
    request: Request,
    store: StoreDep,
    name: NodeName,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
    before: Annotated[str | None, Query(max_length=64, pattern=NO_NUL)] = None,
) -> dict[str, Any]:
    """Every stored report, newest first, a page at a time: pass ``next`` as ``before``."""
    try:
        page = await db_read(request, store.node_history, name, limit=limit, before=before)
    except ValueError:
        raise HTTPException(422, "before: not a cursor from a previous page's next") from None
    if page is None:
        raise HTTPException(404, f"no node named {name!r}")
    return page


@reads.get("/api/v1/nodes/{name}/events", response_model=Events, responses=NO_NODE)
async def get_node_events(
    request: Request,
    store: StoreDep,
    name: NodeName,
    limit: Annotated[int, Query(ge=1, le=1000)] = 25,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> dict[str, Any]:
    """The node's events (its timeline), newest first, a page at a time: ``total`` says how many."""
    page = await db_read(request, store.node_events, name, limit=limit, offset=offset)
    if page is None:
        raise HTTPException(404, f"no node named {name!r}")
    return page


@admin.delete("/nodes/{name}", status_code=204, responses=NO_NODE)
async def delete_node(request: Request, store: StoreDep, name: NodeName) -> Response:
    """Forget a node: the node and all its rows (reports, events) are deleted. A later report or
    event from it starts it anew. Admin token only (``--admin-token``)."""
    if not await db_write(request, store.forget_node(name)):
        raise HTTPException(404, f"no node named {name!r}")
    return Response(status_code=204)


class Revocation(BaseModel):
    """Why a node's token is revoked (kept with it, shown in the list)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reason: Annotated[str, Field(max_length=500, pattern=NO_NUL)] | None = None


@admin.put(
    "/revoked/{name}",
    response_model=RevokeResult,
    responses={200: {"description": "revoked (revoked: false when it was already)"}},
)
async def revoke_node(
    request: Request, store: StoreDep, name: NodeName, body: Revocation | None = None
) -> dict[str, Any]:
    """Revoke node *name*'s token without rotating the fleet secret: from now on every replica
    answers 403 to every write of the node (its own token's or the fleet-wide one's) and to a read
    with its token. Admin token only."""
    done = await db_write(request, store.revoke(name, body.reason if body else None))
    request.app.state.revoked.changed()
    return {"node": name, "revoked": done}


@admin.delete("/revoked/{name}", status_code=204, responses={404: {"model": Problem, "description": "not revoked"}})
async def unrevoke_node(request: Request, store: StoreDep, name: NodeName) -> Response:
    """Take node *name* off the revoked list: its token works again. Admin token only."""
    if not await db_write(request, store.unrevoke(name)):
        raise HTTPException(404, f"node {name!r} is not revoked")
    request.app.state.revoked.changed()
    return Response(status_code=204)


@reads.get("/api/v1/revoked", response_model=RevokedList)
async def get_revoked(request: Request, store: StoreDep) -> dict[str, Any]:
    """The revoked nodes, by name: ``{revoked: [{node, revoked, reason}]}``."""
    return {"revoked": await db_read(request, store.revoked_nodes)}


operator = APIRouter(
    prefix="/api/v1",
    dependencies=[Depends(require_operator)],
    responses={
        **REFUSALS,
        403: {"model": Problem, "description": "not the admin token, or the manager has none (--admin-token)"},
    },
)
IngestIdPath = Annotated[str, Path(pattern=ID_PATTERN, max_length=128)]


async def _set_excluded(request: Request, store: Store, node: str, id_: str, excluded: bool) -> dict[str, Any]:
    """The flag set (``Store.set_excluded``) and said; 404 for no such observation of *node*."""
    if not await db_write(request, store.set_excluded(node, id_, excluded)):
        raise HTTPException(404, f"no observation {id_!r} of node {node!r}")
    return {"node": node, "id": id_, "excluded": excluded}


@operator.post("/observations/{node}/{id}/exclude", response_model=Excluded, responses=NO_OBSERVATION)
async def exclude_observation(request: Request, store: StoreDep, node: NodeName, id: IngestIdPath) -> dict[str, Any]:
    """Leave the observation *id* (the ``id`` it was posted with) of *node* out of what the fleet
    learns: it is kept, and listed on its profile's page as excluded. Admin token only."""
    return await _set_excluded(request, store, node, id, True)


@operator.post("/observations/{node}/{id}/include", response_model=Excluded, responses=NO_OBSERVATION)
async def include_observation(request: Request, store: StoreDep, node: NodeName, id: IngestIdPath) -> dict[str, Any]:
    """Learn from the observation *id* of *node* again (undoes ``exclude``). Admin token only."""
    return await _set_excluded(request, store, node, id, False)


@reads.get("/api/v1/alerts", response_model=Alerts)
async def get_alerts(request: Request, store: StoreDep) -> dict[str, Any]:
    return {"alerts": await db_read(request, store.alerts)}


@reads.get("/metrics", response_class=Response)
async def metrics(request: Request, store: StoreDep) -> Response:
    """Node series and the manager's own; the latter also while the database cannot be read."""
    learned: list[dict[str, Any]] | None = None
    try:
        rows: list[dict[str, Any]] | None = await db_read(request, store.metric_rows)
    except DatabaseUnavailable:
        rows = None
    if rows is not None:
        # The recommender's answers apart: a computation that outlives the request's time is the
        # recommender's CPU, not the database (issue 37: /metrics said database_up 0 for it).
        with contextlib.suppress(DatabaseUnavailable):
            learned = await compute_read(request, store.class_recommendations)
    db_health: DbHealth = request.app.state.health
    text_, content_type = render_metrics(
        rows,
        dict(db_health.errors),
        store.line,
        learned,
        quotas_of(request).refused(),
        cap_refusals=store.caps.refused,
        own=request.app.state.observed.collectors(),
    )
    return Response(text_, media_type=content_type)


def _ping(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


def _retrieved(probe: asyncio.Future[None]) -> None:
    """Mark the check's outcome as seen. A check that outlived its requests' time-out ends with
    nobody awaiting it; an exception left unretrieved is asyncio's "Future exception was never
    retrieved" with a traceback when the future is collected, one per hung check (issue 37: 22 in
    84 s while PostgreSQL hung). The fault is the episode's, which ``DbHealth`` logs once."""
    if not probe.cancelled():
        probe.exception()


async def database_check(request: Request) -> str:
    """``ok``, or the kind of failure of a ``SELECT 1`` within HEALTH_TIMEOUT_S. One check at a
    time: while a check hangs (a stopped server), later ones wait on it rather than pile up."""
    state = request.app.state
    probe = getattr(state, "ping", None)
    if probe is None or probe.done():
        probe = state.ping = asyncio.get_running_loop().run_in_executor(None, _ping, state.store.engine)
        probe.add_done_callback(_retrieved)
    try:
        await asyncio.wait_for(asyncio.shield(probe), HEALTH_TIMEOUT_S)
    except DB_FAILURES as exc:
        return classify(exc)
    return "ok"


@health.get("/livez", response_model=Alive)
async def livez() -> dict[str, str]:
    """Liveness: 200 while this process answers HTTP, whatever the database does (a database outage
    is not cured by a restart). Open, no token, no database read."""
    return {"status": "alive"}


@health.get("/readyz", response_model=Health, responses=UNAVAILABLE)
async def readyz(request: Request) -> JSONResponse:
    """Readiness: ``healthz``'s answer (200 while this replica can use the database, else 503): a
    load balancer sends it traffic only then."""
    return await healthz(request)


@health.get("/healthz", response_model=Health, responses=UNAVAILABLE)
async def healthz(request: Request) -> JSONResponse:
    """200 when the database answers and no write episode is open; else 503 with the cause (the
    readiness answer, ``/readyz``; ``/livez`` is liveness)."""
    database = await database_check(request)
    db_health: DbHealth = request.app.state.health
    if database == "ok":
        db_health.success("reads")  # this check was a read that worked
    failing = db_health.failing()
    if database != "ok":
        failing["reads"] = database
    body = {"status": "ok" if not failing else "unavailable", "database": database, "failing": failing}
    return JSONResponse(body, status_code=200 if not failing else 503)


routers = (ingest, reads, advice, admin, operator, health)
