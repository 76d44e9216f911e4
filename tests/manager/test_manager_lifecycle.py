"""The operator's numbers and the node lifecycle (issues #14 and #15), against a real SQLite file
and a real PostgreSQL server, with the manager's clock under the test's control:

- usage and working set per node (list, detail, /metrics), unknown never 0;
- OOM kills and pressure stops counted apart, once each, everywhere;
- the ``alerts`` count and the ``risk`` sort;
- forgetting a node (``DELETE /api/v1/nodes/NAME``, the admin token only);
- archiving silent nodes (``--forget-after``) and their return;
- run-only nodes (events only), judged by their supervisor's heartbeat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text

from oomguard.errors import UsageError
from oomguard.manager.app import create_app
from oomguard.manager.bodies import EventEnvelope, ReportEnvelope
from oomguard.manager.db import events, latest_reports, make_engine, migrate, nodes, reports
from oomguard.manager.settings import Settings
from oomguard.manager.store import Store
from tests.helpers.manager import (
    AGENT,
    AGENT_H,
    VIEWER,
    VIEWER_H,
    GiB,
    ManagerProcess,
    envelope,
    fixture_report,
    local_client,
    migrated_db,
)
from tests.helpers.wait import wait_until

ADMIN = "admin-secret-token"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
MIN_MS = 60_000
HOUR_MS = 60 * MIN_MS
DAY_MS = 24 * HOUR_MS
T0 = 1_800_000_000_000


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "l_")


class Clock:
    """The manager's clock (epoch ms), moved by the test."""

    def __init__(self, t: int = T0) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def client_for(url: str, clock: Clock, *, admin: str | None = ADMIN, **kw: Any) -> TestClient:
    settings = Settings(db_url=url, agent_token=AGENT, viewer_token=VIEWER, admin_token=admin)
    store = Store(make_engine(url), clock=clock, **kw)
    client: TestClient = local_client(create_app(settings, store))
    return client


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client(db_url: str, clock: Clock) -> Iterator[TestClient]:
    with client_for(db_url, clock) as c:
        yield c


def report(c: TestClient, node: str, rep: dict[str, Any] | None = None, **extra: Any) -> None:
    r = c.post("/api/v1/reports", json=envelope(node, rep or fixture_report(), **extra), headers=AGENT_H)
    assert r.status_code == 200, r.text


def event(c: TestClient, node: str, **fields: Any) -> Any:
    body = {"node": node, "id": uuid.uuid4().hex, "event": fields}
    r = c.post("/api/v1/events", json=body, headers=AGENT_H)
    assert r.status_code == 200, r.text
    return r.json()


def listed(c: TestClient, query: str = "") -> dict[str, dict[str, Any]]:
    page = c.get(f"/api/v1/nodes?limit=1000{query}", headers=VIEWER_H).json()
    return {n["name"]: n for n in page["nodes"]}


def names(c: TestClient, query: str) -> list[str]:
    return [n["name"] for n in c.get(f"/api/v1/nodes?limit=1000&{query}", headers=VIEWER_H).json()["nodes"]]


def alerts_of(c: TestClient, node: str) -> list[dict[str, Any]]:
    return [a for a in c.get("/api/v1/alerts", headers=VIEWER_H).json()["alerts"] if a["node"] == node]


def metric_lines(c: TestClient, node: str) -> dict[str, float]:
    """The node's samples in /metrics, by metric name."""
    out = {}
    for line in c.get("/metrics", headers=VIEWER_H).text.splitlines():
        if f'{{node="{node}"}}' in line:
            name, value = line.split(f'{{node="{node}"}} ')
            out[name] = float(value)
    return out


def summary(c: TestClient) -> dict[str, int]:
    from oomguard.manager.store import Store as _Store

    store: _Store = c.app.state.store  # type: ignore[attr-defined]
    return store.summary()


# -- the numbers ---------------------------------------------------------------------------------


def test_usage_and_working_set_per_node_unknown_stays_null(client: TestClient) -> None:
    report(client, "known")  # the 342 GiB container: 20 GiB usage, 16 GiB working set
    blind = fixture_report()
    blind["memory"]["usage_bytes"] = blind["memory"]["working_set_bytes"] = None
    blind["warnings"].append({"code": "usage-unknown", "message": "no memory.current"})
    report(client, "blind", blind)
    rows = listed(client)
    known, unknown = rows["known"], rows["blind"]
    assert (known["usage_bytes"], known["working_set_bytes"]) == (20 * GiB, 16 * GiB)
    assert known["working_set_pct"] == round(16 * 100 / 342, 1) == 4.7
    given = len(fixture_report()["warnings"])  # the fixture's own (limit-may-be-hidden), one more for blind
    assert known["warnings_count"] == given and unknown["warnings_count"] == given + 1
    assert unknown["usage_bytes"] is None and unknown["working_set_bytes"] is None
    assert unknown["working_set_pct"] is None
    detail = client.get("/api/v1/nodes/known", headers=VIEWER_H).json()
    assert detail["working_set_bytes"] == 16 * GiB and detail["working_set_pct"] == 4.7
    assert metric_lines(client, "known")["oomguard_memory_working_set_bytes"] == 16 * GiB
    assert metric_lines(client, "known")["oomguard_memory_usage_bytes"] == 20 * GiB
    blind_metrics = metric_lines(client, "blind")
    assert "oomguard_memory_usage_bytes" not in blind_metrics  # no sample, never NaN or 0
    assert "oomguard_memory_working_set_bytes" not in blind_metrics
    assert "NaN" not in client.get("/metrics", headers=VIEWER_H).text
    with client.app.state.store.engine.connect() as conn:  # type: ignore[attr-defined]
        stored = conn.execute(select(nodes.c.usage_bytes).where(nodes.c.name == "blind")).scalar_one()
    assert stored is None  # NULL in the database, not 0
    report(client, "blind")  # a later report that knows: the node's latest values follow it
    assert listed(client)["blind"]["working_set_bytes"] == 16 * GiB


def test_an_offline_nodes_working_set_is_history_not_a_reading(client: TestClient, clock: Clock) -> None:
    """The agent died with its node at 15.6 %: the table keeps the last bytes reported, but no
    percentage, no rank in the risk sort above a live node, and no usage sample in /metrics."""
    report(client, "dead", fixture_report("docker_v2_private_ns_limit_512m"))  # 80 MiB of 512 MiB
    clock.t += 10 * MIN_MS  # three missed intervals and more: offline
    report(client, "live")  # 4.7 %
    rows = listed(client)
    dead = rows["dead"]
    assert dead["status"] == "offline" and dead["working_set_bytes"] == 80 * 2**20
    assert dead["working_set_pct"] is None and rows["live"]["working_set_pct"] == 4.7
    assert names(client, "sort=risk") == ["live", "dead"]  # the offline alert is its own: both 0 OOM
    assert names(client, "sort=-working_set_pct") == ["live", "dead"]
    samples = metric_lines(client, "dead")
    assert "oomguard_memory_working_set_bytes" not in samples and "oomguard_memory_usage_bytes" not in samples
    assert samples["oomguard_node_up"] == 0 and samples["oomguard_memory_effective_bytes"] == 512 * 2**20
    report(client, "dead", fixture_report("docker_v2_private_ns_limit_512m"))  # back: a reading again
    assert listed(client)["dead"]["working_set_pct"] == 15.6
    assert metric_lines(client, "dead")["oomguard_memory_working_set_bytes"] == 80 * 2**20


def test_one_oom_kill_and_two_pressure_stops_are_counted_apart_everywhere(client: TestClient) -> None:
    report(client, "mixed")
    report(client, "calm")
    # The supervisor's events as it sends them: each exit, then a restart repeating the reason.
    event(client, "mixed", event="exit", reason="oom-kill", signal=9, pid=1)
    event(client, "mixed", event="restart", reason="oom-kill", delay_s=1.0)
    for pid in (2, 3):
        event(client, "mixed", event="exit", reason="pressure-stop", signal=15, pid=pid, peak_bytes=GiB)
        event(client, "mixed", event="restart", reason="pressure-stop", delay_s=1.0)
    row = listed(client)["mixed"]
    assert (row["oom_kills_24h"], row["pressure_stops_24h"]) == (1, 2)
    detail = client.get("/api/v1/nodes/mixed", headers=VIEWER_H).json()
    assert (detail["oom_kills_24h"], detail["pressure_stops_24h"]) == (1, 2)
    cards = summary(client)
    assert (cards["oom_kills_24h"], cards["pressure_stops_24h"]) == (1, 2)
    m = metric_lines(client, "mixed")
    assert (m["oomguard_oom_kills_total"], m["oomguard_pressure_stops_total"]) == (1, 2)
    found = {a["kind"]: a for a in alerts_of(client, "mixed")}
    assert set(found) == {"oom-kills", "pressure-stops"}
    assert found["oom-kills"]["message"] == "1 OOM kill(s) in the last hour"
    assert found["oom-kills"]["severity"] == "critical"
    assert found["pressure-stops"]["message"].startswith("2 pressure stop(s) in the last hour")
    assert found["pressure-stops"]["severity"] == "warning"
    assert row["alerts"] == 2 and listed(client)["calm"]["alerts"] == 0


def test_pressure_stop_alert_lasts_an_hour_the_count_a_day(client: TestClient, clock: Clock) -> None:
    report(client, "g")
    event(client, "g", event="exit", reason="pressure-stop", signal=15)
    clock.t += HOUR_MS + 1
    report(client, "g")  # still online
    # The pressure stop's alert is gone after the hour; the worker it stopped was never restarted
    # (no restart or start event came): that is the supervisor's "exited" alert (issue 38), not it.
    assert [a["kind"] for a in alerts_of(client, "g")] == ["supervisor-exited"] and listed(client)["g"]["alerts"] == 1
    assert listed(client)["g"]["pressure_stops_24h"] == 1
    clock.t += DAY_MS
    report(client, "g")
    assert listed(client)["g"]["pressure_stops_24h"] == 0 and summary(client)["pressure_stops_24h"] == 0


def test_the_alerts_column_is_the_alert_policy(client: TestClient, clock: Clock) -> None:
    """Each node's ``alerts`` equals the number of alerts /api/v1/alerts gives it, for every kind."""
    pinned = fixture_report()
    pinned["warnings"].append({"code": "memlock-too-low", "message": "plan pins 4 GiB"})
    reporting = {
        "fine": fixture_report(),
        "host-sized": fixture_report(budget="500GiB"),
        "over": fixture_report("docker_v2_private_ns_limit_512m", budget="600MiB"),
        "pinned": pinned,
    }
    for name, rep in reporting.items():
        report(client, name, rep, interval_s=3600)
    report(client, "gone", interval_s=1)
    report(client, "worst", fixture_report(budget="500GiB"), interval_s=1)
    event(client, "worst", event="exit", reason="oom-kill")
    event(client, "worst", event="exit", reason="pressure-stop")
    event(client, "runner", event="start", pid=5)  # run-only, offline once its heartbeat is late
    clock.t += 10 * MIN_MS
    policy: dict[str, int] = {}
    for a in client.get("/api/v1/alerts", headers=VIEWER_H).json()["alerts"]:
        policy[a["node"]] = policy.get(a["node"], 0) + 1
    rows = listed(client)
    assert {n: r["alerts"] for n, r in rows.items() if r["alerts"]} == policy
    # worst: budget-from-host, offline, oom-kills, pressure-stops and supervisor-exited (its last
    # event an exit, never restarted); runner: offline and supervisor-lost (a start, then silence).
    assert policy == {"host-sized": 1, "over": 1, "pinned": 1, "gone": 1, "worst": 5, "runner": 2}
    assert names(client, "sort=-alerts")[0] == "worst"


def test_risk_is_the_default_order(client: TestClient) -> None:
    small = fixture_report("docker_v2_private_ns_limit_512m")  # working set 80 MiB of 512 MiB: 15.6 %
    big = fixture_report()  # 16 GiB of 342 GiB: 4.7 %
    blind = fixture_report()
    blind["memory"]["working_set_bytes"] = None
    for name, rep in (("a-big", big), ("b-small", small), ("c-blind", blind), ("d-big-alerting", big)):
        report(client, name, rep)
    report(client, "e-host-sized", fixture_report(budget="500GiB"))  # 4.7 % and an alert
    report(client, "f-oom", big)
    event(client, "f-oom", event="exit", reason="oom-kill")
    event(client, "f-oom", event="restart", reason="oom-kill")
    pinned = fixture_report()
    pinned["warnings"].append({"code": "memlock-too-low", "message": "x"})
    report(client, "d-big-alerting", pinned)
    event(client, "d-big-alerting", event="exit", reason="pressure-stop")
    # The live danger first: working set over limit, then open alerts, then OOM kills (f-oom's one
    # kill is history next to b-small's 15.6 % now).
    riskiest = ["b-small", "d-big-alerting", "f-oom", "e-host-sized", "a-big", "c-blind"]
    assert names(client, "") == riskiest  # no sort given: risk
    assert names(client, "sort=risk") == riskiest
    assert names(client, "sort=-risk") == ["c-blind", "a-big", "e-host-sized", "f-oom", "d-big-alerting", "b-small"]
    assert names(client, "sort=working_set_pct")[-1] == "c-blind"  # unknown last, both ways
    assert names(client, "sort=-working_set_pct")[-1] == "c-blind"
    assert names(client, "sort=-working_set_pct")[0] == "b-small"
    assert names(client, "sort=-pressure_stops_24h")[0] == "d-big-alerting"
    assert names(client, "sort=-alerts")[:2] == ["d-big-alerting", "e-host-sized"]
    assert names(client, "sort=name") == sorted(riskiest)
    spec = client.get("/openapi.json").json()["paths"]["/api/v1/nodes"]["get"]["parameters"]
    assert next(p for p in spec if p["name"] == "sort")["schema"]["default"] == "risk"


# -- forgetting a node ----------------------------------------------------------------------------


def test_delete_forgets_a_node_with_the_admin_token_only(client: TestClient, db_url: str) -> None:
    report(client, "churned")
    report(client, "churned")
    event(client, "churned", event="exit", reason="oom-kill")
    report(client, "kept")
    for headers in ({}, AGENT_H, VIEWER_H, {"Authorization": "Bearer admin-secret-tokeN"}):
        r = client.delete("/api/v1/nodes/churned", headers=headers)
        assert r.status_code == 401, (headers, r.status_code)
    assert "churned" in listed(client)
    r = client.delete("/api/v1/nodes/churned", headers=ADMIN_H)
    assert r.status_code == 204 and r.content == b""
    assert "churned" not in listed(client) and client.get("/api/v1/nodes/churned", headers=VIEWER_H).status_code == 404
    with make_engine(db_url).connect() as conn:
        assert conn.execute(select(func.count()).select_from(nodes).where(nodes.c.name == "churned")).scalar() == 0
        kept_id = conn.execute(select(nodes.c.id).where(nodes.c.name == "kept")).scalar_one()
        assert set(conn.execute(select(reports.c.node_id)).scalars()) == {kept_id}  # its rows went with it
        assert conn.execute(select(func.count()).select_from(events)).scalar() == 0
    again = client.delete("/api/v1/nodes/churned", headers={**ADMIN_H, "Accept": "application/json"})
    assert again.status_code == 404 and again.json() == {"detail": "no node named 'churned'"}
    assert client.delete("/api/v1/nodes/bad%20name", headers=ADMIN_H).status_code in (404, 422)
    report(client, "churned")  # it comes back as a new node, through the writer's cache
    back = client.get("/api/v1/nodes/churned", headers=VIEWER_H).json()
    assert back["oom_kills_24h"] == 0 and back["history_count"] == 1
    event(client, "churned", event="start", pid=3)
    assert len(client.get("/api/v1/nodes/churned", headers=VIEWER_H).json()["events"]) == 1


def test_delete_without_an_admin_token_is_403_for_everyone(db_url: str, clock: Clock) -> None:
    with client_for(db_url, clock, admin=None) as c:
        report(c, "n")
        for headers in ({}, AGENT_H, VIEWER_H, ADMIN_H):
            r = c.delete("/api/v1/nodes/n", headers={**headers, "Accept": "application/json"})
            assert r.status_code == 403 and "no admin token" in r.json()["detail"], r.text
        assert "n" in listed(c)


def test_wrong_admin_tokens_are_limited_like_the_others(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'limit.db'}"
    migrate(url)
    settings = Settings(db_url=url, agent_token=AGENT, viewer_token=VIEWER, admin_token=ADMIN, login_burst=3)
    with local_client(create_app(settings)) as c:
        codes = [c.delete("/api/v1/nodes/x", headers={"Authorization": "Bearer wrong"}).status_code for _ in range(4)]
        assert codes == [401, 401, 401, 429]
        assert c.delete("/api/v1/nodes/x", headers=ADMIN_H).status_code == 404  # a right token passes (issue 22)


def test_the_admin_token_follows_the_token_rules() -> None:
    a, v, o = "a" * 16, "v" * 16, "o" * 16
    Settings(host="0.0.0.0", agent_token=a, viewer_token=v, admin_token=o).check()
    Settings(host="0.0.0.0", agent_token=a, viewer_token=v).check()  # optional: forgetting is off then
    for same in (a, v):
        with pytest.raises(UsageError, match="must differ"):
            Settings(host="0.0.0.0", agent_token=a, viewer_token=v, admin_token=same).check()
    with pytest.raises(UsageError, match=r"^--admin-token: at least 16 characters off loopback \(got 5\)"):
        Settings(host="0.0.0.0", agent_token=a, viewer_token=v, admin_token="short").check()
    with pytest.raises(UsageError, match=r"^--admin-token: only visible ASCII"):
        Settings(admin_token="has space").check()


def test_cli_settings_admin_token_and_forget_after(monkeypatch: pytest.MonkeyPatch, clean_env: None) -> None:
    from oomguard.manager.settings import settings_from

    def parsed(**kw: str) -> Settings:
        return settings_from(argparse.Namespace(**kw))

    assert parsed().forget_after_s == 7 * 86400 and parsed().admin_token is None
    assert parsed(forget_after="36h").forget_after_s == 36 * 3600
    assert parsed(forget_after="off").forget_after_s is None and parsed(forget_after="0").forget_after_s is None
    with pytest.raises(UsageError, match=r"^--forget-after: invalid duration"):
        parsed(forget_after="soon")
    assert parsed(forget_after="1h").forget_after_s == 3600
    with pytest.raises(UsageError, match=r"^--forget-after: must be at least 3600 s"):
        parsed(forget_after="59m")  # archived before anyone saw it offline
    with pytest.raises(UsageError, match=r"^--forget-after: must be at least 7200 s"):
        parsed(forget_after="90m", interval="40m")  # three intervals of 40 min
    monkeypatch.setenv("OOMGUARD_ADMIN_TOKEN", "from-the-environment\n")
    assert parsed().admin_token == "from-the-environment"
    assert parsed(admin_token="from-the-flag").admin_token == "from-the-flag"


@pytest.mark.slow
def test_delete_on_the_wire_with_the_admin_token_from_the_environment(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    server = ManagerProcess(f"sqlite:///{tmp_path / 'wire.db'}", env={"OOMGUARD_ADMIN_TOKEN": ADMIN}).start()
    try:
        body = json.dumps(envelope("wired", fixture_report())).encode()
        post = urllib.request.Request(
            f"{server.url}/api/v1/reports", body, {**AGENT_H, "Content-Type": "application/json"}
        )
        urllib.request.urlopen(post, timeout=10).close()
        for headers, status in ((AGENT_H, 401), (ADMIN_H, 204), (ADMIN_H, 404)):
            req = urllib.request.Request(f"{server.url}/api/v1/nodes/wired", headers=headers, method="DELETE")
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    got = r.status
            except urllib.error.HTTPError as e:
                got = e.code
            assert got == status, headers
        assert ADMIN not in server.log()
    finally:
        server.stop()


# -- archiving silent nodes -------------------------------------------------------------------------


def test_silent_nodes_are_archived_and_come_back(client: TestClient, clock: Clock) -> None:
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    report(client, "silent", fixture_report(budget="500GiB"))  # with an alert, to see it leave
    event(client, "silent", event="exit", reason="oom-kill")
    report(client, "alive", interval_s=3600)
    event(client, "runner", event="start", pid=1)  # run-only
    clock.t += 7 * DAY_MS - MIN_MS
    report(client, "alive", interval_s=3600)
    event(client, "runner", event="heartbeat", interval_s=60)
    assert store.thin()["archived_nodes"] == 0  # not yet 7 days
    clock.t += 2 * MIN_MS
    result = store.thin()
    assert result["archived_nodes"] == 1 and result["skipped"] == 0
    assert set(listed(client)) == {"alive", "runner"}
    assert names(client, "status=archived") == ["silent"]
    assert client.get("/api/v1/nodes/silent", headers=VIEWER_H).json()["status"] == "archived"
    assert alerts_of(client, "silent") == [] and metric_lines(client, "silent") == {}
    cards = summary(client)
    assert (cards["archived"], cards["online"], cards["run_only"], cards["offline"]) == (1, 1, 1, 0)
    assert cards["effective_bytes"] == 342 * GiB  # the archived node's memory left the card
    assert store.thin()["archived_nodes"] == 0  # archived once
    event(client, "silent", event="start", pid=2)  # its supervisor is back: so is the node
    back = listed(client)["silent"]
    assert back["status"] == "online" and not back["current"]  # alive by its supervisor; its report is old
    assert back["working_set_pct"] is None and back["last_working_set_pct"] is not None
    clock.t += 8 * DAY_MS
    store.thin()
    assert names(client, "status=archived&sort=name") == ["alive", "runner", "silent"] and listed(client) == {}
    report(client, "silent")  # a report brings it back too
    assert listed(client)["silent"]["status"] == "online" and summary(client)["archived"] == 2


def test_a_node_is_seen_offline_before_it_is_archived(db_url: str, clock: Clock) -> None:
    """--forget-after 1 h, an agent reporting every 30 min: it is offline only after 90 min, so it
    is not archived at 70 min (it would leave without ever alerting), but at the first pass after."""
    with client_for(db_url, clock, forget_after_s=3600) as c:
        store: Store = c.app.state.store
        report(c, "slow", interval_s=1800)
        clock.t += 70 * MIN_MS
        assert store.thin()["archived_nodes"] == 0 and listed(c)["slow"]["status"] == "online"
        clock.t += 21 * MIN_MS
        assert [a["kind"] for a in alerts_of(c, "slow")] == ["offline"]  # seen, and alerting
        assert store.thin()["archived_nodes"] == 1 and names(c, "status=archived") == ["slow"]


def test_cards_leave_out_an_archived_nodes_recent_exits(client: TestClient) -> None:
    """The cards count each node's exits of the last day once, in the same pass as the statuses
    (queries.summary); an archived node's leave with it, whatever its status."""
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    for name in ("kept", "archived"):
        report(client, name)
        event(client, name, event="exit", reason="oom-kill")
        event(client, name, event="exit", reason="pressure-stop")
    event(client, "kept", event="exit", reason="oom-kill")
    event(client, "kept", event="restart", reason="oom-kill")  # not an exit: not counted
    cards = summary(client)
    assert (cards["oom_kills_24h"], cards["pressure_stops_24h"], cards["online"]) == (3, 2, 2)
    with store.engine.begin() as conn:
        conn.execute(nodes.update().where(nodes.c.name == "archived").values(archived_ms=store.clock()))
    cards = summary(client)
    assert (cards["oom_kills_24h"], cards["pressure_stops_24h"]) == (2, 1)
    assert (cards["online"], cards["archived"], cards["effective_bytes"]) == (1, 1, 342 * GiB)


def test_memlock_alert_read_from_escaped_json() -> None:
    """The memlock alert skips parsing a warnings list that cannot name the code, and still finds
    it when JSON escapes spell it (alerts._warns_memlock)."""
    from oomguard.manager.alerts import node_alerts

    row = {"name": "n", "status": "online", "effective_bytes": 1, "budget_bytes": 1, "host_total_bytes": 2}
    for warnings, kinds in (
        (None, []),
        ("[]", []),
        ('["cgroup-unreadable"]', []),
        ('["memlock-too-low"]', ["memlock-below-pinned-need"]),
        ('["memlock\\u002dtoo-low"]', ["memlock-below-pinned-need"]),
        ('["x-memlock-too-low"]', []),
    ):
        assert [a["kind"] for a in node_alerts({**row, "warnings": warnings}, 0)] == kinds, warnings


def test_forget_after_off_never_archives(db_url: str, clock: Clock) -> None:
    with client_for(db_url, clock, forget_after_s=None) as c:
        report(c, "old")
        clock.t += 400 * DAY_MS
        assert c.app.state.store.thin()["archived_nodes"] == 0
        assert listed(c)["old"]["status"] == "offline"


def test_archiving_on_a_store_built_from_settings(tmp_path: Path) -> None:
    """``--forget-after`` reaches the retention pass through create_app."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    migrate(url)
    with local_client(create_app(Settings(db_url=url, forget_after_s=1.0, interval_s=0.2))) as c:
        report(c, "brief")
        # Archived once 1 s old: by this pass, or by the store's own pass every 0.2 s before it.
        gone = lambda: c.app.state.store.thin()["archived_nodes"] == 1 or c.get("/api/v1/nodes").json()["total"] == 0  # noqa: E731
        wait_until(gone, what="the node archived after --forget-after 1 s")
        assert c.get("/api/v1/nodes").json()["total"] == 0


# -- run-only nodes -------------------------------------------------------------------------------


def test_a_node_known_only_from_run_events_is_run_only_while_its_heartbeat_lasts(
    client: TestClient, clock: Clock, db_url: str
) -> None:
    event(client, "runner", event="start", pid=7, concurrency=4)
    report(client, "agent", interval_s=30)
    assert listed(client)["runner"]["status"] == "run-only"
    assert names(client, "status=run-only") == ["runner"]
    clock.t += 2 * MIN_MS + 50_000  # under three default heartbeat intervals (3 min)
    assert listed(client)["runner"]["status"] == "run-only" and listed(client)["agent"]["status"] == "offline"
    answer, sent_id = heartbeat(client, "runner", 60)
    assert answer == {"stored": True, "id": sent_id}
    heartbeat(client, "agent", 60)  # a heartbeat counts for an agent's node too: alive, its report not current
    assert listed(client)["agent"]["status"] == "online" and not listed(client)["agent"]["current"]
    clock.t += 2 * MIN_MS + 50_000
    rows = listed(client)
    assert rows["runner"]["status"] == "run-only" and rows["agent"]["status"] == "online"
    assert rows["agent"]["last_seen"] > rows["agent"]["last_report"]  # the heartbeat, after the report
    assert metric_lines(client, "runner")["oomguard_node_up"] == 1 and alerts_of(client, "runner") == []
    assert summary(client)["run_only"] == 1
    clock.t += 3 * MIN_MS + 1  # three missed heartbeats
    assert listed(client)["runner"]["status"] == "offline"
    assert metric_lines(client, "runner")["oomguard_node_up"] == 0
    offline, lost = alerts_of(client, "runner")
    assert offline["kind"] == "offline" and offline["message"].startswith("no event or heartbeat from its supervisor")
    assert (lost["kind"], lost["severity"]) == ("supervisor-lost", "critical")  # issue 38: not "running" for ever
    assert listed(client)["runner"]["supervisor_state"] == "lost"
    heartbeat(client, "runner", 10)  # a supervisor with a shorter heartbeat: judged by it
    clock.t += 29_000
    assert listed(client)["runner"]["status"] == "run-only"
    clock.t += 2_000
    assert listed(client)["runner"]["status"] == "offline"
    with make_engine(db_url).connect() as conn:  # heartbeats are no rows
        kinds = list(conn.execute(select(events.c.kind)).scalars())
    assert kinds == ["start"]
    assert [e["event"] for e in client.get("/api/v1/nodes/runner", headers=VIEWER_H).json()["events"]] == ["start"]
    report(client, "runner")  # an agent starts reporting: judged by its reports from now on
    assert listed(client)["runner"]["status"] == "online"


def test_an_announced_heartbeat_interval_is_kept_within_10s_and_1h(client: TestClient, clock: Clock) -> None:
    """A dead supervisor that announced a day stays run-only 3 h at most, not 3 days; one that
    announced a microsecond is not offline at once."""
    event(client, "lazy", event="start", pid=8)
    heartbeat(client, "lazy", 86_400)
    clock.t += 3 * HOUR_MS - 1_000
    assert listed(client)["lazy"]["status"] == "run-only"
    clock.t += 2_000
    assert listed(client)["lazy"]["status"] == "offline"
    event(client, "eager", event="start", pid=9)
    heartbeat(client, "eager", 1e-6)
    clock.t += 29_000  # under three floors of 10 s
    assert listed(client)["eager"]["status"] == "run-only"


def heartbeat(c: TestClient, node: str, interval_s: float) -> tuple[Any, str]:
    """POST a heartbeat as the forwarder does: (the answer, the id sent)."""
    sent_id = uuid.uuid4().hex
    body = {"node": node, "id": sent_id, "event": {"event": "heartbeat", "time": "2026-01-01T00:00:00Z"}}
    body["event"]["interval_s"] = interval_s  # type: ignore[index]
    r = c.post("/api/v1/events", json=body, headers=AGENT_H)
    assert r.status_code == 200, r.text
    return r.json(), sent_id


@pytest.mark.parametrize("interval", [0, -1, 1e9, "NaN", "soon"])
def test_a_bad_heartbeat_interval_is_422(client: TestClient, interval: Any) -> None:
    body = {"node": "n", "id": "hb-1", "event": {"event": "heartbeat", "interval_s": interval}}
    r = client.post("/api/v1/events", json=body, headers=AGENT_H)
    assert r.status_code == 422 and listed(client) == {}


@pytest.mark.slow
def test_the_forwarder_sends_heartbeats_that_are_never_spooled(tmp_path: Path) -> None:
    from oomguard.agent.forwarder import EventForwarder

    server = ManagerProcess(f"sqlite:///{tmp_path / 'hb.db'}").start()
    spool = tmp_path / "spool"
    try:
        sink = EventForwarder(server.url, AGENT, "hb-node", str(spool), heartbeat_s=0.3)
        try:
            row = wait_until(lambda: _row(server.db_url, "hb-node"), interval=0.05, what="the first heartbeat's row")
            # 0.3 s announced, kept as the floor of 10 s (store.writer.HEARTBEAT_MIN_MS)
            assert row and row["heartbeat_interval_ms"] == 10_000 and row["warnings"] is None  # no report ever
            assert not list(spool.glob("*.json"))  # nothing spooled for it
            first = row["last_event_ms"]
            again = lambda: _row(server.db_url, "hb-node")["last_event_ms"] > first  # noqa: E731
            wait_until(again, interval=0.05, what="a later heartbeat")  # again, and again
            sink({"event": "start", "pid": 3})
        finally:
            sink.close()
        with make_engine(server.db_url).connect() as conn:
            assert list(conn.execute(select(events.c.kind)).scalars()) == ["start"]  # heartbeats: no rows
    finally:
        server.stop()


def _row(url: str, name: str) -> Any:
    with make_engine(url).connect() as conn:
        return conn.execute(select(nodes).where(nodes.c.name == name)).mappings().first()


def test_heartbeats_wait_while_events_flow(tmp_path: Path) -> None:
    """A heartbeat is sent only after heartbeat_s with nothing handed to the forwarder."""
    from oomguard.agent.client import Outcome
    from oomguard.agent.forwarder import EventForwarder

    sink = EventForwarder("http://127.0.0.1:9", AGENT, "quiet", str(tmp_path / "spool"), heartbeat_s=3600)
    try:
        posted: list[dict[str, Any]] = []

        def post(kind: str, body: dict[str, Any]) -> Outcome:
            posted.append(body)
            return Outcome("retry", why="no manager here")

        sink.sender.post = post  # type: ignore[method-assign]
        sink._beats.post = post  # type: ignore[method-assign]  # heartbeats: their own 2 s client
        sink({"event": "start"})
        wait_until(lambda: posted, what="the event tried")  # (it waits in the spool)
        assert [b for b in posted if b["event"]["event"] == "heartbeat"] == []
        sink.heartbeat_s = 0.2  # configurable: a short interval from here on
        sink._wake.set()
        beats = wait_until(lambda: [b for b in posted if b["event"]["event"] == "heartbeat"], what="a heartbeat")
        beat = beats[0]
        assert beat["node"] == "quiet" and beat["event"]["event"] == "heartbeat"
        assert beat["event"]["interval_s"] == 0.2 and beat["event"]["time"].endswith("Z")
    finally:
        sink.close(0.5)


# -- the upgrade ------------------------------------------------------------------------------------


def test_upgrade_to_0005_fills_usage_from_the_latest_report(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.begin() as conn:  # the schema was migrated to head by the fixture: go back to 0004
        conn.execute(text("DELETE FROM nodes"))
    from alembic import command

    from oomguard.manager.db import alembic_config

    command.downgrade(alembic_config(db_url), "0004")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO nodes (name, first_seen_ms, last_seen_ms, effective_bytes, latest_report) "
                "VALUES ('old', 1, 3, 100, '{}'), ('empty', 1, 3, 100, '{}')"
            )
        )
        for rid, t, usage in (("r1", 1, 10), ("r2", 3, 30), ("r3", 2, 20)):
            conn.execute(
                text(
                    "INSERT INTO reports (node_id, ingest_id, received_ms, usage_bytes, working_set_bytes) "
                    "SELECT id, :rid, :t, :u, :w FROM nodes WHERE name = 'old'"
                ),
                {"rid": rid, "t": t, "u": usage, "w": usage // 2},
            )
    engine.dispose()
    migrate(db_url)
    with make_engine(db_url).connect() as conn:
        rows = {r["name"]: r for r in conn.execute(select(nodes)).mappings()}
        moved = dict(conn.execute(select(latest_reports.c.node_id, latest_reports.c.report)).all())
    assert (rows["old"]["usage_bytes"], rows["old"]["working_set_bytes"]) == (30, 15)  # the latest received
    assert rows["empty"]["usage_bytes"] is None and rows["old"]["archived_ms"] is None
    # The whole report moved out of the node row; "reported" is said by warnings from now on.
    assert moved == {rows["old"]["id"]: "{}", rows["empty"]["id"]: "{}"}
    assert {r["latest_report"] for r in rows.values()} == {None} and rows["old"]["warnings"] == "[]"
    store = Store(make_engine(db_url))
    assert store.node_detail("old")["latest"] == {}  # type: ignore[index]
    assert store.list_nodes(sort="name")["nodes"][0]["status"] == "offline"  # not run-only: it reported


# -- the store, for the dashboard -------------------------------------------------------------------


def test_the_store_forgets_for_the_dashboard(db_url: str) -> None:
    store = Store(make_engine(db_url))
    env = ReportEnvelope.model_validate(envelope("dash", fixture_report()))
    assert asyncio.run(store.ingest_report_async(env, json.dumps(env.report)))
    ev = EventEnvelope.model_validate({"node": "dash", "id": "e1", "event": {"event": "start"}})
    assert asyncio.run(store.ingest_event_async(ev, "{}"))
    assert asyncio.run(store.forget_node("dash")) is True
    assert asyncio.run(store.forget_node("dash")) is False
    assert store.node_detail("dash") is None
    again = ReportEnvelope.model_validate(envelope("dash", fixture_report()))
    assert asyncio.run(store.ingest_report_async(again, json.dumps(again.report)))
    assert store.list_nodes()["total"] == 1


def test_the_node_page_s_timeline_is_the_same_page_of_the_node_s_events(db_url: str) -> None:
    """``node_detail(timeline=(limit, offset))`` cuts the page from the events it read when the
    page lies among them, and reads it when it does not: both equal ``node_events``."""
    store = Store(make_engine(db_url))
    env = ReportEnvelope.model_validate(envelope("pages", fixture_report()))
    assert asyncio.run(store.ingest_report_async(env, json.dumps(env.report)))
    for i in range(12):
        ev = EventEnvelope.model_validate(
            {"node": "pages", "id": f"p{i}", "event": {"event": "start", "concurrency": i}}
        )
        assert asyncio.run(store.ingest_event_async(ev, json.dumps({"event": "start", "concurrency": i})))
    for limit, offset in ((5, 0), (5, 5), (5, 10), (5, 20), (3, 4)):
        detail = store.node_detail("pages", events_limit=10, timeline=(limit, offset))
        assert detail is not None
        assert detail["timeline"] == store.node_events("pages", limit=limit, offset=offset), (limit, offset)
    last = store.node_detail("pages", events_limit=10, timeline=(5, 10))
    assert last is not None and [e["concurrency"] for e in last["timeline"]["events"]] == [1, 0]  # the oldest two
    assert store.node_detail("nobody", timeline=(5, 0)) is None
