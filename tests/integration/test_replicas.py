"""Two manager processes on one PostgreSQL, agents spread across them: nothing lost, nothing stored
twice, the schema migrated once, and the same answers from either replica."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import func, select, text

from oomguard.manager.db import alembic_config, events, make_engine, reports
from tests.conftest import REPO
from tests.helpers.manager import AGENT, AGENT_H, VIEWER_H, ManagerProcess, envelope, fixture_report, pg_or_skip
from tests.helpers.pg import PostgresServer

AGENTS, ROUNDS, RACED, RACED_EVENTS = 6, 2, 200, 20
ADMIN = "admin-secret-token"


@pytest.fixture(scope="module")
def pg() -> PostgresServer:
    return pg_or_skip()


def call(port: int, method: str, path: str, body: Any = None, conn: http.client.HTTPConnection | None = None) -> Any:
    own = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {**(AGENT_H if method == "POST" else VIEWER_H), "Content-Type": "application/json"}
    own.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    resp = own.getresponse()
    data = resp.read()
    if conn is None:
        own.close()
    assert resp.status == 200, (path, resp.status, data[:300])
    return data.decode() if path == "/metrics" else json.loads(data)


def start_together(managers: list[ManagerProcess]) -> None:
    """Start every manager at once on a fresh database: each migrates, under the advisory lock."""
    failures: list[BaseException] = []

    def start(m: ManagerProcess) -> None:
        try:
            m.start()
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=start, args=(m,)) for m in managers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def run_agents(managers: list[ManagerProcess], tmp_path: Path, round_no: int) -> None:
    """AGENTS real agent processes (``--once``), agent i to replica (i + round) mod 2, all at once."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("OOMGUARD_BUDGET", None)
    procs = []
    for i in range(AGENTS):
        m = managers[(i + round_no) % len(managers)]
        args = ["--manager", m.url, "--token", AGENT, "--node", f"agent-{i}", "--once", "--no-gpu"]
        cmd = [sys.executable, "-m", "oomguard", "agent", *args, "--spool", str(tmp_path / f"spool-{i}")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()


def race(managers: list[ManagerProcess], path: str, bodies: list[dict[str, Any]]) -> list[list[bool]]:
    """Each body to every replica at the same moment (a barrier per body); the ``stored`` answers."""
    barrier = threading.Barrier(len(managers), timeout=30)
    answers: list[list[bool]] = [[] for _ in managers]
    failures: list[BaseException] = []

    def send(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", managers[k].port, timeout=30)
        try:
            for body in bodies:
                barrier.wait()
                answers[k].append(call(managers[k].port, "POST", path, body, conn)["stored"])
        except BaseException as exc:  # reported in the test's thread; the other side stops at the barrier
            failures.append(exc)
            barrier.abort()
        finally:
            conn.close()

    threads = [threading.Thread(target=send, args=(k,)) for k in range(len(managers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, [f for f in failures if not isinstance(f, threading.BrokenBarrierError)] or failures
    return answers


def node_series(metrics: str) -> list[str]:
    return sorted(line for line in metrics.splitlines() if 'node="' in line and not line.startswith("#"))


def forget_on_one_report_to_the_other(managers: list[ManagerProcess]) -> None:
    """Replica 0 forgets nodes that replica 1's writer has cached: replica 1's next heartbeat,
    report and event of them still land (a failed batch or an update of no row clears the
    cache), as new nodes."""
    for node in ("agent-1", "agent-3"):
        conn = http.client.HTTPConnection("127.0.0.1", managers[0].port, timeout=30)
        conn.request("DELETE", f"/api/v1/nodes/{node}", headers={"Authorization": f"Bearer {ADMIN}"})
        assert conn.getresponse().status == 204
        conn.close()
    heartbeat = {"node": "agent-3", "id": uuid.uuid4().hex, "event": {"event": "heartbeat", "interval_s": 60}}
    assert call(managers[1].port, "POST", "/api/v1/events", heartbeat)["stored"]
    assert call(managers[0].port, "GET", "/api/v1/nodes/agent-3")["status"] == "run-only"  # anew, from its heartbeat
    assert call(managers[1].port, "POST", "/api/v1/reports", envelope("agent-1", fixture_report()))["stored"]
    event = {"node": "agent-1", "id": uuid.uuid4().hex, "event": {"event": "start", "pid": 1}}
    assert call(managers[1].port, "POST", "/api/v1/events", event)["stored"]
    detail = call(managers[0].port, "GET", "/api/v1/nodes/agent-1")
    assert detail["history_count"] == 1 and len(detail["events"]) == 1


def test_two_replicas_on_one_postgresql(pg: PostgresServer, tmp_path: Path) -> None:
    url = pg.create_db("replicas_" + uuid.uuid4().hex[:8])
    managers = [ManagerProcess(url, env={"OOMGUARD_ADMIN_TOKEN": ADMIN}) for _ in range(2)]
    try:
        start_together(managers)
        engine = make_engine(url)
        head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
        with engine.connect() as conn:  # migrated once: one version row, at the head
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head]
        for round_no in range(ROUNDS):
            run_agents(managers, tmp_path, round_no)
        raced = [envelope("raced", fixture_report(budget="500GiB"), interval_s=30) for _ in range(RACED)]
        a, b = race(managers, "/api/v1/reports", raced)
        assert all(x != y for x, y in zip(a, b, strict=True))  # each id: stored by one replica, "seen" by the other
        oom = {"event": "exit", "reason": "oom-kill", "signal": 9}
        raced_events = [{"node": "raced", "id": f"oom-{k}", "event": oom} for k in range(RACED_EVENTS)]
        ea, eb = race(managers, "/api/v1/events", raced_events)
        assert sum(ea) + sum(eb) == RACED_EVENTS and all(x != y for x, y in zip(ea, eb, strict=True))
        with engine.connect() as conn:  # exactly what was sent, once each
            assert conn.execute(select(func.count(reports.c.id))).scalar_one() == AGENTS * ROUNDS + RACED
            assert conn.execute(select(func.count(events.c.id))).scalar_one() == RACED_EVENTS
        engine.dispose()
        answers = [
            (
                call(m.port, "GET", "/api/v1/nodes?limit=1000"),
                call(m.port, "GET", "/api/v1/alerts"),
                node_series(call(m.port, "GET", "/metrics")),
            )
            for m in managers
        ]
        assert answers[0] == answers[1]  # either replica: the same nodes, alerts and metrics
        listing, alerts, _ = answers[0]
        assert listing["total"] == AGENTS + 1
        for i in range(AGENTS):
            detail = call(managers[i % 2].port, "GET", f"/api/v1/nodes/agent-{i}")
            assert detail["history_count"] == ROUNDS and detail["status"] == "online"
            assert detail["clock_skew_s"] is not None and abs(detail["clock_skew_s"]) < 60
        kinds = {(x["node"], x["kind"]) for x in alerts["alerts"]}
        assert {("raced", "budget-from-host"), ("raced", "oom-kills")} <= kinds
        raced_node = call(managers[1].port, "GET", "/api/v1/nodes/raced")
        assert raced_node["history_count"] == RACED and raced_node["oom_kills_24h"] == RACED_EVENTS
        forget_on_one_report_to_the_other(managers)
    finally:
        for m in managers:
            m.stop()
