"""An observation held to its node's own latest report (issue 36, item 2), and every 422 of an
observation or of a recommendation's query naming its field (item 5): through the real API, on a
real SQLite file and a real PostgreSQL."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from oomguard.manager.app import create_app
from oomguard.manager.bodies import JOB_MIN_BYTES
from oomguard.manager.settings import Settings
from oomguard.manager.store import Store
from oomguard.units import format_size_precise
from tests.helpers.manager import (
    AGENT_H,
    VIEWER,
    VIEWER_H,
    Clock,
    fixture_report,
    ingest,
    local_client,
    make_store,
    migrated_db,
    observation_body,
)

NOW = 1_800_000_000_000
GiB = 1 << 30
EiB = 1 << 60
LIMIT = fixture_report()["memory"]["effective_bytes"]  # the fixture's container: 342 GiB
URL = "/api/v1/observations"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "obs_check_")


observation = observation_body  # tests/helpers/manager.py


def observe(c: Any, node: str, **kw: Any) -> Any:
    return c.post(URL, json={"node": node, "id": uuid.uuid4().hex, "observation": observation(**kw)}, headers=AGENT_H)


def client(db_url: str) -> tuple[Any, Store]:
    store = make_store(db_url, Clock(NOW))
    settings = Settings(db_url=db_url, agent_token="agent-secret-token", viewer_token=VIEWER)
    return local_client(create_app(settings, store)), store


def samples(c: Any) -> int:
    """The profile's observations stored (``GET /api/v1/profiles``)."""
    r = c.get("/api/v1/profiles", headers=VIEWER_H)
    assert r.status_code == 200, r.text
    return sum(int(p["samples"]) for p in r.json()["profiles"] if p["profile"] == "cuzk-porep")


def refusal(r: Any) -> str:
    """The one line of a 422 from the check against the report."""
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail, detail
    return detail


def limit_words(limit: int = LIMIT) -> str:
    return f"the effective limit of the node's latest report, {format_size_precise(limit)}"


def test_a_run_that_cannot_fit_its_node_s_latest_report_is_a_422_naming_the_field(db_url: str) -> None:
    c, store = client(db_url)
    with c:
        ingest(store, "r1")
        detail = refusal(observe(c, "r1", peak_per_job_bytes=EiB))  # 1 EiB a job on a 342 GiB container
        assert detail == f"observation.peak_per_job_bytes: above {limit_words()}"
        for field in ("declared_per_job_bytes", "declared_baseline_bytes", "peak_baseline_bytes"):
            detail = refusal(observe(c, "r1", **{field: LIMIT + 1}))
            assert detail == f"observation.{field}: above {limit_words()}", field
        most = LIMIT // JOB_MIN_BYTES  # 350,208 jobs of 1 MiB
        detail = refusal(observe(c, "r1", concurrency=1_000_000))
        assert detail == f"observation.concurrency: above {most} jobs of 1 MiB, all that fit {limit_words()}"
        assert refusal(observe(c, "r1", concurrency=most + 1, declared_per_job_bytes=1, declared_baseline_bytes=0))
        over = (LIMIT - 40 * GiB) // (14 * GiB) + 1  # one job more than 14 GiB jobs beside 40 GiB fit
        detail = refusal(observe(c, "r1", concurrency=over))
        assert detail.startswith("observation.concurrency: its jobs at declared_per_job_bytes each")
        assert detail.endswith(limit_words())
        assert samples(c) == 0  # none of them stored
        assert observe(c, "r1").json()["stored"] is True  # a valid one: 200
        fits = {"peak_per_job_bytes": LIMIT, "declared_per_job_bytes": (LIMIT - 40 * GiB) // 2, "concurrency": 2}
        assert observe(c, "r1", **fits).status_code == 200  # at the limit exactly: fits
        assert samples(c) == 2


def test_a_node_without_a_report_is_not_checked(db_url: str) -> None:
    """A run-only node (its supervisor's events, no agent's report) has no report to check against:
    accepted, as the docs say; a start event's limit is not a report's."""
    c, _ = client(db_url)
    with c:
        assert observe(c, "never-reported", peak_per_job_bytes=EiB, concurrency=1_000_000).status_code == 200
        start = {"event": "start", "effective_bytes": GiB, "budget_bytes": GiB, "concurrency": 1}
        r = c.post("/api/v1/events", json={"node": "run-only", "id": uuid.uuid4().hex, "event": start}, headers=AGENT_H)
        assert r.status_code == 200, r.text
        assert observe(c, "run-only", peak_per_job_bytes=100 * GiB).status_code == 200
        assert samples(c) == 2


def test_the_latest_report_is_the_one_checked_and_a_report_without_a_limit_checks_nothing(db_url: str) -> None:
    c, store = client(db_url)
    with c:
        ingest(store, "r2")
        assert observe(c, "r2", peak_per_job_bytes=100 * GiB).status_code == 200
        small = fixture_report()
        small["memory"]["effective_bytes"] = 64 * GiB
        ingest(store, "r2", report=small)
        detail = refusal(observe(c, "r2", peak_per_job_bytes=100 * GiB))
        assert detail == f"observation.peak_per_job_bytes: above {limit_words(64 * GiB)}"
        assert refusal(observe(c, "r2")).startswith("observation.concurrency: its jobs")  # 4 x 14 + 40 GiB > 64
        unknown = fixture_report()
        unknown["memory"]["effective_bytes"] = None  # the probe found no limit: nothing to check against
        ingest(store, "r2", report=unknown)
        assert observe(c, "r2", peak_per_job_bytes=100 * GiB).status_code == 200


def test_another_node_s_token_is_403_before_any_check(db_url: str) -> None:
    from oomguard.manager.web.credentials import node_token

    secret = "fleet-secret-for-the-observation-checks"
    store = make_store(db_url, Clock(NOW))
    settings = Settings(db_url=db_url, viewer_token=VIEWER, fleet_secrets=(secret,))
    with local_client(create_app(settings, store)) as c:
        ingest(store, "mine")
        body = {"node": "mine", "id": "x1", "observation": observation(peak_per_job_bytes=EiB)}
        other = {"Authorization": f"Bearer {node_token(secret, 'other')}"}
        assert c.post(URL, json=body, headers=other).status_code == 403
        own = {"Authorization": f"Bearer {node_token(secret, 'mine')}"}
        assert refusal(c.post(URL, json=body, headers=own)).startswith("observation.peak_per_job_bytes:")


# -- every 422 names its field ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"peak_per_job_bytes": "1"}, "peak_per_job_bytes"),  # a size is a JSON integer, not a string
        ({"declared_per_job_bytes": True}, "declared_per_job_bytes"),  # nor a boolean
        ({"declared_baseline_bytes": 1.0}, "declared_baseline_bytes"),  # nor a number with a fraction part
        ({"peak_baseline_bytes": "1"}, "peak_baseline_bytes"),
        ({"concurrency": True}, "concurrency"),
        ({"concurrency": 0}, "concurrency"),
        ({"declared_per_job_bytes": 0}, "declared_per_job_bytes"),
        ({"peak_per_job_bytes": -1}, "peak_per_job_bytes"),
        ({"outcome": "died"}, "outcome"),
        ({"profile": "../etc"}, "profile"),
        ({"node_class": "has space"}, "node_class"),
        ({"time": "yesterday"}, "time"),
    ],
)
def test_a_bad_observation_s_422_names_its_field(db_url: str, change: dict[str, Any], field: str) -> None:
    c, _ = client(db_url)
    with c:
        r = observe(c, "n1", **change)
        assert r.status_code == 422, r.text
        (error,) = r.json()["detail"]
        assert error["loc"] == ["body", "observation", field], r.text
        value = change[field]
        assert not isinstance(value, str) or len(value) < 2 or value not in r.text  # no input echoed


def test_a_missing_field_an_integer_out_of_range_and_an_unknown_field(db_url: str) -> None:
    c, _ = client(db_url)
    with c:
        body = {"node": "n1", "id": "x1", "observation": {k: v for k, v in observation().items() if k != "outcome"}}
        r = c.post(URL, json=body, headers=AGENT_H)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "observation", "outcome"], r.text
        r = c.post(URL, json={"node": "n1", "id": "x1"}, headers=AGENT_H)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "observation"], r.text
        r = observe(c, "n1", peak_per_job_bytes=2**63)  # the strict-JSON check, before the envelope
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == "$.observation.peak_per_job_bytes: an integer outside the signed 64-bit range"
        r = observe(c, "n1", a_private_key=1)  # a key of the client's own: not echoed
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "observation", "<field>"], r.text
        assert "a_private_key" not in r.text


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"node": "a b"}, "node"),
        ({"node": "x" * 129}, "node"),
        ({"node_class": "has space"}, "node_class"),
        ({"budget_bytes": "0"}, "budget_bytes"),
        ({"budget_bytes": str(2**63)}, "budget_bytes"),
        ({"budget_bytes": "true"}, "budget_bytes"),  # a size is a whole number of bytes:
        ({"budget_bytes": "1.0"}, "budget_bytes"),  # pydantic would read these as 1
        ({"budget_bytes": "+1"}, "budget_bytes"),
        ({"budget_bytes": "1_000"}, "budget_bytes"),
        ({"budget_bytes": "10GiB"}, "budget_bytes"),
    ],
)
def test_a_bad_recommendation_query_s_422_names_its_parameter(db_url: str, query: dict[str, str], field: str) -> None:
    c, _ = client(db_url)
    with c:
        r = c.get("/api/v1/profiles/cuzk-porep/recommendation", params=query, headers=VIEWER_H)
        assert r.status_code == 422, r.text
        (error,) = r.json()["detail"]
        assert error["loc"] == ["query", field], r.text
        ok = c.get("/api/v1/profiles/cuzk-porep/recommendation", params={"budget_bytes": "1"}, headers=VIEWER_H)
        assert ok.status_code == 200 and ok.json()["budget_bytes"] == 1
