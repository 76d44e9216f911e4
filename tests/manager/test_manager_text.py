"""Text the database and the pages can always hold (issue 22, items 2 and 7), on a real SQLite file
and a real PostgreSQL server:

- a lone surrogate escape (``"\\ud800"``, which JSON allows and an agent sends for a path byte that
  is not UTF-8) anywhere a report, event, heartbeat, gate report or label may carry text is stored
  (as the JSON escape) or refused with a 422, and every page and API route reads it back without
  a 5xx: the surrogate shows as its escape (``store.text``);
- a NUL character, which PostgreSQL text cannot hold, is a one-line 422 that echoes no input;
- rows an older manager wrote with such text (inserted here straight into the tables) read back;
- a 422 names the place by the manager's own field names, any other key by its position.
"""

from __future__ import annotations

import copy
import json
import math
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert, select

from oomguard.manager.app import create_app
from oomguard.manager.bodies import INT_LIMIT
from oomguard.manager.db import events, latest_reports, make_engine, migrate, nodes
from oomguard.manager.settings import Settings
from tests.helpers.fuzz import examples
from tests.helpers.manager import AGENT, AGENT_H, VIEWER, VIEWER_H, db_url_of, fixture_report, json_paths, local_client

GPU = {
    "index": 0,
    "uuid": "GPU-0",
    "name": "H200",
    "memory_total_bytes": 141 << 30,
    "memory_used_bytes": 0,
    "memory_free_bytes": 141 << 30,
    "memory_reserved_bytes": None,
    "pci_bus_id": "0000:01:00.0",
    "mig_mode": None,
    "mig_devices": None,
    "parent_uuid": None,
}
BASE = {**fixture_report(), "gpus": [GPU]}
HEADERS = {**AGENT_H, "Content-Type": "application/json"}
LONE = ["\ud800", "\udbff", "\udc00", "\udfff", "\udcff", "a\ud800b", "\ud83d", "\ude00x"]


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


STRING_PATHS = [p for p in json_paths(BASE) if isinstance(_at(BASE, p), str)]
DICT_PATHS = [(), *(p for p in json_paths(BASE) if isinstance(_at(BASE, p), dict))]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    url = db_url_of(request.param, tmp_path_factory.mktemp("text"), "text_")
    migrate(url)
    return url


@pytest.fixture(scope="module")
def client(db_url: str) -> Iterator[TestClient]:
    settings = Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER, login_burst=10**9)
    with local_client(create_app(settings)) as c:
        yield c


def post(c: TestClient, what: str, body: dict[str, Any]) -> Any:
    """POST *body* as JSON text with ``\\uXXXX`` escapes (how a lone surrogate travels: UTF-8 cannot)."""
    return c.post(f"/api/v1/{what}", content=json.dumps(body, ensure_ascii=True), headers=HEADERS)


def routes(node: str) -> list[str]:
    return [
        "/",
        f"/nodes/{node}",
        f"/nodes/{node}?events=0",
        "/api/v1/nodes",
        f"/api/v1/nodes?q={node}",
        f"/api/v1/nodes/{node}",
        f"/api/v1/nodes/{node}/events",
        f"/api/v1/nodes/{node}/history",
        "/api/v1/alerts",
        "/metrics",
    ]


def read_all(c: TestClient, node: str) -> dict[str, Any]:
    """Every page and API route about *node*: none a 5xx; the node's API detail (None: 404)."""
    detail = None
    for path in routes(node):
        r = c.get(path, headers=VIEWER_H)
        assert r.status_code < 500, (path, r.status_code, r.text[:300])
        assert r.status_code in (200, 404), (path, r.status_code, r.text[:300])
        if path == f"/api/v1/nodes/{node}" and r.status_code == 200:
            detail = r.json()
    return {"detail": detail}


def one_line_422(r: Any, *secrets: str) -> str:
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    text = detail if isinstance(detail, str) else json.dumps(detail)
    assert "\n" not in text and all(s not in r.text for s in secrets), r.text
    return text


# -- lone surrogates: stored escaped, read back --------------------------------------------------


def test_a_lone_surrogate_in_a_report_is_stored_and_every_route_reads_it_back(client: TestClient) -> None:
    node = f"sur-{uuid.uuid4().hex[:8]}"
    report = copy.deepcopy(BASE)
    report["memory"]["from_a_newer_agent"] = "path/\udcff/x"  # an unknown field (a newer agent's)
    report["gpus"][0]["name"] = "H200 \ud800"  # a string of the schema's, kept in a column too
    report["warnings"][0]["message"] = "a \udfff b"
    report["\ud800 key"] = {"\udc00": ["\ud83d"]}
    r = post(client, "reports", {"node": node, "id": uuid.uuid4().hex, "report": report})
    assert r.status_code == 200, r.text
    detail = read_all(client, node)["detail"]
    assert detail is not None
    latest = detail["latest"]
    assert latest["memory"]["from_a_newer_agent"] == "path/\\udcff/x"  # the surrogate as its escape
    assert latest["gpus"][0]["name"] == "H200 \\ud800" and detail["gpus"][0]["name"] == "H200 \\ud800"
    assert latest["warnings"][0]["message"] == "a \\udfff b"
    assert latest["\\ud800 key"] == {"\\udc00": ["\\ud83d"]}
    pair = copy.deepcopy(BASE)
    pair["memory"]["from_a_newer_agent"] = "\U0001f600"  # a proper pair is one character: kept as it is
    assert post(client, "reports", {"node": node, "id": uuid.uuid4().hex, "report": pair}).status_code == 200
    assert (
        client.get(f"/api/v1/nodes/{node}", headers=VIEWER_H).json()["latest"]["memory"]["from_a_newer_agent"]
        == "\U0001f600"
    )


def test_a_lone_surrogate_in_an_event_or_label_is_refused_or_read_back(client: TestClient) -> None:
    node = f"ev-{uuid.uuid4().hex[:8]}"
    bodies = [
        {"event": "exit", "reason": "oom-kill", "exit_code": 137, "message": "killed \ud800", "extra": "\udfff"},
        {"event": "exit", "reason": "oom-kill", "from_a_newer_supervisor": {"\ud800": "\udc00"}},
        {"event": "heartbeat", "interval_s": 60, "note": "\ud800"},
        {"event": "gate", "step": "check", "passed": False, "exit_code": 3, "message": "gate \ud800"},
        {"event": "give-up", "message": "\udcff"},
    ]
    answers = []
    for event in bodies:
        r = post(client, "events", {"node": node, "id": uuid.uuid4().hex, "event": event})
        assert r.status_code in (200, 422), r.text
        if r.status_code == 422:
            one_line_422(r, "\\ud800", "\\udfff", "\\udcff", "killed", "gate ")
        answers.append(r.status_code)
    labelled = {"node": node, "id": uuid.uuid4().hex, "report": BASE, "labels": {"team": "ml \ud800"}}
    r = post(client, "reports", labelled)
    assert r.status_code == 422, r.text  # a label value must be printable text (oomguard.labels)
    assert post(client, "reports", {"node": node, "id": uuid.uuid4().hex, "report": BASE}).status_code == 200
    assert read_all(client, node)["detail"] is not None, answers


# -- NUL: a one-line 422, no echo ------------------------------------------------------------------


@pytest.mark.parametrize(
    "where",
    [("memory", "from_a_newer_agent"), ("gpus", 0, "name"), ("warnings", 0, "message"), ("secret-key-name",)],
)
def test_a_nul_anywhere_is_a_one_line_422_that_echoes_nothing(client: TestClient, where: tuple[Any, ...]) -> None:
    report = copy.deepcopy(BASE)
    target: Any = report
    for step in where[:-1]:
        target = target[step]
    target[where[-1]] = "private-value\x00"
    r = post(client, "reports", {"node": "nul", "id": uuid.uuid4().hex, "report": report})
    text = one_line_422(r, "private-value", "secret-key-name")
    assert "NUL" in text, text
    r = post(client, "events", {"node": "nul", "id": uuid.uuid4().hex, "event": {"event": "stop", "secret-key\x00": 1}})
    one_line_422(r, "secret-key")


def test_a_422_names_the_managers_fields_and_gives_other_keys_by_position(client: TestClient) -> None:
    report = copy.deepcopy(BASE)
    report["memory"] = {"a-private-key": 1, "other-private": {"x": "\x00"}, **report["memory"]}
    r = post(client, "reports", {"node": "pos", "id": uuid.uuid4().hex, "report": report})
    assert (
        one_line_422(r, "a-private-key", "other-private")
        == "$.report.memory.<field 2>.<field 1>: a string contains a NUL character"
    )
    report = copy.deepcopy(BASE)
    report["memory"]["effective_bytes"] = 2**64  # a field of schema.json's: named
    r = post(client, "reports", {"node": "pos", "id": uuid.uuid4().hex, "report": report})
    assert "$.report.memory.effective_bytes" in one_line_422(r), r.text


# -- rows an older manager wrote -------------------------------------------------------------------


def test_rows_an_older_manager_wrote_with_lone_surrogates_read_back(db_url: str, client: TestClient) -> None:
    node = f"old-{uuid.uuid4().hex[:8]}"
    report = copy.deepcopy(BASE)
    report["memory"]["from_an_agent"] = "\ud800"
    report["\udfff"] = "x"
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            now = int(time.time() * 1000)
            conn.execute(
                insert(nodes).values(
                    name=node,
                    first_seen_ms=now,
                    last_seen_ms=now,
                    warnings=json.dumps(["\ud800"]),  # escapes: ASCII, as json.dumps writes them
                    gpus=json.dumps([{"index": 0, "name": "\udcff", "memory_total_bytes": 1, "memory_free_bytes": 1}]),
                    labels=json.dumps({"team": "\ud800"}),
                )
            )
            node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == node)).scalar_one()
            conn.execute(insert(latest_reports).values(node_id=node_id, received_ms=now, report=json.dumps(report)))
            old_events: list[dict[str, Any]] = [
                {"event": "exit", "reason": "oom-kill", "exit_code": 137, "message": "\ud800", "\udc00": 1},
                {"event": "give-up", "reason": "oom-kill", "message": "gave up \udfff"},
            ]
            for k, body in enumerate(old_events):
                conn.execute(
                    insert(events).values(
                        node_id=node_id,
                        ingest_id=f"{node}-{k}",
                        received_ms=now + k,
                        kind=body["event"],
                        reason=body["reason"],
                        exit_code=137 if k == 0 else None,
                        body=json.dumps(body),
                    )
                )
    finally:
        engine.dispose()
    detail = read_all(client, node)["detail"]
    assert detail is not None
    assert detail["latest"]["memory"]["from_an_agent"] == "\\ud800" and detail["latest"]["\\udfff"] == "x"
    assert detail["warnings"] == ["\\ud800"] and detail["gpus"][0]["name"] == "\\udcff"
    assert detail["labels"] == {"team": "\\ud800"}
    messages = {e.get("message") for e in detail["events"]}
    assert messages == {"\\ud800", "gave up \\udfff"}, detail["events"]
    assert "\\ud800" in client.get("/metrics", headers=VIEWER_H).text  # the label, as its escape


# -- the property: any text anywhere, every route answers ----------------------------------------

CHARS = st.characters(exclude_categories=())  # every code point: surrogates, NUL, controls included
TEXT = st.text(CHARS, max_size=12) | st.sampled_from([*LONE, "\x00", "\ufffe", "\uffff", "\U0010ffff"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=8,
)
KINDS = st.sampled_from(["start", "exit", "restart", "give-up", "stop", "heartbeat", "gate"])


def _has(value: Any, leaf: Any) -> bool:
    """Whether *leaf* holds for any key or leaf value in *value*."""
    if isinstance(value, list):
        return any(_has(v, leaf) for v in value)
    if isinstance(value, dict):
        return any(_has(k, leaf) or _has(v, leaf) for k, v in value.items())
    return bool(leaf(value))


def _has_nul(value: Any) -> bool:
    return _has(value, lambda v: isinstance(v, str) and "\x00" in v)


def _has_infinity(value: Any) -> bool:  # JSON's floats() may draw one: refused as not JSON first
    return _has(value, lambda v: isinstance(v, float) and math.isinf(v))


def _has_huge(value: Any) -> bool:  # an integer no column holds: refused for that, maybe before a NUL
    return _has(value, lambda v: isinstance(v, int) and not isinstance(v, bool) and not -INT_LIMIT <= v <= INT_LIMIT)


@st.composite
def writes(draw: st.DrawFn) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    node = f"p-{uuid.uuid4().hex[:10]}"
    report = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(0, 3))):  # a string of the schema's
        path = draw(st.sampled_from(STRING_PATHS))
        _at(report, path[:-1])[path[-1]] = draw(TEXT)
    for _ in range(draw(st.integers(0, 2))):  # an unknown field anywhere (a newer agent's)
        _at(report, draw(st.sampled_from(DICT_PATHS)))[draw(TEXT)] = draw(JSON)
    envelope: dict[str, Any] = {"node": node, "id": uuid.uuid4().hex, "report": report}
    if draw(st.booleans()):
        envelope["labels"] = draw(
            st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), TEXT, max_size=2)
        )
    if draw(st.booleans()):
        envelope["time"] = draw(TEXT)
    out = [("reports", envelope)]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(KINDS)
        event: dict[str, Any] = {"event": kind, "message": draw(TEXT)}
        if kind == "gate":
            event |= {"step": draw(st.sampled_from(["check", "plan", "verify"])), "passed": draw(st.booleans())}
        if kind in ("exit", "give-up"):
            event["reason"] = "oom-kill"
        if draw(st.booleans()):
            event["time"] = draw(TEXT)
        event |= draw(st.dictionaries(TEXT, JSON, max_size=2))  # fields of a newer supervisor
        event["event"] = kind
        out.append(("events", {"node": node, "id": uuid.uuid4().hex, "event": event}))
    return node, out


@given(case=writes())
@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck), database=None)
@pytest.mark.slow
def test_any_text_anywhere_never_gets_a_5xx_on_any_route(client: TestClient, case: Any) -> None:
    node, bodies = case
    for what, body in bodies:
        r = post(client, what, body)
        assert r.status_code in (200, 422), (what, r.status_code, r.text[:300])
        if _has_nul(body):  # PostgreSQL text cannot hold one
            assert r.status_code == 422 and ("NUL" in r.text or _has_infinity(body) or _has_huge(body)), r.text
        if r.status_code == 422:
            one_line_422(r)
        else:
            assert r.json()["stored"] is True
    read_all(client, node)


def test_a_refused_label_is_given_by_its_position_not_its_name(client: TestClient) -> None:
    for labels in (
        {"zone": "eu-1", "secret_label_name": "bell\x07"},  # a value that cannot be printed
        {f"secret_label_{k}": "v" for k in range(17)},  # one too many
    ):
        r = post(client, "reports", {"node": "lab", "id": uuid.uuid4().hex, "report": BASE, "labels": labels})
        text = one_line_422(r, "secret_label", "bell")
        assert "label 2 of 2 breaks the rule" in text or "at most 16" in text, text


def test_a_validation_errors_place_keeps_the_managers_names_only() -> None:
    from oomguard.manager.bodies import known, safe_loc

    assert {"memory", "effective_bytes", "gpus", "node", "labels", "event", "message"} <= known()
    assert safe_loc(("body", "labels", "a_secret_label")) == ["body", "labels", "<field>"]
    assert safe_loc(("body", "an_unknown_envelope_field")) == ["body", "<field>"]
    assert safe_loc(("body", "event", "message")) == ["body", "event", "message"]
    assert safe_loc(("body", "report", "gpus", 3, "name")) == ["body", "report", "gpus", 3, "name"]
    assert safe_loc(("query", "status")) == ["query", "status"]  # a parameter the route declares
