"""The HTTP API: agents POST reports and events (agent token); readers GET nodes, alerts and
Prometheus metrics (viewer token); ``/healthz`` is open.

Invalid JSON, a body that does not fit the models, or NaN/infinite numbers get 422, never 500.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response

from oomguard.manager.deps import StoreDep, require_agent, require_viewer
from oomguard.manager.metrics import render_metrics
from oomguard.manager.models import NODE_PATTERN, EventEnvelope, ReportEnvelope, Stored
from oomguard.manager.store import SORT_KEYS
from oomguard.manager.times import parse_iso_ms

TOO_LARGE: dict[int | str, dict[str, Any]] = {413: {"description": "body too large"}}

ingest = APIRouter(prefix="/api/v1", dependencies=[Depends(require_agent)])
reads = APIRouter(dependencies=[Depends(require_viewer)])
health = APIRouter()


def _json(value: Any, what: str) -> str:
    """JSON text of *value*; 422 when it holds NaN or an infinity (a database cannot keep those)."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        raise HTTPException(422, f"the {what} contains NaN or infinite numbers") from None


@ingest.post("/reports", response_model=Stored, responses=TOO_LARGE)
async def post_report(body: ReportEnvelope, store: StoreDep) -> Stored:
    report_json = _json(body.report.model_dump(), "report")  # python mode: NaN stays NaN, and is refused
    stored = await store.ingest_report_async(body, report_json, parse_iso_ms(body.time))
    return Stored(stored=stored, id=body.id)


@ingest.post("/events", response_model=Stored, responses=TOO_LARGE)
async def post_event(body: EventEnvelope, store: StoreDep) -> Stored:
    body_json = _json(body.event.model_dump(), "event")
    return Stored(stored=await store.ingest_event_async(body, body_json), id=body.id)


@reads.get("/api/v1/nodes")
def get_nodes(
    *,
    store: StoreDep,
    status: Annotated[str | None, Query(pattern="^(online|offline)$")] = None,
    q: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    sort: Annotated[str, Query(pattern="^-?(" + "|".join(SORT_KEYS) + ")$")] = "name",
) -> dict[str, Any]:
    return store.list_nodes(status=status, q=q, limit=limit, offset=offset, sort=sort)


@reads.get("/api/v1/nodes/{name}")
def get_node(store: StoreDep, name: Annotated[str, Path(pattern=NODE_PATTERN, max_length=128)]) -> dict[str, Any]:
    detail = store.node_detail(name)
    if detail is None:
        raise HTTPException(404, f"no node named {name!r}")
    return detail


@reads.get("/api/v1/alerts")
def get_alerts(store: StoreDep) -> dict[str, Any]:
    return {"alerts": store.alerts()}


@reads.get("/metrics", response_class=Response)
def metrics(store: StoreDep) -> Response:
    text, content_type = render_metrics(store.metric_rows())
    return Response(text, media_type=content_type)


@health.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


routers = (ingest, reads, health)
