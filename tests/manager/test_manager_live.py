"""The live question and the nodes that cannot run (issue 21), against a real SQLite file and a
real PostgreSQL server, with the manager's clock under the test's control:

- the ``working-set-high`` alert: at or above the line (90 % of the limit by default, or the
  configured one) or above the budget, since the first of the consecutive reports there; in the
  alerts, the ``alerts`` column, the node page and on /metrics (``oomguard_memory_working_set_ratio``);
- the risk order: the live danger first, offline nodes after them whatever their OOM history;
- ``gate`` events: a refused node, its alert, its count on /metrics; what clears it;
- labels on reports and events: kept, filtered on, exported on one ``oomguard_node_info`` series;
- events and heartbeats count for "last seen"; a run-only node's limit and budget from its start;
  the node's timeline a page at a time.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from oomguard.errors import EXIT_USAGE, UsageError
from oomguard.manager.app import create_app
from oomguard.manager.db import make_engine
from oomguard.manager.settings import Settings, settings_from
from oomguard.manager.store import Store
from tests.helpers.manager import (
    AGENT,
    AGENT_H,
    VIEWER,
    VIEWER_H,
    ManagerProcess,
    envelope,
    fixture_report,
    local_client,
    migrated_db,
)

MiB = 1 << 20
LIMIT = 512 * MiB  # the fixture's limit (docker_v2_private_ns_limit_512m)
MIN_MS = 60_000
HOUR_MS = 60 * MIN_MS
T0 = 1_800_000_000_000
CASE = "docker_v2_private_ns_limit_512m"


class Clock:
    def __init__(self, t: int = T0) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "live_")


@pytest.fixture
def clock() -> Clock:
    return Clock()


def client_for(url: str, clock: Clock, **store: Any) -> TestClient:
    settings = Settings(db_url=url, agent_token=AGENT, viewer_token=VIEWER)
    client: TestClient = local_client(create_app(settings, Store(make_engine(url), clock=clock, **store)))
    return client


@pytest.fixture
def client(db_url: str, clock: Clock) -> Iterator[TestClient]:
    with client_for(db_url, clock) as c:
        yield c


def at(working_set: int | None, budget: str = "500MiB", **memory: Any) -> dict[str, Any]:
    """The 512 MiB fixture's report with this working set (and usage 30 MiB above it) and budget
    (500 MiB: above the line, so that only the line decides; the fixture's own is 256 MiB)."""
    rep = fixture_report(CASE, budget=budget)
    usage = None if working_set is None else working_set + 30 * MiB
    rep["memory"].update(working_set_bytes=working_set, usage_bytes=usage, **memory)
    return rep


def report(c: TestClient, node: str, rep: dict[str, Any], **extra: Any) -> None:
    r = c.post("/api/v1/reports", json=envelope(node, rep, **extra), headers=AGENT_H)
    assert r.status_code == 200, r.text


def event(c: TestClient, node: str, labels: dict[str, str] | None = None, **fields: Any) -> None:
    body: dict[str, Any] = {"node": node, "id": uuid.uuid4().hex, "event": fields}
    if labels is not None:
        body["labels"] = labels
    r = c.post("/api/v1/events", json=body, headers=AGENT_H)
    assert r.status_code == 200, r.text


def alerts_of(c: TestClient, node: str, kind: str | None = None) -> list[dict[str, Any]]:
    found = c.get("/api/v1/alerts", headers=VIEWER_H).json()["alerts"]
    return [a for a in found if a["node"] == node and kind in (None, a["kind"])]


def node(c: TestClient, name: str) -> dict[str, Any]:
    r = c.get(f"/api/v1/nodes/{name}", headers=VIEWER_H)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def names(c: TestClient, query: str = "") -> list[str]:
    return [n["name"] for n in c.get(f"/api/v1/nodes?limit=1000&{query}", headers=VIEWER_H).json()["nodes"]]


def metrics(c: TestClient) -> str:
    text: str = c.get("/metrics", headers=VIEWER_H).text
    return text


def sample(text: str, name: str, labels: str) -> float | None:
    m = re.search(rf"^{name}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return None if m is None else float(m[1])


def iso(ms: int) -> str:
    from oomguard.manager.times import iso_ms

    text = iso_ms(ms)
    assert text is not None
    return text


# -- the working-set alert --------------------------------------------------------------------------


def test_working_set_alert_since_the_first_report_at_the_line(client: TestClient, clock: Clock) -> None:
    line = int(0.9 * LIMIT)  # 460.8 MiB: a whole number of bytes short of it is below
    report(client, "n", at(line - 1))
    assert alerts_of(client, "n", "working-set-high") == []
    clock.t += 30_000
    first = clock.t
    report(client, "n", at(line + 1))  # at or above: from this report on
    [alert] = alerts_of(client, "n", "working-set-high")
    assert alert["severity"] == "critical" and alert["since"] == iso(first)
    assert alert["message"] == f"working set 460.8 MiB is 90.0% of the 512 MiB limit (line 90%), since {iso(first)}"
    clock.t += 5 * MIN_MS
    for ws in (500 * MiB, 508 * MiB):  # still there: the same since, 10 minutes on
        clock.t += 30_000
        report(client, "n", at(ws))
    [alert] = alerts_of(client, "n", "working-set-high")
    assert alert["since"] == iso(first) and "99.2% of the 512 MiB limit" in alert["message"]
    row = node(client, "n")
    assert row["alerts"] == 1 and [a["kind"] for a in row["open_alerts"]] == ["working-set-high"]
    text = metrics(client)
    assert sample(text, "oomguard_memory_working_set_ratio", 'node="n"') == pytest.approx(508 / 512)
    assert sample(text, "oomguard_manager_working_set_line_ratio", "") is None  # no labels: no braces
    assert "oomguard_manager_working_set_line_ratio 0.9" in text
    clock.t += 30_000
    report(client, "n", at(100 * MiB))  # below: gone, and the next time counts anew
    assert alerts_of(client, "n", "working-set-high") == []
    clock.t += 30_000
    again = clock.t
    report(client, "n", at(470 * MiB))
    assert alerts_of(client, "n", "working-set-high")[0]["since"] == iso(again)
    clock.t += 3 * 30_000 + 1  # the latest report is no longer current: its working set is history
    assert alerts_of(client, "n", "working-set-high") == []
    assert sample(metrics(client), "oomguard_memory_working_set_ratio", 'node="n"') is None
    [offline] = alerts_of(client, "n")
    assert offline["kind"] == "offline" and offline["since"] == iso(again)


def test_working_set_above_the_budget_alerts_below_the_line(client: TestClient) -> None:
    report(client, "b", at(300 * MiB, budget="256MiB"))  # 58.6 % of the limit, above the 256 MiB budget
    [alert] = alerts_of(client, "b", "working-set-high")
    assert alert["message"].startswith(
        "working set 300 MiB is 58.6% of the 512 MiB limit (line 90%), above its 256 MiB"
    )
    report(client, "b", at(250 * MiB, budget="256MiB"))
    assert alerts_of(client, "b", "working-set-high") == []
    report(client, "u", at(None))  # unknown working set: no alert, no ratio, never 0
    assert alerts_of(client, "u", "working-set-high") == []
    assert sample(metrics(client), "oomguard_memory_working_set_ratio", 'node="u"') is None


def test_the_line_is_configurable(db_url: str, clock: Clock) -> None:
    with client_for(db_url, clock, working_set_line=0.8) as c:
        report(c, "n", at(int(0.85 * LIMIT)))
        [alert] = alerts_of(c, "n", "working-set-high")
        assert "(line 80%)" in alert["message"]
        assert "oomguard_manager_working_set_line_ratio 0.8" in metrics(c)
    with client_for(db_url, clock) as c:  # the default line: 85 % is below it
        assert alerts_of(c, "n", "working-set-high") == []


@pytest.mark.parametrize(
    ("flag", "env", "line"),
    [(None, None, 0.9), ("80%", None, 0.8), ("0.75", None, 0.75), (None, "95%", 0.95), ("70%", "95%", 0.7)],
)
def test_working_set_line_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch, flag: str | None, env: str | None, line: float
) -> None:
    for name in ("OOMGUARD_AGENT_TOKEN", "OOMGUARD_VIEWER_TOKEN", "OOMGUARD_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    if env is None:
        monkeypatch.delenv("OOMGUARD_WORKING_SET_LINE", raising=False)
    else:
        monkeypatch.setenv("OOMGUARD_WORKING_SET_LINE", env)
    assert settings_from(argparse.Namespace(working_set_line=flag)).working_set_line == pytest.approx(line)


@pytest.mark.parametrize("bad", ["0", "0%", "101%", "1.5", "nan", "ninety", "-5%", "%"])
def test_a_bad_working_set_line_is_one_line_naming_the_flag(bad: str) -> None:
    with pytest.raises(UsageError, match=r"^--working-set-line: "):
        settings_from(argparse.Namespace(working_set_line=bad))


@pytest.mark.slow
def test_the_real_manager_takes_the_line_from_its_flag(tmp_path: Path) -> None:
    """``oomguard manager --working-set-line 50%`` reaches the Store (create_app), not only Settings."""
    import httpx

    server = ManagerProcess(migrated_db("sqlite", tmp_path, "line"), "--working-set-line", "50%").start()
    try:
        text = httpx.get(server.url + "/metrics", headers=VIEWER_H, timeout=10).text
        assert "oomguard_manager_working_set_line_ratio 0.5" in text, text[:400]
        bad = subprocess.run(
            [*server.command(), "--working-set-line", "ninety"], capture_output=True, text=True, timeout=60
        )
        assert bad.returncode == EXIT_USAGE and bad.stderr.count("\n") == 1, bad.stderr
        assert "--working-set-line: " in bad.stderr and "Traceback" not in bad.stderr
    finally:
        server.stop()


# -- the risk order: the live danger first --------------------------------------------------------


def test_a_live_99_percent_node_outranks_offline_nodes_with_many_oom_kills(client: TestClient, clock: Clock) -> None:
    for i in range(3):  # yesterday's trouble: many OOM kills, then silence
        report(client, f"dead-{i}", at(200 * MiB))
        for _ in range(5 + i):
            event(client, f"dead-{i}", event="exit", reason="oom-kill", signal=9)
    clock.t += 20 * MIN_MS  # they are offline now; their kills are within 24 h
    report(client, "calm", at(100 * MiB))
    report(client, "dying", at(int(0.992 * LIMIT)))
    report(client, "middling", at(300 * MiB))
    report(client, "blind", at(None))
    assert names(client) == ["dying", "middling", "calm", "blind", "dead-2", "dead-1", "dead-0"]
    rows = {n["name"]: n for n in client.get("/api/v1/nodes", headers=VIEWER_H).json()["nodes"]}
    assert rows["dying"]["working_set_pct"] == 99.2 and rows["dying"]["alerts"] == 1
    assert rows["dead-2"]["status"] == "offline" and rows["dead-2"]["oom_kills_24h"] == 7
    assert rows["dead-2"]["offline_since"] == rows["dead-2"]["last_seen"] and rows["dying"]["offline_since"] is None
    assert names(client, "sort=-risk") == ["dead-0", "dead-1", "dead-2", "blind", "calm", "middling", "dying"]


# -- gate events: refused nodes --------------------------------------------------------------------

GATE_FAIL: dict[str, Any] = {
    "event": "gate",
    "step": "plan",
    "passed": False,
    "exit_code": 3,
    "message": "plan: 0 jobs of 24 GiB fit the 15.6 GiB budget (16 GiB limit, cgroup-v2)",
    "time": "2027-01-01T00:00:00.000Z",
}


def test_a_failed_gate_refuses_the_node_until_a_start_or_a_passed_gate(client: TestClient, clock: Clock) -> None:
    report(client, "r", at(100 * MiB))  # the entrypoint's one-shot report, then its gate event
    event(client, "r", **GATE_FAIL)
    refused_at = clock.t
    row = node(client, "r")
    assert row["status"] == "refused" and row["refused"] == {
        "since": iso(refused_at),
        "step": "plan",
        "exit_code": 3,
        "message": GATE_FAIL["message"],
    }
    [alert] = alerts_of(client, "r", "refused")
    assert alert["severity"] == "critical" and alert["since"] == iso(refused_at)
    assert alert["message"] == f"the entrypoint's gate refused the node at plan, exit 3: {GATE_FAIL['message']}"
    assert names(client, "status=refused") == ["r"]
    assert client.get("/api/v1/nodes?status=refused", headers=VIEWER_H).json()["total"] == 1
    assert sample(metrics(client), "oomguard_nodes", 'state="refused"') == 1
    assert sample(metrics(client), "oomguard_node_up", 'node="r"') == 0
    assert row["events"][0]["event"] == "gate" and row["events"][0]["passed"] is False
    clock.t += HOUR_MS  # still refused an hour later (its container is gone: nothing else comes)
    assert node(client, "r")["status"] == "refused" and alerts_of(client, "r", "offline") == []
    event(client, "r", event="gate", step="plan", passed=True, exit_code=0, message="plan: 2 jobs fit")
    assert node(client, "r")["status"] != "refused" and alerts_of(client, "r", "refused") == []
    assert sample(metrics(client), "oomguard_nodes", 'state="refused"') == 0
    event(client, "r", **GATE_FAIL)
    assert node(client, "r")["status"] == "refused"
    event(client, "r", event="start", pid=5, concurrency=2)  # a worker started: not refused
    assert node(client, "r")["status"] == "online"


@pytest.mark.parametrize(
    "bad",
    [
        {"event": "gate", "passed": False},  # no step
        {"event": "gate", "step": "plan"},  # no passed
        {"event": "gate", "step": "probe", "passed": False},
        {"event": "gate", "step": "plan", "passed": "no"},
        {"event": "gate", "step": "plan", "passed": False, "exit_code": 2**40},
        {"event": "gate", "step": "plan", "passed": False, "message": "x" * 4001},
    ],
)
def test_a_bad_gate_event_is_422_with_a_reason(client: TestClient, bad: dict[str, Any]) -> None:
    r = client.post("/api/v1/events", json={"node": "g", "id": uuid.uuid4().hex, "event": bad}, headers=AGENT_H)
    assert r.status_code == 422 and r.json()["detail"][0]["msg"], r.text


def test_a_gate_message_of_4000_characters_is_kept_whole(client: TestClient) -> None:
    event(client, "long", **{**GATE_FAIL, "message": "é" * 4000})
    assert node(client, "long")["refused"]["message"] == "é" * 4000


# -- labels ---------------------------------------------------------------------------------------


def test_labels_are_kept_filtered_on_and_on_one_info_series(client: TestClient, clock: Clock) -> None:
    report(client, "a", at(100 * MiB), labels={"provider": "vast", "instance": "C.123", "node": "k8s-7"})
    report(client, "b", at(100 * MiB), labels={"provider": "aws"})
    report(client, "c", at(100 * MiB))
    event(client, "d", labels={"provider": "vast"}, event="start", concurrency=1)
    assert node(client, "a")["labels"] == {"instance": "C.123", "node": "k8s-7", "provider": "vast"}
    assert node(client, "c")["labels"] == {}
    assert names(client, "sort=name&label=provider=vast") == ["a", "d"]
    assert names(client, "label=instance=C.123") == ["a"]
    assert names(client, "label=provider=gcp") == []
    report(client, "a", at(100 * MiB))  # no labels sent: the node keeps its latest
    assert names(client, "sort=name&label=provider=vast") == ["a", "d"]
    report(client, "a", at(100 * MiB), labels={"provider": "aws"})  # new labels replace the old
    assert names(client, "sort=name&label=provider=aws") == ["a", "b"] and names(client, "label=instance=C.123") == []
    text = metrics(client)
    info = sorted(line for line in text.splitlines() if line.startswith("oomguard_node_info{"))
    assert info == [
        'oomguard_node_info{node="a",provider="aws"} 1.0',
        'oomguard_node_info{node="b",provider="aws"} 1.0',
        'oomguard_node_info{node="c"} 1.0',
        'oomguard_node_info{node="d",provider="vast"} 1.0',
    ]
    assert 'provider="' not in "\n".join(
        line for line in text.splitlines() if not line.startswith("oomguard_node_info")
    )
    report(client, "e", at(1), labels={"node": "k8s-7", "zone": 'eu "1"'})  # a label named node is exported_node
    assert 'oomguard_node_info{exported_node="k8s-7",node="e",zone="eu \\"1\\""} 1.0' in metrics(client)


@pytest.mark.parametrize(
    "labels",
    [
        {"__name__": "x"},
        {"1abc": "x"},
        {"a-b": "x"},
        {"a": "x" * 257},
        {"a": "line\nbreak"},
        {"k" + "x" * 63: "v"},
        {f"k{i}": "v" for i in range(17)},
        {"a": 1},
        ["a", "b"],
    ],
)
def test_bad_labels_are_422_on_reports_and_events(client: TestClient, labels: Any) -> None:
    r = client.post("/api/v1/reports", json=envelope("n", at(1), labels=labels), headers=AGENT_H)
    assert r.status_code == 422, r.text
    body = {"node": "n", "id": uuid.uuid4().hex, "event": {"event": "start"}, "labels": labels}
    assert client.post("/api/v1/events", json=body, headers=AGENT_H).status_code == 422


def test_sixteen_labels_of_the_longest_are_taken(client: TestClient) -> None:
    labels = {f"k{i:02d}" + "x" * 60: "v" * 256 for i in range(16)}
    report(client, "n", at(1), labels=labels)
    assert node(client, "n")["labels"] == labels
    assert names(client, f"label={next(iter(labels))}={'v' * 256}") == ["n"]


@pytest.mark.parametrize("bad", ["novalue", "=x", "1a=b", "a b=c", "a=" + "v" * 257])
def test_a_bad_label_filter_is_422(client: TestClient, bad: str) -> None:
    r = client.get("/api/v1/nodes", params={"label": bad}, headers=VIEWER_H)
    assert r.status_code == 422 and "KEY=VALUE" in r.text


# -- last seen, run-only limits, the timeline ------------------------------------------------------


def test_events_and_heartbeats_count_for_last_seen(client: TestClient, clock: Clock) -> None:
    report(client, "n", at(100 * MiB))
    reported = clock.t
    clock.t += 9 * MIN_MS
    event(client, "n", event="heartbeat", interval_s=60)
    row = node(client, "n")
    assert row["status"] == "online" and row["last_seen"] == iso(clock.t) and row["last_report"] == iso(reported)
    assert row["current"] is False and row["working_set_pct"] is None and row["last_working_set_pct"] == 19.5
    assert sample(metrics(client), "oomguard_node_last_seen_timestamp_seconds", 'node="n"') == clock.t / 1000
    assert sample(metrics(client), "oomguard_memory_working_set_bytes", 'node="n"') is None  # history, not a reading


def test_a_run_only_node_takes_its_limit_and_budget_from_its_start_event(client: TestClient) -> None:
    start: dict[str, Any] = {
        "event": "start",
        "pid": 9,
        "concurrency": 3,
        "budget_bytes": 3 << 30,
        "effective_bytes": 4 << 30,
    }
    event(client, "runner", **start, limited_by="cgroup-v2")
    row = node(client, "runner")
    assert (row["status"], row["effective_bytes"], row["budget_bytes"], row["limited_by"]) == (
        "run-only",
        4 << 30,
        3 << 30,
        "cgroup-v2",
    )
    report(client, "runner", at(100 * MiB))  # a report is the truth from then on ...
    event(client, "runner", **start)  # ... which a later start does not overwrite
    row = node(client, "runner")
    assert (row["effective_bytes"], row["budget_bytes"]) == (LIMIT, 500 * MiB)


def test_the_timeline_is_paged(client: TestClient) -> None:
    for k in range(30):
        event(client, "busy", event="exit", reason="exit", exit_code=k + 1)
    first = client.get("/api/v1/nodes/busy/events", headers=VIEWER_H).json()
    assert (first["total"], first["limit"], first["offset"], len(first["events"])) == (30, 25, 0, 25)
    assert [e["exit_code"] for e in first["events"]][:2] == [30, 29]  # newest first
    rest = client.get("/api/v1/nodes/busy/events?offset=25", headers=VIEWER_H).json()["events"]
    assert [e["exit_code"] for e in rest] == [5, 4, 3, 2, 1]
    assert client.get("/api/v1/nodes/nobody/events", headers=VIEWER_H).status_code == 404
    assert client.get("/api/v1/nodes/busy/events?limit=0", headers=VIEWER_H).status_code == 422
    assert node(client, "busy")["events_total"] == 30


# -- the supervisor's state ------------------------------------------------------------------------


def test_the_supervisors_state_from_its_events(client: TestClient, clock: Clock) -> None:
    rep = at(100 * MiB)
    rep["plan"] = {"concurrency": 3}
    report(client, "s", rep)
    assert node(client, "s")["supervisor"] is None  # an agent alone: no supervisor
    event(client, "s", event="start", pid=1, concurrency=3)
    sv = node(client, "s")["supervisor"]
    assert (sv["state"], sv["jobs"], sv["planned"], sv["stepped_down"], sv["last_exit"]) == (
        "running",
        3,
        3,
        False,
        None,
    )
    clock.t += 1000
    event(client, "s", event="exit", reason="oom-kill", signal=9, message="peak 500 MiB at the 512 MiB limit")
    exited_at = clock.t
    assert node(client, "s")["supervisor"]["state"] == "exited"
    event(client, "s", event="restart", reason="oom-kill", delay_s=4.0, message="after an OOM kill: concurrency 3 -> 2")
    clock.t += 1500
    sv = node(client, "s")["supervisor"]
    assert sv["state"] == "restarting" and sv["restart_in_s"] == pytest.approx(2.5)
    assert sv["after"] == {"reason": "oom-kill", "message": "after an OOM kill: concurrency 3 -> 2"}
    clock.t += 2500
    event(client, "s", event="start", pid=2, concurrency=2)
    sv = node(client, "s")["supervisor"]
    assert (sv["state"], sv["jobs"], sv["planned"], sv["stepped_down"]) == ("running", 2, 3, True)
    assert sv["why"] == "after an OOM kill: concurrency 3 -> 2"
    assert sv["last_exit"] == {
        "reason": "oom-kill",
        "time": iso(exited_at),
        "exit_code": None,
        "signal": 9,
        "message": "peak 500 MiB at the 512 MiB limit",
    }
    event(client, "s", event="exit", reason="exit", exit_code=1)
    event(client, "s", event="give-up", reason="exit", message="10 restarts within 10m")
    sv = node(client, "s")["supervisor"]
    assert sv["state"] == "gave-up" and sv["after"]["message"] == "10 restarts within 10m"
    assert sv["last_exit"]["exit_code"] == 1 and sv["current"] is True
    clock.t += HOUR_MS  # silent: the state is the last known
    assert node(client, "s")["supervisor"]["current"] is False
    event(client, "s", event="stop", reason="signal", signal=15)
    assert node(client, "s")["supervisor"]["state"] == "stopped"


def test_a_run_only_nodes_planned_jobs_are_its_largest_start(client: TestClient) -> None:
    event(client, "r", event="start", concurrency=4)
    event(client, "r", event="exit", reason="oom-kill")
    event(client, "r", event="restart", reason="oom-kill", delay_s=1, message="after an OOM kill: concurrency 4 -> 3")
    event(client, "r", event="start", concurrency=3)
    sv = node(client, "r")["supervisor"]
    assert (sv["jobs"], sv["planned"], sv["stepped_down"]) == (3, 4, True)


def test_the_alert_is_on_metrics_as_its_start_time(client: TestClient, clock: Clock) -> None:
    report(client, "n", at(500 * MiB))
    began = clock.t
    clock.t += 30_000
    report(client, "n", at(501 * MiB))
    report(client, "ok", at(10 * MiB))
    text = metrics(client)
    assert sample(text, "oomguard_memory_working_set_high_since_timestamp_seconds", 'node="n"') == began / 1000
    assert sample(text, "oomguard_memory_working_set_high_since_timestamp_seconds", 'node="ok"') is None
