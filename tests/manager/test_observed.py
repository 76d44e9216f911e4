"""What the manager says of itself (issue 39, item 5; ``web.observed``), on a real SQLite file:
twelve bad tokens are counted by role and logged once (the client, the node a node-shaped token
claims, never the token); requests counted and timed by route template and status; the process's
numbers and the build on /metrics."""

from __future__ import annotations

import logging
import platform
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from oomguard._version import __version__
from oomguard.manager.app import create_app
from oomguard.manager.settings import Settings
from tests.helpers.manager import (
    AGENT,
    VIEWER,
    VIEWER_H,
    Clock,
    envelope,
    fixture_report,
    local_client,
    make_store,
    migrated_db,
)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_failed_tokens_requests_process_and_build(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = migrated_db("sqlite", tmp_path, "obs_")
    settings = Settings(db_url=url, agent_token=AGENT, viewer_token=VIEWER, fleet_secrets=("fleet-secret-observed-01",))
    with (
        caplog.at_level(logging.WARNING, logger="oomguard.manager.auth"),
        local_client(create_app(settings, make_store(url, Clock(1_800_000_000_000)))) as c,
    ):
        forged = "ogn1.gpu-3." + "A" * 43  # node-shaped, signed by no fleet secret
        for i in range(12):
            token = forged if i % 2 else f"wrong-token-{i}"
            r = c.post(
                "/api/v1/reports",
                json=envelope("gpu-3", fixture_report()),
                headers={"Authorization": f"Bearer {token}"},
            )
            assert r.status_code in (401, 429), r.status_code
        assert c.get("/api/v1/nodes", headers={"Authorization": "Bearer nope"}).status_code in (401, 429)
        for made_up in ("BREW", "WHEN"):  # a client's own methods and paths: no labels of their own
            c.request(made_up, f"/nowhere/{made_up}")
        text = c.get("/metrics", headers=VIEWER_H).text
        found = samples(text)
    assert "auth_failures" in text, [k for k in found if "auth" in k[0]]
    assert found[("oomguard_manager_auth_failures_total", (("role", "agent"),))] == 12
    assert found[("oomguard_manager_auth_failures_total", (("role", "viewer"),))] == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "oomguard.manager.auth"]
    assert lines == ["oomguard manager: refused agent token from testclient: a wrong token"], lines  # once a minute
    assert not any("wrong-token" in line or "AAAA" in line for line in lines)
    refused = [
        v
        for (name, labels), v in found.items()
        if name == "oomguard_manager_http_requests_total"
        and dict(labels).get("route") == "/api/v1/reports"
        and dict(labels)["status"] in ("401", "429")
    ]
    assert sum(refused) == 12
    timed = found[
        ("oomguard_manager_http_request_duration_seconds_count", (("method", "POST"), ("route", "/api/v1/reports")))
    ]
    assert timed == 12
    assert found[("oomguard_build_info", (("python", platform.python_version()), ("version", __version__)))] == 1
    assert found[("process_resident_memory_bytes", ())] > 0  # /proc/self: the process's own numbers
    methods = {dict(labels)["method"] for (name, labels) in found if name == "oomguard_manager_http_requests_total"}
    routes = {dict(labels)["route"] for (name, labels) in found if name == "oomguard_manager_http_requests_total"}
    assert "other" in methods and not methods & {"BREW", "WHEN"} and "unmatched" in routes
    assert not any(r.startswith("/nowhere") for r in routes)
