"""Sizes and numbers as JSON says them (issue 37, item 6): every number of every envelope (reports,
events, observations) and every size inside a report is refused as the string ``"1"`` or the
boolean ``true`` (422, naming the place), where pydantic's lax mode would read both as 1. Through
the real API, in process, on a real SQLite file."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from oomguard.manager.app import create_app
from oomguard.manager.bodies import EventIn, ObservationIn, ReportEnvelope
from oomguard.manager.db import migrate
from oomguard.manager.settings import Settings
from tests.helpers.manager import AGENT, AGENT_H, VIEWER, envelope, fixture_report, json_paths, observation_body

WRONG = ["1", True]


def numeric_fields(model: Any) -> set[str]:
    """The fields of *model* that hold a number (int or float, optional or not)."""
    found = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
        kinds = typing.get_args(annotation) if union else (annotation,)
        bare = [typing.get_args(k)[0] if typing.get_origin(k) is typing.Annotated else k for k in kinds]
        if any(k in (int, float) for k in bare):
            found.add(name)
    return found


EVENT_NUMBERS = sorted(numeric_fields(EventIn))
OBSERVATION_NUMBERS = sorted(numeric_fields(ObservationIn))
REPORT_SIZES = sorted(
    {
        path
        for path in json_paths(fixture_report())
        if isinstance(path[-1], str) and path[-1].endswith(("_bytes", "_ratio")) and len(path) <= 4
    },
    key=str,
)


def test_the_lists_cover_every_number() -> None:
    assert {"budget_bytes", "peak_bytes", "effective_bytes", "pid", "duration_s", "interval_s"} <= set(EVENT_NUMBERS)
    assert set(OBSERVATION_NUMBERS) == {
        "declared_per_job_bytes",
        "peak_per_job_bytes",
        "declared_baseline_bytes",
        "peak_baseline_bytes",
        "concurrency",
    }
    assert numeric_fields(ReportEnvelope) == {"interval_s"}
    assert ("memory", "effective_bytes") in REPORT_SIZES and len(REPORT_SIZES) >= 8


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path_factory.mktemp('strict') / 's.db'}"
    migrate(url)
    app = create_app(Settings(db_url=url, agent_token=AGENT, viewer_token=VIEWER, max_events_per_node=10**6))
    with TestClient(app, base_url="http://localhost") as c:
        yield c


def refused(c: TestClient, path: str, body: dict[str, Any], field: str) -> None:
    r = c.post(path, json=body, headers=AGENT_H)
    assert r.status_code == 422, (field, r.status_code, r.text)
    assert field in r.text, r.text  # the place is named


@pytest.mark.parametrize("value", WRONG, ids=["string", "bool"])
@pytest.mark.parametrize("field", EVENT_NUMBERS)
def test_every_number_of_an_event_is_strict(client: TestClient, field: str, value: Any) -> None:
    event = {"event": "start", field: value}
    refused(client, "/api/v1/events", {"node": "n", "id": f"e-{field}", "event": event}, field)


@pytest.mark.parametrize("value", WRONG, ids=["string", "bool"])
@pytest.mark.parametrize("field", OBSERVATION_NUMBERS)
def test_every_number_of_an_observation_is_strict(client: TestClient, field: str, value: Any) -> None:
    body = {"node": "n", "id": f"o-{field}", "observation": observation_body(**{field: value})}
    refused(client, "/api/v1/observations", body, field)


@pytest.mark.parametrize("value", WRONG, ids=["string", "bool"])
def test_a_reports_interval_is_strict(client: TestClient, value: Any) -> None:
    refused(client, "/api/v1/reports", envelope("n", fixture_report(), interval_s=value), "interval_s")


@pytest.mark.parametrize("value", WRONG, ids=["string", "bool"])
@pytest.mark.parametrize("path", REPORT_SIZES, ids=lambda p: ".".join(map(str, p)))
def test_every_size_in_a_report_is_strict(client: TestClient, path: tuple[Any, ...], value: Any) -> None:
    report = fixture_report()
    where = report
    for part in path[:-1]:
        where = where[part]
    where[path[-1]] = value
    refused(client, "/api/v1/reports", envelope("n", report), str(path[-1]))


def test_the_right_types_still_pass(client: TestClient) -> None:
    report = client.post("/api/v1/reports", json=envelope("n", fixture_report(), interval_s=30), headers=AGENT_H)
    assert report.status_code == 200, report.text
    event = {"event": "exit", "reason": "exit", "duration_s": 12, "peak_bytes": 1, "exit_code": 1}
    r = client.post("/api/v1/events", json={"node": "n", "id": "ok-1", "event": event}, headers=AGENT_H)
    assert r.status_code == 200, r.text
    body = {"node": "n", "id": "ok-2", "observation": observation_body()}
    assert client.post("/api/v1/observations", json=body, headers=AGENT_H).status_code == 200


def test_no_wrong_value_was_stored(client: TestClient, tmp_path: Path) -> None:
    nodes = client.get("/api/v1/nodes", headers={"Authorization": f"Bearer {VIEWER}"}).json()["nodes"]
    assert [n["name"] for n in nodes] == ["n"]
    page = client.get("/api/v1/nodes/n/events", headers={"Authorization": f"Bearer {VIEWER}"}).json()
    assert page["total"] == 1  # the one right event only
