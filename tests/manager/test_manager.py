"""The fleet manager's API against a real SQLite file and a real PostgreSQL server."""

from __future__ import annotations

import http.client
import json
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text

from oomguard.errors import UsageError
from oomguard.manager.app import create_app
from oomguard.manager.db import current_revision, make_engine, migrate, reports
from oomguard.manager.settings import Settings
from tests.conftest import REPO
from tests.helpers.manager import (
    AGENT_H,
    VIEWER,
    VIEWER_H,
    GiB,
    ManagerProcess,
    db_url_of,
    envelope,
    fixture_report,
    local_client,
    pg_or_skip,
)
from tests.helpers.pg import PostgresServer
from tests.helpers.wait import wait_until


@pytest.fixture(scope="session")
def pg() -> PostgresServer:
    return pg_or_skip()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return db_url_of(request.param, tmp_path, "t_")


def make_client(db_url: str, **settings: Any) -> TestClient:
    migrate(db_url)
    s = Settings(db_url=db_url, agent_token="agent-secret-token", viewer_token=VIEWER, **settings)
    client: TestClient = local_client(create_app(s))
    return client


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with make_client(db_url) as c:
        yield c


def post(c: TestClient, body: dict[str, Any], path: str = "/api/v1/reports") -> Any:
    return c.post(path, json=body, headers=AGENT_H)


def test_ingest_list_detail_and_idempotency(client: TestClient) -> None:
    report = fixture_report()
    body = envelope("vast-C.123", report, interval_s=30)
    first, second = post(client, body), post(client, body)
    assert first.status_code == second.status_code == 200
    assert first.json() == {"stored": True, "id": body["id"]} and second.json()["stored"] is False
    post(client, envelope("other-node", fixture_report("docker_v2_private_ns_limit_512m")))
    nodes = client.get("/api/v1/nodes", headers=VIEWER_H).json()
    assert nodes["total"] == 2 and [n["name"] for n in nodes["nodes"]] == ["other-node", "vast-C.123"]
    n = nodes["nodes"][1]
    assert n["effective_bytes"] == 342 * GiB and n["host_total_bytes"] == 527958056 * 1024
    assert n["budget_bytes"] == 332 * GiB and n["limited_by"] == "cgroup-v2" and n["status"] == "online"
    detail = client.get("/api/v1/nodes/vast-C.123", headers=VIEWER_H).json()
    assert len(detail["history"]) == 1  # the duplicate was stored once
    assert detail["latest"]["memory"]["effective_bytes"] == 342 * GiB
    assert detail["latest"]["memory"]["cgroup"]["path"] == report["memory"]["cgroup"]["path"]  # the whole report
    assert client.get("/api/v1/nodes/nope", headers=VIEWER_H).status_code == 404


@pytest.mark.slow
def test_filters_sorting_and_paging(client: TestClient) -> None:
    small = fixture_report("docker_v2_private_ns_limit_512m")
    for i in range(12):
        post(client, envelope(f"gpu-{i:02d}", small))
    post(client, envelope("big", fixture_report()))
    page = client.get("/api/v1/nodes?q=gpu-&limit=5&offset=5&sort=-name", headers=VIEWER_H).json()
    assert page["total"] == 12 and [n["name"] for n in page["nodes"]] == [f"gpu-{i:02d}" for i in (6, 5, 4, 3, 2)]
    top = client.get("/api/v1/nodes?sort=-effective_bytes&limit=1", headers=VIEWER_H).json()
    assert top["nodes"][0]["name"] == "big"
    assert client.get("/api/v1/nodes?status=offline", headers=VIEWER_H).json()["total"] == 0
    assert client.get("/api/v1/nodes?q=%25", headers=VIEWER_H).json()["total"] == 0  # LIKE wildcards are escaped
    from oomguard.manager.store import SORT_KEYS

    for key in SORT_KEYS:
        for sort in (key, "-" + key):
            r = client.get(f"/api/v1/nodes?sort={sort}&status=online", headers=VIEWER_H)
            assert r.status_code == 200 and r.json()["total"] == 13, sort
    for bad in ("sort=size;drop", "limit=0", "limit=100000", "status=dead", "offset=-1"):
        assert client.get(f"/api/v1/nodes?{bad}", headers=VIEWER_H).status_code == 422, bad


def test_offline_after_three_missed_intervals(db_url: str) -> None:
    with make_client(db_url) as c:
        post(c, envelope("slow", fixture_report(), interval_s=0.25))  # offline after 0.75 s
        assert c.get("/api/v1/nodes?status=online", headers=VIEWER_H).json()["total"] == 1
        offline = lambda: [n["name"] for n in c.get("/api/v1/nodes?status=offline", headers=VIEWER_H).json()["nodes"]]  # noqa: E731
        assert wait_until(offline, interval=0.05, what="the node listed offline") == ["slow"]
        kinds = {a["kind"] for a in c.get("/api/v1/alerts", headers=VIEWER_H).json()["alerts"]}
        assert "offline" in kinds
        assert 'oomguard_node_up{node="slow"} 0.0' in c.get("/metrics", headers=VIEWER_H).text


def test_alerts_and_metrics(client: TestClient) -> None:
    host_sized = fixture_report(budget="500GiB")  # the original failure: 342 GiB container, budget from the host
    post(client, envelope("outage", host_sized))
    over = fixture_report("docker_v2_private_ns_limit_512m", budget="600MiB")
    post(client, envelope("over", over))
    pinned = fixture_report()
    pinned["warnings"].append({"code": "memlock-too-low", "message": "plan pins 4 GiB"})
    post(client, envelope("pinned", pinned))
    post(client, envelope("fine", fixture_report()))
    exit_event = {"event": "exit", "reason": "oom-kill", "signal": 9, "pid": 42, "budget_bytes": GiB}
    # Each OOM kill is followed by a restart event carrying the same reason (issue #14: counted twice).
    restart_event = {"event": "restart", "reason": "oom-kill", "delay_s": 1.0, "budget_bytes": GiB}
    for event in (exit_event, restart_event, exit_event, restart_event):
        assert post(client, {"node": "fine", "id": uuid.uuid4().hex, "event": event}, "/api/v1/events").json()["stored"]
    alerts = {(a["node"], a["kind"]) for a in client.get("/api/v1/alerts", headers=VIEWER_H).json()["alerts"]}
    assert alerts == {
        ("outage", "budget-from-host"),
        ("over", "budget-above-limit"),
        ("pinned", "memlock-below-pinned-need"),
        ("fine", "oom-kills"),
    }
    nodes = {n["name"]: n for n in client.get("/api/v1/nodes", headers=VIEWER_H).json()["nodes"]}
    assert nodes["fine"]["oom_kills_24h"] == 2 and nodes["outage"]["oom_kills_24h"] == 0
    metrics = client.get("/metrics", headers=VIEWER_H).text
    for line in (
        'oomguard_memory_effective_bytes{node="fine"} 3.67219703808e+11',
        'oomguard_budget_bytes{node="outage"} 5.36870912e+11',
        'oomguard_oom_kills_total{node="fine"} 2.0',
        'oomguard_node_up{node="fine"} 1.0',
        'oomguard_memlock_soft_bytes{node="fine"}',
        "# TYPE oomguard_node_last_seen_timestamp_seconds gauge",
        "oomguard_memory_host_total_bytes{node=",
    ):
        assert line in metrics, line
    events = client.get("/api/v1/nodes/fine", headers=VIEWER_H).json()["events"]
    assert [e["reason"] for e in events] == ["oom-kill"] * 4
    assert [
        a["message"] for a in client.get("/api/v1/alerts", headers=VIEWER_H).json()["alerts"] if a["node"] == "fine"
    ] == ["2 OOM kill(s) in the last hour"]


# Retention by receive time (thinning per clock hour, OOM kills expire, their counts stay) is tested with a
# controlled clock in tests/manager/test_retention.py; agent-stamped times no longer decide it.


@pytest.mark.parametrize(
    "body",
    [
        "{not json",
        json.dumps({"node": "n", "id": "x"}),
        json.dumps({"node": "bad name", "id": "x", "report": {"schema_version": 1, "memory": {}}}),
        json.dumps({"node": "n'; DROP TABLE nodes;--", "id": "x", "report": {"schema_version": 1, "memory": {}}}),
        json.dumps({"node": "ünïcode", "id": "x", "report": {"schema_version": 1, "memory": {}}}),
        json.dumps({"node": "n" * 129, "id": "x", "report": {"schema_version": 1, "memory": {}}}),
        json.dumps({"node": "n", "id": "x", "report": {"schema_version": 1, "memory": {"effective_bytes": -1}}}),
        json.dumps({"node": "n", "id": "x", "report": {"schema_version": 1, "memory": {"effective_bytes": 2**64}}}),
        json.dumps({"node": "n", "id": "x", "report": {"schema_version": 1, "memory": {}}, "interval_s": "NaN"}),
        '{"node": "n", "id": "x", "report": {"schema_version": 1, "memory": {}, "extra": NaN}}',
        json.dumps({"node": "n", "id": "x", "report": {"schema_version": 1, "memory": {}}, "unknown": 1}),
        json.dumps(
            {
                "node": "n",
                "id": "x",
                "report": {"schema_version": 1, "memory": {}, "container": {"runtime": "\u0000evil"}},
            }
        ),
        json.dumps([1, 2, 3]),
    ],
)
def test_bad_bodies_are_422_never_500(client: TestClient, body: str) -> None:
    r = client.post("/api/v1/reports", content=body, headers={**AGENT_H, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert client.get("/api/v1/nodes", headers=VIEWER_H).json()["total"] == 0


def test_tokens(db_url: str) -> None:
    with make_client(db_url) as c:
        body = envelope("n", fixture_report())
        assert c.post("/api/v1/reports", json=body).status_code == 401
        assert c.post("/api/v1/reports", json=body, headers=VIEWER_H).status_code == 401  # a viewer cannot write
        assert (
            c.post("/api/v1/reports", json=body, headers={"Authorization": "Bearer agent-secret-tokeN"}).status_code
            == 401
        )
        assert c.post("/api/v1/reports", json=body, headers=AGENT_H).status_code == 200
        for path in ("/api/v1/nodes", "/api/v1/nodes/n", "/api/v1/alerts", "/metrics"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers=AGENT_H).status_code == 401, path  # an agent cannot read
            assert c.get(path, headers=VIEWER_H).status_code == 200, path
        assert c.get("/healthz").json() == {"status": "ok", "database": "ok", "failing": {}}
        assert c.get("/openapi.json").json()["info"]["title"] == "oomguard manager"


def test_non_loopback_needs_both_tokens_of_16_characters() -> None:
    a, v = "a" * 16, "v" * 16
    with pytest.raises(UsageError, match=r"refusing to listen on 0\.0\.0\.0"):
        Settings(host="0.0.0.0", agent_token=a).check()
    Settings(host="0.0.0.0", agent_token=a, viewer_token=v).check()
    with pytest.raises(UsageError, match=r"^--viewer-token: at least 16 characters off loopback \(got 15\)"):
        Settings(host="0.0.0.0", agent_token=a, viewer_token="v" * 15).check()
    with pytest.raises(UsageError, match=r"^--agent-token: only visible ASCII"):
        Settings(host="0.0.0.0", agent_token=a + " x", viewer_token=v).check()
    Settings(host="127.0.0.1", agent_token="a", viewer_token="v").check()  # loopback: any length
    Settings(host="127.0.0.1").check()
    Settings(host="::1").check()


def test_upgrade_from_the_first_revision_keeps_data(db_url: str) -> None:
    migrate(db_url, "0001")
    engine = make_engine(db_url)
    assert current_revision(engine) == "0001"
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO nodes (name, first_seen_ms, last_seen_ms, effective_bytes, budget_bytes, "
                "warnings, latest_report) VALUES ('old-node', 1, :t, 100, 90, '[]', '{\"schema_version\": 1}')"
            ),
            {"t": int(time.time() * 1000)},
        )
        conn.execute(
            text(
                "INSERT INTO reports (node_id, ingest_id, received_ms, effective_bytes, budget_bytes) "
                "SELECT id, 'r-1', :t, 100, 90 FROM nodes"
            ),
            {"t": int(time.time() * 1000)},
        )
        conn.execute(
            text(
                "INSERT INTO events (node_id, ingest_id, received_ms, kind, reason, body) "
                "SELECT id, 'e-1', :t, 'exit', 'oom-kill', '{\"event\": \"exit\"}' FROM nodes"
            ),
            {"t": int(time.time() * 1000)},
        )
    migrate(db_url)
    from alembic.script import ScriptDirectory

    from oomguard.manager.db import alembic_config

    assert current_revision(engine) == ScriptDirectory.from_config(alembic_config(db_url)).get_current_head()
    with local_client(create_app(Settings(db_url=db_url))) as c:
        node = c.get("/api/v1/nodes/old-node").json()
        assert node["effective_bytes"] == 100 and node["oom_kills_24h"] == 1
        assert node["history"] == [
            {
                "time": node["history"][0]["time"],
                "effective_bytes": 100,
                "budget_bytes": 90,
                "usage_bytes": None,
                "working_set_bytes": None,
            }
        ]
        assert c.post("/api/v1/reports", json=envelope("old-node", fixture_report())).status_code == 200
        assert len(c.get("/api/v1/nodes/old-node").json()["history"]) == 2
        again = {"node": "old-node", "id": "r-1", "report": fixture_report()}
        assert c.post("/api/v1/reports", json=again).json()["stored"] is False  # ids stored before still deduplicate
        other = {"node": "n", "id": "r-1", "report": fixture_report()}
        assert c.post("/api/v1/reports", json=other).json()["stored"] is True  # per node since revision 0011
        assert 'oomguard_oom_kills_total{node="old-node"} 1.0' in c.get("/metrics").text  # counted by 0011


def test_the_tables_are_the_head_revisions(db_url: str) -> None:
    """``db/tables.py`` declares what the migrations build, every column in its table's one
    declaration (Alembic's autogenerate comparison finds nothing to change), with the revision ids
    databases already carry."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from oomguard.manager.db import alembic_config, metadata

    migrate(db_url)
    engine = make_engine(db_url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata) == []
    revisions = [r.revision for r in ScriptDirectory.from_config(alembic_config(db_url)).walk_revisions()]
    assert revisions == [f"{i:04d}" for i in range(14, 0, -1)]  # the newest first
    engine.dispose()


def test_row_ids_go_past_the_32_bit_range(db_url: str) -> None:
    """Revision 0008: ``reports`` and ``events`` (and ``observations``) take ids past 2^31 - 1,
    where a serial sequence stopped ("nextval: reached maximum value"). The next id is put just
    below that line, as weeks of a large fleet's reports would leave it, and the reports and
    events that follow are stored past it."""
    line = 2**31 - 1
    with make_client(db_url) as c:

        def event() -> dict[str, Any]:
            return {"node": "big", "id": uuid.uuid4().hex, "event": {"event": "start", "concurrency": 1}}

        assert c.post("/api/v1/reports", json=envelope("big", fixture_report()), headers=AGENT_H).json()["stored"]
        assert c.post("/api/v1/events", json=event(), headers=AGENT_H).json()["stored"]
        engine = make_engine(db_url)
        with engine.begin() as conn:
            for table in ("reports", "events"):
                if conn.dialect.name == "postgresql":  # the sequence's next value: the line
                    conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), {line - 1})"))
                else:  # SQLite's next rowid is one past the largest
                    conn.execute(text(f"UPDATE {table} SET id = {line - 1}"))
        engine.dispose()
        for _ in range(2):
            assert c.post("/api/v1/reports", json=envelope("big", fixture_report()), headers=AGENT_H).json()["stored"]
            assert c.post("/api/v1/events", json=event(), headers=AGENT_H).json()["stored"]
        detail = c.get("/api/v1/nodes/big", headers=VIEWER_H).json()
        assert len(detail["history"]) == 3 and len(detail["events"]) == 3
    with make_engine(db_url).connect() as conn:
        for table in ("reports", "events"):
            top = conn.execute(text(f"SELECT max(id) FROM {table}")).scalar()
            assert top == line + 1, (table, top)


@pytest.mark.slow
def test_oversized_body_gets_413_on_the_wire(db_url: str) -> None:
    server = ManagerProcess(db_url, "--max-body", "4KiB").start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        body = json.dumps(envelope("n", fixture_report())).encode() + b" " * 100_000
        conn.request("POST", "/api/v1/reports", body=body, headers={**AGENT_H, "Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 413  # a status, not a connection reset
        conn.close()
    finally:
        server.stop()


@pytest.mark.slow
def test_kill_9_loses_no_acknowledged_report(db_url: str) -> None:
    server = ManagerProcess(db_url).start()
    acked: list[str] = []
    failed: list[str] = []  # requests that got no answer (the server gone)
    stop = threading.Event()
    report = json.dumps(fixture_report())

    def stream() -> None:
        while not stop.is_set():
            rid = uuid.uuid4().hex
            body = f'{{"node": "crashy", "id": "{rid}", "report": {report}}}'.encode()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
                conn.request(
                    "POST", "/api/v1/reports", body=body, headers={**AGENT_H, "Content-Type": "application/json"}
                )
                if conn.getresponse().status == 200:
                    acked.append(rid)
                conn.close()
            except (OSError, http.client.HTTPException) as exc:
                failed.append(type(exc).__name__)
                time.sleep(0.01)

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= 60, what="60 acknowledged reports")
    before = len(failed)
    server.kill9()  # in the middle of the stream
    wait_until(lambda: len(failed) > before, what="the stream to meet the killed server")
    stop.set()
    for t in threads:
        t.join(10)
    assert len(acked) >= 60
    server2 = ManagerProcess(db_url).start()  # the restart
    try:
        with make_engine(db_url).connect() as conn:
            stored = set(conn.execute(select(reports.c.ingest_id)).scalars())
        missing = set(acked) - stored
        assert not missing, f"{len(missing)} acknowledged reports were lost"
    finally:
        server2.stop()


def test_dashboard_pages_need_the_viewer_token(tmp_path: Path) -> None:
    with make_client(f"sqlite:///{tmp_path / 'd.db'}") as c:
        post(c, envelope("n1", fixture_report()))
        r = c.get("/nodes/n1?x=1", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/login?next=/nodes/n1%3Fx%3D1"
        assert c.get("/", headers=AGENT_H, follow_redirects=False).status_code == 303  # an agent cannot read
        assert c.get("/", headers=VIEWER_H).status_code == 200
        bad = c.post("/login", content="token=nope&next=/", follow_redirects=False)
        assert bad.status_code == 200 and "not valid" in bad.text and "set-cookie" not in bad.headers
        ok = c.post("/login", content=f"token={VIEWER}&next=//evil.example/", follow_redirects=False)
        assert ok.status_code == 303 and ok.headers["location"] == "/"  # never off-site after login
        cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "max-age=43200" in cookie
        assert VIEWER.lower() not in cookie  # a signed session, not the token
        page = c.get("/nodes/n1")  # the cookie from /login
        assert page.status_code == 200 and "342 GiB" in page.text
        assert c.get("/api/v1/nodes/n1").status_code == 200  # the raw JSON link works with the cookie too
        assert c.get("/nodes/nope").status_code == 404 and c.get("/nodes/bad%20name").status_code == 404
        assert "server-timing" in page.headers and "script-src 'self'" in page.headers["content-security-policy"]
        fragment = c.get("/?fragment=1").text
        assert fragment.lstrip().startswith('<section class="cards">') and "<html" not in fragment


def test_logout_revokes_the_session_and_the_raw_token_is_no_cookie(tmp_path: Path) -> None:
    with make_client(f"sqlite:///{tmp_path / 'l.db'}") as c:
        assert c.post("/login", content=f"token={VIEWER}", follow_redirects=False).status_code == 303
        kept = c.cookies.get("oomguard_session")
        assert kept and c.get("/api/v1/nodes").status_code == 200
        confirm = c.get("/logout")  # a GET changes nothing: it offers the POST
        assert confirm.status_code == 200 and 'action="/logout"' in confirm.text
        assert c.get("/api/v1/nodes").status_code == 200
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', confirm.text)
        assert csrf, confirm.text
        out = c.post("/logout", content=f"csrf={csrf[1]}", follow_redirects=False)
        assert out.status_code == 303 and out.headers["location"] == "/login"
        c.cookies.clear()
        c.cookies.set("oomguard_session", kept)  # a copy kept by whoever stole it
        assert c.get("/api/v1/nodes").status_code == 401
        assert c.get("/", follow_redirects=False).status_code == 303
        c.cookies.clear()
        c.cookies.set("oomguard_session", VIEWER)  # the raw token is no session
        assert c.get("/api/v1/nodes").status_code == 401
        c.cookies.set("oomguard_viewer", VIEWER)  # nor is the old cookie
        assert c.get("/api/v1/nodes").status_code == 401


def test_a_lost_database_is_503_not_500(tmp_path: Path) -> None:
    """Writes answer 503 (retry later) while the database cannot be written; nothing is acknowledged."""
    db = tmp_path / "gone.db"
    with make_client(f"sqlite:///{db}") as c:
        assert post(c, envelope("n", fixture_report())).status_code == 200
        with make_engine(f"sqlite:///{db}").begin() as conn:
            conn.execute(text("DROP TABLE events"))
        r = c.post("/api/v1/events", json={"node": "n", "id": "e-1", "event": {"event": "start"}}, headers=AGENT_H)
        assert r.status_code == 503 and r.headers["retry-after"] == "5"


# -- the manager's parts on their own ------------------------------------------------------------


def test_times_are_milliseconds_through_the_one_iso_writer_and_reader() -> None:
    from oomguard.manager.times import iso_ms, parse_iso_ms
    from oomguard.times import iso_from_epoch

    # 8713146728925 / 1000 * 1000 is 8713146728924.999...: truncating it naively loses a millisecond.
    for ms in (0, 1, 999, 1_780_000_000_123, 8_713_146_728_925):
        text = iso_ms(ms)
        assert text is not None and text[:19] == iso_from_epoch(ms // 1000)[:19]
        assert text.endswith(f".{ms % 1000:03d}Z") and parse_iso_ms(text) == ms
    assert iso_ms(None) is None
    assert parse_iso_ms("2026-11-30T21:37:18.5+02:00") == parse_iso_ms("2026-11-30T19:37:18.500Z")
    assert parse_iso_ms("2026-11-30T19:37:18") == parse_iso_ms("2026-11-30T19:37:18Z")  # no offset: UTC
    for junk in (None, "", "yesterday", "2026-13-01T00:00:00Z", "\x00", 12, "9" * 100):
        assert parse_iso_ms(junk) is None, junk


def test_one_bearer_check_for_the_api_and_the_pages(tmp_path: Path) -> None:
    from oomguard.manager.web.deps import bearer, token_ok

    assert bearer("Bearer  abc ") == "abc" and bearer("bEaReR abc") == "abc"
    assert bearer("Basic abc") is None and bearer(None) is None and bearer("Bearer") is None
    assert token_ok(None, None) and token_ok("t", "t") and token_ok("t", "ü") is False
    assert not token_ok("t", "") and not token_ok("t", None) and not token_ok("t", "T")
    with make_client(f"sqlite:///{tmp_path / 'b.db'}") as c:
        assert c.post("/login", content=f"token={VIEWER}", follow_redirects=False).status_code == 303
        for path, refused in (("/api/v1/nodes", 401), ("/", 303)):  # one rule: a bearer header wins, else the cookie
            assert c.get(path, headers={"Authorization": "Basic eDp5"}).status_code == 200, path
            wrong = c.get(path, headers={"Authorization": "Bearer wrong"}, follow_redirects=False)
            assert wrong.status_code == refused, path
        c.cookies.clear()
        assert c.get("/api/v1/nodes", headers={"Authorization": "Basic eDp5"}).status_code == 401


def test_the_alert_policy_on_one_node_row() -> None:
    from oomguard.manager.alerts import node_alerts

    row = {
        "name": "n",
        "status": "online",
        "effective_bytes": 342 * GiB,
        "host_total_bytes": 503 * GiB,
        "budget_bytes": 332 * GiB,
        "warnings": "[]",
        "last_seen_ms": 0,
    }
    assert node_alerts(row, 0) == []
    kinds = [a["kind"] for a in node_alerts({**row, "budget_bytes": 400 * GiB}, 0)]
    assert kinds == ["budget-from-host"]  # above the limit and over half the host: sized from the host
    kinds = [a["kind"] for a in node_alerts({**row, "budget_bytes": 343 * GiB, "host_total_bytes": 2048 * GiB}, 0)]
    assert kinds == ["budget-above-limit"]
    offline = node_alerts({**row, "status": "offline", "warnings": '["memlock-too-low"]'}, 2)
    assert [(a["kind"], a["severity"]) for a in offline] == [
        ("offline", "warning"),
        ("memlock-below-pinned-need", "critical"),
        ("oom-kills", "critical"),
    ]
    assert offline[0]["message"] == "no report since 1970-01-01T00:00:00.000Z"
    assert offline[2]["message"] == "2 OOM kill(s) in the last hour"


def test_a_failed_retention_pass_is_logged_whole_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    from oomguard.manager.retention import RetentionThread

    calls: list[int] = []
    passed = threading.Event()

    def thin() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("a bug in the pass")
        passed.set()

    with caplog.at_level("ERROR", logger="oomguard.manager.retention"):
        retention = RetentionThread(thin, 0.01).start()
        try:
            assert passed.wait(10), "the thread stopped after the failure"
        finally:
            retention.stop()
    failures = [r for r in caplog.records if r.name == "oomguard.manager.retention"]
    assert len(failures) == 1 and "retention pass failed" in failures[0].getMessage()
    assert failures[0].exc_info is not None and failures[0].exc_info[0] is ZeroDivisionError


def test_a_failed_retention_pass_prints_its_traceback_without_logging_set_up() -> None:
    import subprocess

    code = (
        "from oomguard.manager.retention import RetentionThread\n"
        "def thin():\n    raise ZeroDivisionError('a bug in the pass')\n"
        "assert RetentionThread(thin, 600).run_once() is False\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "retention pass failed" in proc.stderr and "Traceback (most recent call last)" in proc.stderr
    assert "in thin\nZeroDivisionError: a bug in the pass" in proc.stderr  # the whole traceback, not str(exc)


def test_the_jobs_column_is_what_the_supervisor_runs(client: TestClient) -> None:
    """Issue #12: a start event's concurrency (after an OOM step-down) is the node's jobs; a report
    without a plan does not reset it."""
    post(client, envelope("prover", fixture_report()))
    start = {"event": "start", "pid": 7, "budget_bytes": GiB, "concurrency": 10}
    assert post(client, {"node": "prover", "id": uuid.uuid4().hex, "event": start}, "/api/v1/events").json()["stored"]
    post(client, envelope("prover", fixture_report()))  # no plan in it
    nodes = {n["name"]: n for n in client.get("/api/v1/nodes", headers=VIEWER_H).json()["nodes"]}
    assert nodes["prover"]["concurrency"] == 10


def test_pressure_stops_are_counted_apart_from_oom_kills(client: TestClient) -> None:
    """Issue #15: a run --guard stop is its own reason and counter, never an OOM kill."""
    post(client, envelope("guarded", fixture_report()))
    stop = {"event": "exit", "reason": "pressure-stop", "signal": 15, "pid": 9, "budget_bytes": GiB}
    restart = {"event": "restart", "reason": "pressure-stop", "delay_s": 1.0, "budget_bytes": GiB}
    for event in (stop, restart, stop):
        assert post(client, {"node": "guarded", "id": uuid.uuid4().hex, "event": event}, "/api/v1/events").json()[
            "stored"
        ]
    metrics = client.get("/metrics", headers=VIEWER_H).text
    assert 'oomguard_pressure_stops_total{node="guarded"} 2.0' in metrics
    assert 'oomguard_oom_kills_total{node="guarded"} 0.0' in metrics
    nodes = {n["name"]: n for n in client.get("/api/v1/nodes", headers=VIEWER_H).json()["nodes"]}
    assert nodes["guarded"]["oom_kills_24h"] == 0
    alerts = client.get("/api/v1/alerts", headers=VIEWER_H).json()["alerts"]
    assert not [a for a in alerts if a["node"] == "guarded" and a["kind"] == "oom-kills"]
