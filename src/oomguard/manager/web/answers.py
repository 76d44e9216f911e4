"""What the API answers (issue 39, item 8): the JSON bodies of ``web.api``'s reads, the
operator's writes and the health checks, as pydantic models, so that ``/openapi.json`` says their
shape. Each describes what the store already builds (``store.queries``, ``store.history``,
``store.supervisor``, ``store.learned``, ``store.profiles``, ``store.revoked``, ``alerts``): it
adds, renames and drops nothing.

FastAPI validates a route's answer against its ``response_model`` (a mismatch would be a 500),
so every field takes each value the store can give: a nullable field is ``X | None``; a field the
store leaves out of some answers (``sometimes``) is absent there, never null, and the routes that
carry one serialize with ``response_model_exclude_unset`` (only the keys the store set). What is
open-ended stays so: a node's latest whole report (``schema.json``, kept as the agent sent it), an
event's fields (a newer supervisor's are kept), labels. The error bodies are ``Problem`` and
``Invalid`` (``app.validation_failed``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from oomguard._types import RecommendationSource

ISO = "ISO 8601 UTC with milliseconds"


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def sometimes(description: str) -> Any:
    """A field some answers leave out (absent then, not null): no default in the schema."""
    return Field(default=None, description=description, json_schema_extra=_no_default)


# -- errors ---------------------------------------------------------------------------------------


class Problem(BaseModel):
    """An error: its one line (401, 403, 404, 408, 413, 429, 503; a 422 a route or the body check raised)."""

    detail: str


class ValidationProblem(BaseModel):
    """One reason a request does not fit its parameters or envelope (the client's own keys not echoed)."""

    loc: list[int | str] = Field(description="Where: body, query, path, ...; then field names or list indexes")
    msg: str
    type: str


class Invalid(BaseModel):
    """A 422: the reasons the request does not fit (at most 20), or the one line of the route's own check."""

    detail: str | list[ValidationProblem]


# -- health ---------------------------------------------------------------------------------------


class Alive(BaseModel):
    """``/livez``: the process answers."""

    status: str = Field(description="alive")


class Health(BaseModel):
    """``/healthz`` and ``/readyz``: 200 with ``ok``, or 503 with ``unavailable`` and the cause."""

    status: str = Field(description="ok or unavailable")
    database: str = Field(description="ok, or the kind of failure of a SELECT 1 within 2 s (timeout, ...)")
    failing: dict[str, str] = Field(description="Open failure episodes of the last minute: reads or writes -> kind")


# -- profiles and the recommendation --------------------------------------------------------------


class ProfileSummary(BaseModel):
    """A profile observed in the recommender's window (excluded observations left out)."""

    profile: str
    samples: int = Field(description="Runs observed in the window")
    nodes: int = Field(description="Distinct nodes that ran it")
    failures: int = Field(description="Runs that ended in an OOM kill or a pressure stop")
    updated: str = Field(description=f"The newest run's receive time ({ISO})")


class Profiles(BaseModel):
    """``GET /api/v1/profiles``: the most observed first, at most 200."""

    profiles: list[ProfileSummary]


class Recommendation(BaseModel):
    """``GET /api/v1/profiles/{profile}/recommendation``: recommendation.schema.json and the request's fields."""

    profile: str
    node: str | None = Field(description="The node asked for; null: none (the class's or the fleet's answer)")
    node_known: bool = Field(description="Whether the manager knows that node")
    node_class: str | None = Field(description="The class the answer is for; null: unknown")
    budget_bytes: int | None = Field(description="The budget the answer was sized for; null: any")
    per_job_bytes: int | None = Field(description="The per-job size to plan at; null: declared, nothing observed")
    baseline_bytes: int | None = Field(description="The baseline to plan at; null: declared, nothing observed")
    source: RecommendationSource = Field(description="The scope the answer came from")
    samples: int = Field(description="The samples the answer came from")
    confidence: float = Field(description="n / (n + 5), n the samples' summed weights")
    updated: str | None = Field(description=f"The newest sample's receive time ({ISO}); null: none")
    declared_per_job_bytes: int | None = Field(description="The newest run's declared per-job size")
    declared_baseline_bytes: int | None = Field(description="The newest run's declared baseline")
    floor_bytes: int = Field(description="The per-job floor an OOM kill or a pressure stop raised (0: none)")
    peak_p95_per_job_bytes: int | None = Field(description="One job's P95 peak, a forecast; null: too few runs")
    peak_p95_source: RecommendationSource | None = Field(description="The scope of that forecast; null: none")
    peak_p95_explanation: str
    explanation: list[str] = Field(description="The rule's steps in words, one line each")


# -- nodes ----------------------------------------------------------------------------------------


class Gpu(BaseModel):
    """A GPU of the node's latest report, the fields the manager keeps."""

    index: int
    name: str
    memory_total_bytes: int | None
    memory_free_bytes: int | None


class Refusal(BaseModel):
    """The entrypoint gate's latest refusal (a failed ``gate`` event)."""

    since: str = Field(description=f"When ({ISO})")
    step: str | None = Field(description="check, plan or verify")
    exit_code: int | None
    message: str | None = Field(description="The failing step's one line")


class NodeSummary(BaseModel):
    """A node as the list shows it: its latest report's numbers, status, counts and labels."""

    name: str
    status: str = Field(description="online, offline, run-only, refused or archived")
    last_seen: str = Field(description=f"Its latest report, event or heartbeat ({ISO})")
    last_report: str | None = Field(description=f"Its latest report ({ISO}); null: none (run-only)")
    offline_since: str | None = Field(description="last_seen while offline; else null")
    current: bool = Field(description="Whether the latest report is current (its working set a reading)")
    effective_bytes: int | None = Field(description="The effective memory limit")
    host_total_bytes: int | None
    budget_bytes: int | None
    usage_bytes: int | None
    working_set_bytes: int | None
    working_set_pct: float | None = Field(description="Working set over the limit, in %, while current; else null")
    last_working_set_pct: float | None = Field(description="The latest report's, current or not")
    limited_by: str | None = Field(description="What sets the effective limit (cgroup-v2, host, ...)")
    runtime: str | None = Field(description="The container runtime")
    gpus: list[Gpu]
    memlock_soft_bytes: int | None
    cap_ipc_lock: bool | None = Field(description="Whether the latest report holds CAP_IPC_LOCK; null: unknown")
    oom_kills_24h: int = Field(description="Supervised OOM kills in 24 h")
    kernel_oom_kills_24h: int = Field(description="The kernel counter's OOM kills in 24 h")
    kernel_oom_kills_total: int = Field(description="The kernel counter's OOM kills in all, as its rises add up")
    kernel_oom_counter: int | None = Field(description="The kernel's oom_kill counter in the latest report")
    pressure_stops_24h: int
    supervisor_state: str | None = Field(description="Its supervisor's state (lost: 3 heartbeats missed); null: none")
    alerts: int = Field(description="Open alerts")
    warnings: list[str] = Field(description="The latest report's warning codes")
    warnings_count: int
    concurrency: int | None = Field(description="The plan's concurrency, when the agent plans")
    clock_skew_s: float | None = Field(description="The agent's clock minus the manager's, at the latest report")
    refused: Refusal | None = Field(description="The entrypoint gate's refusal; null: not refused")
    labels: dict[str, str] = Field(description="The latest labels sent")


class Nodes(BaseModel):
    """``GET /api/v1/nodes``: a page of node summaries and how many match."""

    nodes: list[NodeSummary]
    total: int
    limit: int
    offset: int


class Alert(BaseModel):
    """An open alert of a node (``alerts.ALERTS``)."""

    node: str
    kind: str = Field(description="offline, refused, oom-kills, working-set-high, supervisor-lost, ...")
    severity: str = Field(description="critical or warning")
    message: str
    since: str | None = Field(description=f"When the node got it ({ISO}), where known")


class Alerts(BaseModel):
    """``GET /api/v1/alerts``: every open alert, the riskiest nodes first."""

    alerts: list[Alert]


class ExitWords(BaseModel):
    """Why the supervisor exited, stopped, gave up or restarts: its latest event's words."""

    reason: str | None
    message: str | None


class LastExit(BaseModel):
    """The supervisor's latest exit event."""

    reason: str | None = Field(description="clean, exit, signal, oom-kill or pressure-stop")
    time: str = Field(description=f"Its receive time ({ISO})")
    exit_code: int | None
    signal: int | None
    message: str | None


class Supervisor(BaseModel):
    """The node's supervisor, from its latest events (``store.supervisor``)."""

    state: str = Field(description="running, starting, exited, restarting, gave-up, stopped, refused or lost")
    since: str = Field(description=f"Since when ({ISO})")
    current: bool = Field(description="Whether the supervisor is still heard from (the node not offline)")
    planned: int | None = Field(description="The jobs planned")
    jobs: int | None = Field(description="The jobs started (running only)")
    stepped_down: bool = sometimes("Fewer jobs than planned (running only)")
    why: str | None = sometimes("The restart's message before a step down (running only)")
    restart_in_s: float | None = sometimes("Seconds to the restart (restarting; null when lost)")
    was: str = sometimes("The state before it was lost (lost only)")
    after: ExitWords = sometimes("The latest event's reason and message (gave-up, stopped, exited, restarting)")
    last_exit: LastExit | None


class Event(BaseModel):
    """A stored event: the supervisor's (docs/run.md), the gate's, or the manager's own ``kernel-oom``."""

    model_config = ConfigDict(extra="allow")  # the event's own fields, as posted (a newer supervisor's kept)
    event: str = Field(description="start, exit, restart, give-up, stop, gate, kernel-oom")
    received: str = Field(description=f"Its receive time ({ISO})")


class HistoryPoint(BaseModel):
    """One entry of a node's history: a report, or the worst of a bucket of them (downsampled)."""

    time: str = Field(description=f"Receive time ({ISO}): the report's, or the bucket's last")
    effective_bytes: int | None
    budget_bytes: int | None
    usage_bytes: int | None
    working_set_bytes: int | None


class NodeDetail(NodeSummary):
    """``GET /api/v1/nodes/{name}``: the node's summary, alerts, latest report, supervisor, history and events."""

    open_alerts: list[Alert]
    latest: dict[str, Any] | None = Field(description="The latest whole report (schema.json); null: none")
    supervisor: Supervisor | None = Field(description="null: no supervisor events")
    history: list[HistoryPoint] = Field(description="Oldest first, at most `points` entries (downsampled past that)")
    history_count: int = Field(description="The stored reports the history covers")
    events: list[Event] = Field(description="The latest 500 events, newest first")
    events_total: int


class StoredReport(HistoryPoint):
    """One stored report of a node's history page."""

    agent_time: str | None = Field(description=f"The agent's own time of the report ({ISO}); null: not sent")


class History(BaseModel):
    """``GET /api/v1/nodes/{name}/history``: a page of stored reports, newest first."""

    node: str
    history: list[StoredReport]
    next: str | None = Field(description="The next page's `before`; null: no more")


class Events(BaseModel):
    """``GET /api/v1/nodes/{name}/events``: a page of the node's events, newest first."""

    node: str
    events: list[Event]
    total: int
    limit: int
    offset: int


# -- the operator's ---------------------------------------------------------------------------


class RevokeResult(BaseModel):
    """``PUT /api/v1/revoked/{name}``."""

    node: str
    revoked: bool = Field(description="False when it was revoked already")


class RevokedNode(BaseModel):
    """A revoked node."""

    node: str
    revoked: str = Field(description=f"Since when ({ISO})")
    reason: str | None


class RevokedList(BaseModel):
    """``GET /api/v1/revoked``: by name."""

    revoked: list[RevokedNode]


class Excluded(BaseModel):
    """``POST /api/v1/observations/{node}/{id}/exclude`` and ``/include``: the flag as set."""

    node: str
    id: str
    excluded: bool


__all__ = [
    "Alert",
    "Alerts",
    "Alive",
    "Event",
    "Events",
    "Excluded",
    "Health",
    "History",
    "Invalid",
    "NodeDetail",
    "Nodes",
    "Problem",
    "Profiles",
    "Recommendation",
    "RevokeResult",
    "RevokedList",
]
