"""The API's answers are typed in /openapi.json (issue 39, item 8), and the types are true.

- Every operation of the API and the health checks declares a JSON schema for its 2xx answer
  (``web.answers``), but the few listed in ``NO_JSON_BODY`` with their reason; every error it
  declares has one too (``answers.Problem``, ``answers.Invalid``).
- On a real SQLite file and a real PostgreSQL, with reports, events (every supervisor state),
  observations, a revocation and alerts stored, each answer fits its declared schema (JSON Schema,
  against /openapi.json's components) and its model, errors included; and the body is exactly the
  store's dict (the model adds, drops and converts nothing: compared as JSON text, so an int
  turned float would show).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator
from pydantic import BaseModel

from oomguard.manager.app import create_app
from oomguard.manager.bodies import Stored
from oomguard.manager.settings import Settings
from oomguard.manager.store import Store
from oomguard.manager.web import answers
from tests.helpers.manager import (
    AGENT,
    AGENT_H,
    VIEWER,
    VIEWER_H,
    Clock,
    envelope,
    fixture_report,
    local_client,
    make_store,
    migrated_db,
    observation_body,
)

T0 = 1_800_000_000_000
ADMIN = "answers-admin-token"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
HEALTH = ("/livez", "/readyz", "/healthz")
METHODS = ("get", "put", "post", "delete", "patch")
# The operations whose success has no JSON body, and why.
NO_JSON_BODY = {
    ("GET", "/metrics"): "Prometheus text exposition format, not JSON",
    ("DELETE", "/api/v1/nodes/{name}"): "204 No Content",
    ("DELETE", "/api/v1/revoked/{name}"): "204 No Content",
}
# Each 2xx answer's model, by operation.
MODELS: dict[tuple[str, str], type[BaseModel]] = {
    ("POST", "/api/v1/reports"): Stored,
    ("POST", "/api/v1/events"): Stored,
    ("POST", "/api/v1/observations"): Stored,
    ("GET", "/api/v1/profiles"): answers.Profiles,
    ("GET", "/api/v1/profiles/{profile}/recommendation"): answers.Recommendation,
    ("GET", "/api/v1/nodes"): answers.Nodes,
    ("GET", "/api/v1/nodes/{name}"): answers.NodeDetail,
    ("GET", "/api/v1/nodes/{name}/history"): answers.History,
    ("GET", "/api/v1/nodes/{name}/events"): answers.Events,
    ("PUT", "/api/v1/revoked/{name}"): answers.RevokeResult,
    ("GET", "/api/v1/revoked"): answers.RevokedList,
    ("POST", "/api/v1/observations/{node}/{id}/exclude"): answers.Excluded,
    ("POST", "/api/v1/observations/{node}/{id}/include"): answers.Excluded,
    ("GET", "/api/v1/alerts"): answers.Alerts,
    ("GET", "/livez"): answers.Alive,
    ("GET", "/readyz"): answers.Health,
    ("GET", "/healthz"): answers.Health,
}


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "answers_")


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def store(db_url: str, clock: Clock) -> Store:
    return make_store(db_url, clock)


@pytest.fixture
def client(db_url: str, store: Store) -> Iterator[TestClient]:
    settings = Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER, admin_token=ADMIN)
    with local_client(create_app(settings, store)) as c:
        yield c


def operations(schema: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): op
        for path, item in schema["paths"].items()
        for method, op in item.items()
        if method in METHODS
    }


def json_schema(op: dict[str, Any], status: str) -> dict[str, Any]:
    """The JSON schema *op* declares for *status*; {} for none."""
    found: dict[str, Any] = (
        op["responses"].get(status, {}).get("content", {}).get("application/json", {}).get("schema", {})
    )
    return found


def resolved(schema: dict[str, Any], openapi: dict[str, Any]) -> dict[str, Any]:
    """*schema*, or the component its ``$ref`` names."""
    ref = schema.get("$ref")
    if ref is None:
        return schema
    found: dict[str, Any] = openapi["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return found


def test_every_json_answer_is_typed(client: TestClient) -> None:
    openapi = client.get("/openapi.json").json()
    ops = operations(openapi)
    assert set(NO_JSON_BODY) <= set(ops), "an exception that is no operation any more"
    assert set(MODELS) | set(NO_JSON_BODY) == set(ops), "an operation this test does not know of"
    for (method, path), op in ops.items():
        assert path.startswith("/api/v1/") or path in (*HEALTH, "/metrics"), path
        ok = [s for s in op["responses"] if s.startswith("2")]
        assert ok, (method, path)
        typed = [s for s in ok if resolved(json_schema(op, s), openapi).get("properties")]
        if (method, path) in NO_JSON_BODY:
            assert typed == [], (method, path, "typed now: take it off NO_JSON_BODY")
            continue
        assert typed, (method, path, op["responses"])
        ref = json_schema(op, typed[0])["$ref"]
        assert ref.endswith("/" + MODELS[(method, path)].__name__), (method, path, ref)
        for status in op["responses"]:  # every error declared says its body too
            if status[0] in "45":
                assert resolved(json_schema(op, status), openapi).get("properties"), (method, path, status)
    for path in ("/readyz", "/healthz"):  # the 503 of the health checks: the same body
        assert json_schema(ops[("GET", path)], "503") == {"$ref": "#/components/schemas/Health"}


# -- the answers of a real fleet ------------------------------------------------------------------


def post(c: TestClient, path: str, body: dict[str, Any]) -> None:
    r = c.post(path, json=body, headers=AGENT_H)
    assert r.status_code == 200, r.text


def event(c: TestClient, node: str, **fields: Any) -> None:
    post(c, "/api/v1/events", {"node": node, "id": uuid.uuid4().hex, "event": fields})


def report(c: TestClient, node: str, kills: int | None = None, **extra: Any) -> None:
    rep = fixture_report()
    rep["memory"]["oom"] = {"source": "/sys/fs/cgroup/memory.events", "oom": None, "oom_kill": kills}
    rep["memory"]["oom"]["oom_group_kill"] = None
    post(c, "/api/v1/reports", envelope(node, rep, **extra))


def observe(c: TestClient, node: str, **kw: Any) -> str:
    ingest_id = uuid.uuid4().hex
    body = {"node": node, "id": ingest_id, "observation": observation_body(node_class="c1", **kw)}
    post(c, "/api/v1/observations", body)
    return ingest_id


def fleet(c: TestClient, clock: Clock) -> str:
    """Reports, events in every supervisor state, observations, a revocation; an observation's id."""
    report(c, "box-a", 2, labels={"zone": "eu-1"}, interval_s=30, time="2027-01-15T07:59:00Z")
    event(c, "box-a", event="start", pid=7, concurrency=4)
    event(c, "box-a", event="heartbeat", interval_s=20)
    report(c, "box-b", None)
    event(c, "run-1", event="start", pid=8, concurrency=4)  # running, stepped down after a restart
    event(c, "run-1", event="restart", delay_s=5, message="after an OOM kill: concurrency 4 -> 2")
    event(c, "run-1", event="start", pid=9, concurrency=2)
    event(c, "run-2", event="start", pid=10, concurrency=2)  # restarting after an OOM kill
    event(c, "run-2", event="exit", reason="oom-kill", signal=9, concurrency=2, peak_bytes=1 << 30)
    event(c, "run-2", event="restart", delay_s=30, message="restart 1 of 5")
    event(c, "run-3", event="start", pid=11)
    event(c, "run-3", event="give-up", reason="oom-kill", message="5 restarts in 10 min")
    event(c, "run-4", event="gate", step="plan", passed=False, exit_code=3, message="budget below one job")
    event(c, "run-5", event="start", pid=12, newer_field={"kept": True})  # a newer supervisor's field
    event(c, "run-5", event="stop", signal=15)
    ids = [observe(c, "run-1", peak_per_job_bytes=(9 + i % 3) << 30) for i in range(6)]
    assert c.put("/api/v1/revoked/gone", json={"reason": "decommissioned"}, headers=ADMIN_H).status_code == 200
    clock.t += 3 * 20_000 + 1  # box-a's supervisor: 3 heartbeats missed, lost
    report(c, "box-a", 3, labels={"zone": "eu-1"}, interval_s=30)
    return ids[0]


def same(body: Any, raw: Any) -> None:
    """The API's body is the store's dict, as JSON text (an int is no float, no key added or lost)."""
    assert json.dumps(body, sort_keys=True) == json.dumps(raw, sort_keys=True)


def fits(c: TestClient, openapi: dict[str, Any], method: str, template: str, url: str, status: int, **kw: Any) -> Any:
    """The answer to *method* *url* (the operation *template*): of *status*, fitting the schema
    /openapi.json declares for it, and a 2xx its model too. Its JSON."""
    r = c.request(method, url, **kw)
    assert r.status_code == status, (url, r.text)
    body = r.json()
    schema = json_schema(operations(openapi)[(method, template)], str(status))
    assert schema, (method, template, status)
    Draft202012Validator({**schema, "components": openapi["components"]}).validate(body)
    if status < 300:
        MODELS[(method, template)].model_validate(body)
    return body


def test_every_answer_fits_its_schema_and_is_the_store_s(client: TestClient, store: Store, clock: Clock) -> None:
    observation = fleet(client, clock)
    openapi = client.get("/openapi.json").json()
    check = functools.partial(fits, client, openapi)
    v, adm = {"headers": VIEWER_H}, {"headers": ADMIN_H}

    listed = check("GET", "/api/v1/nodes", "/api/v1/nodes", 200, **v)
    assert listed["total"] == 7
    same(listed, store.list_nodes(sort="risk"))
    same(
        check("GET", "/api/v1/nodes", "/api/v1/nodes?label=zone=eu-1&limit=1", 200, **v),
        store.list_nodes(label=("zone", "eu-1"), limit=1, sort="risk"),
    )
    states = {}
    for name in ("box-a", "box-b", "run-1", "run-2", "run-3", "run-4", "run-5"):
        detail = check("GET", "/api/v1/nodes/{name}", f"/api/v1/nodes/{name}", 200, **v)
        same(detail, store.node_detail(name))
        states[name] = detail["supervisor"] and detail["supervisor"]["state"]
        events = check("GET", "/api/v1/nodes/{name}/events", f"/api/v1/nodes/{name}/events", 200, **v)
        same(events, store.node_events(name))
        history = check("GET", "/api/v1/nodes/{name}/history", f"/api/v1/nodes/{name}/history?limit=1", 200, **v)
        same(history, store.node_history(name, limit=1))
    assert states == {
        "box-a": "lost",
        "box-b": None,
        "run-1": "running",
        "run-2": "restarting",
        "run-3": "gave-up",
        "run-4": "refused",
        "run-5": "stopped",
    }
    first = client.get("/api/v1/nodes/box-a", headers=VIEWER_H).json()
    assert first["refused"] is None and first["labels"] == {"zone": "eu-1"} and first["latest"]["memory"]
    assert {"stepped_down", "why"} <= set(client.get("/api/v1/nodes/run-1", headers=VIEWER_H).json()["supervisor"])
    assert client.get("/api/v1/nodes/run-4", headers=VIEWER_H).json()["refused"]["step"] == "plan"
    page = client.get("/api/v1/nodes/box-a/history?limit=1", headers=VIEWER_H).json()
    assert page["next"] is not None and page["history"][0]["agent_time"] is None
    older = check("GET", "/api/v1/nodes/{name}/history", f"/api/v1/nodes/box-a/history?before={page['next']}", 200, **v)
    assert older["history"][0]["agent_time"] == "2027-01-15T07:59:00.000Z"

    alerts = check("GET", "/api/v1/alerts", "/api/v1/alerts", 200, **v)
    assert {"kernel-oom-kills", "supervisor-lost", "refused"} <= {a["kind"] for a in alerts["alerts"]}
    same(alerts, {"alerts": store.alerts()})
    same(check("GET", "/api/v1/profiles", "/api/v1/profiles", 200, **v), {"profiles": store.profiles_index()})
    template = "/api/v1/profiles/{profile}/recommendation"
    for query, args in (
        ("node_class=c1", (None, "c1", None)),
        ("node=run-1&budget_bytes=200000000000", ("run-1", None, 200 * 10**9)),
    ):
        answer = check("GET", template, f"/api/v1/profiles/cuzk-porep/recommendation?{query}", 200, **v)
        same(answer, store.recommendation("cuzk-porep", *args))
    same(check("GET", "/api/v1/revoked", "/api/v1/revoked", 200, **v), {"revoked": store.revoked_nodes()})
    revoked = check("PUT", "/api/v1/revoked/{name}", "/api/v1/revoked/gone", 200, json={}, **adm)
    assert revoked == {"node": "gone", "revoked": False}
    for action in ("exclude", "include"):
        template = f"/api/v1/observations/{{node}}/{{id}}/{action}"
        flipped = check("POST", template, f"/api/v1/observations/run-1/{observation}/{action}", 200, **adm)
        assert flipped == {"node": "run-1", "id": observation, "excluded": action == "exclude"}
    assert check("GET", "/livez", "/livez", 200) == {"status": "alive"}
    for path in ("/readyz", "/healthz"):
        assert check("GET", path, path, 200) == {"status": "ok", "database": "ok", "failing": {}}


def test_the_errors_and_the_503_fit_their_schemas(client: TestClient) -> None:
    report(client, "box-a")
    openapi = client.get("/openapi.json").json()
    check = functools.partial(fits, client, openapi)
    v = {"headers": VIEWER_H}
    check("GET", "/api/v1/nodes", "/api/v1/nodes", 401)
    check("GET", "/api/v1/nodes/{name}", "/api/v1/nodes/nope", 404, **v)
    check("GET", "/api/v1/nodes/{name}/history", "/api/v1/nodes/nope/history", 404, **v)
    invalid = check("GET", "/api/v1/nodes", "/api/v1/nodes?limit=0", 422, **v)
    assert isinstance(invalid["detail"], list)  # where and why
    said = check("GET", "/api/v1/nodes/{name}/history", "/api/v1/nodes/box-a/history?before=9-x", 422, **v)
    assert isinstance(said["detail"], str)  # the route's own one line
    check("POST", "/api/v1/observations/{node}/{id}/exclude", "/api/v1/observations/box-a/x/exclude", 403, **v)
    check(
        "POST", "/api/v1/observations/{node}/{id}/exclude", "/api/v1/observations/box-a/x/exclude", 404, headers=ADMIN_H
    )
    check("DELETE", "/api/v1/revoked/{name}", "/api/v1/revoked/box-a", 404, headers=ADMIN_H)
    check("POST", "/api/v1/reports", "/api/v1/reports", 422, content=b"{NaN", headers=AGENT_H)
    client.app.state.health.failure("writes", RuntimeError("the disk is full"))  # type: ignore[attr-defined]
    for path in ("/readyz", "/healthz"):
        body = check("GET", path, path, 503)
        assert body["status"] == "unavailable" and body["failing"] == {"writes": "other"}
        answers.Health.model_validate(body)
