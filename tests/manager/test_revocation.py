"""Per-node revocation (issue 39, item 7), on a real SQLite file and a real PostgreSQL, with two
replicas (two managers, each its own Store, on one database): a node revoked through one replica's
API, or by ``oomguard manager revoke`` on the database, is refused (403) by the other at once: its
reports, events and observations (its own token's or the fleet-wide one's) and a read with its
token, within the second each replica keeps its list; other nodes go on; ``unrevoke`` lets it
back. No fleet secret is rotated."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from oomguard.manager.app import create_app
from oomguard.manager.settings import Settings
from oomguard.manager.web.credentials import node_token
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
from tests.helpers.wait import wait_until

SECRET = "fleet-secret-for-revocation-01"
ADMIN = "admin-secret-token-rev"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "rev_")


def replica(db_url: str) -> Any:
    settings = Settings(
        db_url=db_url, agent_token=AGENT, viewer_token=VIEWER, admin_token=ADMIN, fleet_secrets=(SECRET,)
    )
    return local_client(create_app(settings, make_store(db_url, Clock(1_800_000_000_000))))


def own(node: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {node_token(SECRET, node)}"}


def writes(c: Any, node: str, headers: dict[str, str]) -> list[int]:
    """The statuses of a report, an event and an observation of *node* with *headers*."""
    report = c.post("/api/v1/reports", json=envelope(node, fixture_report()), headers=headers)
    event = {"node": node, "id": uuid.uuid4().hex, "event": {"event": "start", "pid": 3}}
    sent = c.post("/api/v1/events", json=event, headers=headers)
    body = {"node": node, "id": uuid.uuid4().hex, "observation": observation_body()}
    observed = c.post("/api/v1/observations", json=body, headers=headers)
    return [report.status_code, sent.status_code, observed.status_code]


def asks(c: Any, node: str) -> int:
    return int(c.get("/api/v1/profiles/cuzk-porep/recommendation", headers=own(node)).status_code)


def test_a_node_revoked_on_one_replica_is_refused_by_every_replica(db_url: str) -> None:
    with replica(db_url) as a, replica(db_url) as b:
        assert writes(b, "gpu-7", own("gpu-7")) == [200, 200, 200]
        put = a.put("/api/v1/revoked/gpu-7", json={"reason": "its host was compromised"}, headers=ADMIN_H)
        assert put.status_code == 200 and put.json() == {"node": "gpu-7", "revoked": True}, put.text
        assert a.put("/api/v1/revoked/gpu-7", headers=ADMIN_H).json()["revoked"] is False  # already
        assert a.put("/api/v1/revoked/gpu-8", headers=VIEWER_H).status_code in (401, 403)  # the admin's only
        assert asks(a, "gpu-7") == 403  # the replica that revoked it: at once
        wait_until(lambda: asks(b, "gpu-7") == 403, interval=0.1, what="the other replica to read the list")
        for c in (a, b):
            assert writes(c, "gpu-7", own("gpu-7")) == [403, 403, 403]
            assert writes(c, "gpu-7", AGENT_H) == [403, 403, 403]  # the fleet-wide token too
            assert asks(c, "gpu-7") == 403
            assert writes(c, "gpu-8", own("gpu-8")) == [200, 200, 200] and asks(c, "gpu-8") == 200
        refused = b.post("/api/v1/reports", json=envelope("gpu-7", fixture_report()), headers=own("gpu-7"))
        assert refused.json()["detail"].startswith("node 'gpu-7' is revoked (since ")
        (listed,) = b.get("/api/v1/revoked", headers=VIEWER_H).json()["revoked"]
        assert (listed["node"], listed["reason"]) == ("gpu-7", "its host was compromised")
        assert b.delete("/api/v1/revoked/gpu-7", headers=ADMIN_H).status_code == 204
        assert b.delete("/api/v1/revoked/gpu-7", headers=ADMIN_H).status_code == 404
        wait_until(lambda: asks(a, "gpu-7") == 200, interval=0.1, what="the first replica to read the list")
        assert writes(a, "gpu-7", own("gpu-7")) == [200, 200, 200]  # back, the same token


def test_the_cli_revokes_on_the_database(db_url: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "oomguard", "manager", *args, "--db", db_url]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    with replica(db_url) as a, replica(db_url) as b:
        done = cli("revoke", "gpu-9", "--reason", "decommissioned")
        assert done.returncode == 0 and done.stderr == "oomguard manager: node gpu-9 revoked\n", done.stderr
        wait_until(lambda: asks(a, "gpu-9") == asks(b, "gpu-9") == 403, interval=0.1, what="each replica to read it")
        assert writes(a, "gpu-9", own("gpu-9")) == [403, 403, 403] and writes(b, "gpu-9", AGENT_H)[0] == 403
        assert '"reason": "decommissioned"' in cli("revoked").stdout
        assert cli("unrevoke", "gpu-9").returncode == 0
        wait_until(lambda: asks(b, "gpu-9") == 200, interval=0.1, what="the replica to read the list")
        assert writes(b, "gpu-9", own("gpu-9")) == [200, 200, 200]
    bad = cli("revoke")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "needs a node's name" in bad.stderr
