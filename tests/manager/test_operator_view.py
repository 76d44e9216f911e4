"""What the operator sees, round three (issue 38, items 1-3), on a real SQLite file and a real
PostgreSQL: OOM kills outside ``run`` counted from the kernel's counter the agent reports (dated,
alerted, kept apart from the supervised ones, equal to the kernel's); every supervisor's state,
``lost`` once its heartbeats stop; the riskiest nodes first within an alert group; revision 0013."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from oomguard.manager.app import create_app
from oomguard.manager.db import make_engine, migrate
from oomguard.manager.settings import Settings
from oomguard.manager.store import Store
from tests.helpers.manager import (
    AGENT,
    AGENT_H,
    VIEWER,
    VIEWER_H,
    Clock,
    db_url_of,
    envelope,
    fixture_report,
    local_client,
    migrated_db,
)

T0 = 1_800_000_000_000
MIN_MS = 60_000
MiB = 1 << 20


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "opv_")


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def client(db_url: str, clock: Clock) -> Iterator[TestClient]:
    settings = Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER)
    with local_client(create_app(settings, Store(make_engine(db_url), clock=clock))) as c:
        yield c


EVENTS_FILE = "/sys/fs/cgroup/memory.events"


def report(c: TestClient, node: str, kills: int | None, source: str = EVENTS_FILE, **extra: Any) -> None:
    """A report of *node* whose kernel oom_kill counter (of *source*) reads *kills*."""
    rep = fixture_report()
    rep["memory"]["oom"] = {"source": source, "oom": None, "oom_kill": kills, "oom_group_kill": None}
    r = c.post("/api/v1/reports", json=envelope(node, rep, **extra), headers=AGENT_H)
    assert r.status_code == 200, r.text


def event(c: TestClient, node: str, **fields: Any) -> None:
    r = c.post("/api/v1/events", json={"node": node, "id": uuid.uuid4().hex, "event": fields}, headers=AGENT_H)
    assert r.status_code == 200, r.text


def node(c: TestClient, name: str) -> dict[str, Any]:
    found: dict[str, Any] = c.get(f"/api/v1/nodes/{name}", headers=VIEWER_H).json()
    return found


def alerts(c: TestClient, name: str | None = None) -> list[dict[str, Any]]:
    listed = c.get("/api/v1/alerts", headers=VIEWER_H).json()["alerts"]
    return [a for a in listed if name is None or a["node"] == name]


def metric(c: TestClient, name: str, **labels: str) -> float | None:
    wanted = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    for line in c.get("/metrics", headers=VIEWER_H).text.splitlines():
        if line.startswith(name + wanted + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_kernel_oom_kills_are_counted_dated_and_alerted_apart(client: TestClient, clock: Clock) -> None:
    """Issue 38: the agent's report said the counter was 2 while /metrics and the alerts said 0."""
    report(client, "k1", 2)  # the first report: the group's kills so far
    seen = node(client, "k1")
    assert (seen["kernel_oom_kills_total"], seen["kernel_oom_kills_24h"], seen["kernel_oom_counter"]) == (2, 2, 2)
    assert seen["oom_kills_24h"] == 0  # the supervised ones, apart
    assert metric(client, "oomguard_kernel_oom_kills_total", node="k1") == 2
    assert metric(client, "oomguard_oom_kills_total", node="k1") == 0
    [kernel] = [a for a in alerts(client, "k1") if a["kind"] == "kernel-oom-kills"]
    assert kernel["severity"] == "critical" and kernel["message"].startswith("2 OOM kill(s) in the last hour")
    clock.t += MIN_MS
    report(client, "k1", 2)  # no rise: nothing more
    report(client, "k1", None)  # unknown: nothing, and 2 stays the base
    report(client, "k1", 5)
    assert node(client, "k1")["kernel_oom_kills_total"] == 5  # equal to the kernel's counter
    report(client, "k1", 1, source="/sys/fs/cgroup/other/memory.events")  # a new group: its 1 kill
    report(client, "k1", 0)  # the first file again, below its last reading: a group made anew, 0 kills
    detail = node(client, "k1")
    assert detail["kernel_oom_kills_total"] == 6 and detail["kernel_oom_counter"] == 0
    dated = [e for e in detail["events"] if e["event"] == "kernel-oom"]
    assert [e["kills"] for e in dated] == [1, 3, 2]  # newest first, each dated by the report that saw it
    assert metric(client, "oomguard_kernel_oom_kills_total", node="k1") == 6
    assert client.get("/api/v1/nodes", headers=VIEWER_H).json()["nodes"][0]["kernel_oom_kills_24h"] == 6
    clock.t += 61 * MIN_MS
    report(client, "k1", 0)
    assert not [a for a in alerts(client, "k1") if a["kind"] == "kernel-oom-kills"]  # the hour passed
    assert node(client, "k1")["kernel_oom_kills_24h"] == 6  # still in the day
    event(client, "r1", event="start", pid=3, concurrency=1)  # run-only: no agent, no counter
    assert metric(client, "oomguard_kernel_oom_kills_total", node="r1") is None  # unknown, not 0


def test_a_silent_supervisor_is_lost_and_every_state_is_seen(client: TestClient, clock: Clock) -> None:
    """Issue 38: four minutes after its supervisor was SIGKILLed, a node read "running ? of the
    planned 0 jobs"; gave-up, stopped and exited looked alike."""
    report(client, "a", 0, interval_s=30)
    event(client, "a", event="start", pid=7, concurrency=4)
    event(client, "a", event="heartbeat", interval_s=20)
    event(client, "b", event="start", pid=8, concurrency=2)
    event(client, "b", event="give-up", reason="oom-kill", message="5 restarts in 10 min")
    event(client, "c", event="start", pid=9)
    event(client, "c", event="stop", signal=15)
    event(client, "d", event="start", pid=10)
    event(client, "d", event="exit", reason="clean", exit_code=0)
    assert node(client, "a")["supervisor"]["state"] == "running"
    assert metric(client, "oomguard_supervisor_state", node="a", state="running") == 1
    clock.t += 3 * 20_000  # three heartbeat intervals: not yet
    report(client, "a", 0, interval_s=30)  # the agent keeps the node online all along
    assert node(client, "a")["supervisor_state"] == "running"
    clock.t += 1
    report(client, "a", 0, interval_s=30)
    detail = node(client, "a")
    assert detail["status"] == "online" and detail["supervisor_state"] == "lost"
    assert (detail["supervisor"]["state"], detail["supervisor"]["was"]) == ("lost", "running")
    assert detail["supervisor"]["jobs"] is None  # no "running ? of the planned" for a silent one
    assert metric(client, "oomguard_supervisor_state", node="a", state="lost") == 1
    assert metric(client, "oomguard_supervisor_state", node="a", state="running") is None
    kinds = {a["node"]: (a["kind"], a["severity"]) for a in alerts(client) if a["kind"].startswith("supervisor-")}
    assert kinds == {
        "a": ("supervisor-lost", "critical"),
        "b": ("supervisor-gave-up", "critical"),
        "c": ("supervisor-stopped", "warning"),
        "d": ("supervisor-exited", "warning"),
    }
    for state, name in (("lost", "a"), ("gave-up", "b"), ("stopped", "c"), ("exited", "d")):
        page = client.get(f"/api/v1/nodes?supervisor={state}", headers=VIEWER_H).json()
        assert ([n["name"] for n in page["nodes"]], page["total"]) == ([name], 1)
        assert metric(client, "oomguard_supervisor_state", node=name, state=state) == 1
    assert client.get("/api/v1/nodes?supervisor=bogus", headers=VIEWER_H).status_code == 422
    whole = client.get("/", headers=VIEWER_H).text  # the list says each dead or stopped supervisor
    for state, name in (("lost", "a"), ("gave-up", "b"), ("stopped", "c"), ("exited", "d")):
        assert f'href="?supervisor={state}" title="its supervisor (oomguard run) is {state}' in whole
        html = client.get(f"/?supervisor={state}", headers=VIEWER_H).text  # and filters by it
        shown = re.findall(r'<a class="node" href="/nodes/([^"]+)">', html)
        assert shown == [name] and f'<option value="{state}" selected>supervisor {state}</option>' in html
    assert len(re.findall(r'<a class="node" ', client.get("/?supervisor=bogus", headers=VIEWER_H).text)) == 4
    event(client, "a", event="heartbeat", interval_s=20)  # heard again: running
    assert node(client, "a")["supervisor_state"] == "running"


def test_the_riskiest_nodes_come_first_in_an_alert_group(client: TestClient) -> None:
    """Issue 38: inside a group, alerts sorted by node name: at 1,200 nodes the 5 shown of 222 were
    not the closest to their limits. Here each node's budget is above its limit (one group), and
    their working sets differ: the group lists them by working set over limit, highest first."""
    ratios = {"a-low": 10, "b-high": 95, "c-mid": 50, "d-none": None, "e-top": 99}
    for name, pct in ratios.items():
        rep = fixture_report("docker_v2_private_ns_limit_512m", budget="600MiB")
        rep["memory"]["working_set_bytes"] = None if pct is None else 512 * MiB * pct // 100
        r = client.post("/api/v1/reports", json=envelope(name, rep), headers=AGENT_H)
        assert r.status_code == 200, r.text
    group = [a["node"] for a in alerts(client) if a["kind"] == "budget-above-limit"]
    assert group == ["e-top", "b-high", "c-mid", "a-low", "d-none"]  # unknown last
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    shown = {g["kind"]: g for g in store.alert_groups(shown=2)["groups"]}
    assert [a["node"] for a in shown["budget-above-limit"]["alerts"]] == ["e-top", "b-high"]


def test_revision_0013_sets_each_supervisor_s_state(tmp_path: Path, db_url: str) -> None:
    url = db_url_of("sqlite" if db_url.startswith("sqlite") else "postgresql", tmp_path, "opv_0012_", "old.db")
    migrate(url, "0012")
    engine = make_engine(url)
    rows = {"run": ["start"], "gave": ["start", "exit", "give-up"], "gate": ["gate"], "none": []}
    with engine.begin() as conn:
        for i, (name, kinds) in enumerate(rows.items()):
            conn.execute(
                text("INSERT INTO nodes (id, name, first_seen_ms, last_seen_ms) VALUES (:i, :n, 1, 1)"),
                {"i": i + 1, "n": name},
            )
            for k, kind in enumerate(kinds):
                conn.execute(
                    text(
                        "INSERT INTO events (node_id, ingest_id, received_ms, kind, body) VALUES (:i, :e, :t, :k, '{}')"
                    ),
                    {"i": i + 1, "e": f"{name}-{k}", "t": 10 + k, "k": kind},
                )
    migrate(url)
    with engine.connect() as conn:
        found: dict[str, str | None] = dict(conn.execute(text("SELECT name, supervisor_state FROM nodes")).all())
    assert found == {"run": "running", "gave": "gave-up", "gate": "starting", "none": None}
    engine.dispose()
