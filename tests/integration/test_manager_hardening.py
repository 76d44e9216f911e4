"""The manager under a hostile client and a bad day (issue 13), on real SQLite, real PostgreSQL and
real sockets: no 5xx for any input, secrets masked, no single client can stop it, safer defaults,
and every database failure seen (logged once, counted, in /healthz)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from oomguard.manager.app import create_app
from oomguard.manager.db import make_engine, migrate
from oomguard.manager.settings import Settings
from tests.helpers.manager import (
    AGENT,
    AGENT_H,
    VIEWER,
    VIEWER_H,
    ManagerProcess,
    db_url_of,
    envelope,
    fixture_report,
    local_client,
    one_request,
)
from tests.helpers.mounts import tmpfs
from tests.helpers.pg import PostgresServer, own_server
from tests.helpers.wait import wait_until
from tests.helpers.wire import LiveServer, until_closed

REPORTS = "/api/v1/reports"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return db_url_of(request.param, tmp_path, "h_")


def client_for(db_url: str, **settings: Any) -> TestClient:
    migrate(db_url)
    base: dict[str, Any] = {"db_url": db_url, "agent_token": AGENT, "viewer_token": VIEWER}
    client: TestClient = local_client(create_app(Settings(**{**base, **settings})))
    return client


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with client_for(db_url) as c:
        yield c


def raw_post(c: TestClient, body: str | bytes, path: str = REPORTS) -> Any:
    return c.post(path, content=body, headers={**AGENT_H, "Content-Type": "application/json"})


def pages_up(c: TestClient, node: str) -> None:
    for path in ("/", f"/nodes/{node}", f"/api/v1/nodes/{node}", "/api/v1/nodes", "/metrics", "/api/v1/alerts"):
        r = c.get(path, headers=VIEWER_H)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])


# -- 1. no 5xx for any client input ----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        '{"node": "n", "id": "x", "report": {"schema_version": 1, "memory": {}}, "interval_s": NaN}',
        '{"node": "n", "id": "x", "report": {"schema_version": 1, "memory": {"effective_bytes": Infinity}}}',
        '{"node": "n", "id": "x", "report": {"schema_version": 1, "memory": {}}, "interval_s": -Infinity}',
        b'{"node": "n", "id": "x", "report": {"schema_version": 1, "memory": {}, "root": "\xff"}}',
    ],
)
def test_nan_infinity_and_bad_utf8_are_422_with_a_json_answer(client: TestClient, body: str | bytes) -> None:
    r = raw_post(client, body)
    assert r.status_code == 422 and isinstance(r.json()["detail"], str | list), r.text


def test_deep_nesting_is_refused_and_32_levels_pass(client: TestClient) -> None:
    for depth, status in ((255, 422), (100_000, 422), (29, 200), (30, 422)):  # envelope, report, memory: 3
        report = fixture_report()
        report["memory"]["extra"] = "NEST"
        body = json.dumps(envelope("deep", report)).replace('"NEST"', "[" * depth + "1" + "]" * depth)
        r = raw_post(client, body)
        assert r.status_code == status, (depth, r.text[:200])
    pages_up(client, "deep")


def test_the_report_is_checked_against_its_json_schema(client: TestClient) -> None:
    bad = fixture_report()
    bad["container"]["evidence"] = 5  # a number where the schema says a list of strings
    r = raw_post(client, json.dumps(envelope("typed", bad)))
    assert r.status_code == 422 and "report.container.evidence" in r.text
    huge = fixture_report()
    huge["memory"]["soft_limit_bytes"] = int("9" * 401)
    assert raw_post(client, json.dumps(envelope("typed", huge))).status_code == 422
    newer = fixture_report()
    newer["memory"]["a_field_from_a_newer_agent"] = {"x": 1}  # unknown fields pass (a mixed fleet)
    del newer["cpu"]  # so do missing ones (an older agent)
    assert raw_post(client, json.dumps(envelope("typed", newer))).status_code == 200
    pages_up(client, "typed")


def test_pages_render_a_stored_report_whatever_its_types(db_url: str) -> None:
    """Rows stored before the schema check: the node page and the API still answer 200."""
    with client_for(db_url) as c:
        assert raw_post(c, json.dumps(envelope("old", fixture_report()))).status_code == 200
        stored = fixture_report()
        stored["container"]["evidence"] = 5
        stored["memory"]["soft_limit_bytes"] = int("9" * 401)
        stored["memory"]["cgroup"] = "not an object"
        stored["gpus"] = [{"index": "zero", "name": 7}]
        with make_engine(db_url).begin() as conn:
            conn.execute(text("UPDATE latest_reports SET report = :r"), {"r": json.dumps(stored)})
        page = c.get("/nodes/old", headers=VIEWER_H)
        assert page.status_code == 200 and "342 GiB" in page.text
        pages_up(c, "old")


def test_query_parameters_are_validated(client: TestClient) -> None:
    assert raw_post(client, json.dumps(envelope("q-node", fixture_report()))).status_code == 200
    for path in ("/?refresh=²", "/nodes/q-node?refresh=²", "/?refresh=99999999999", "/?offset=abc", "/?offset=-5"):
        assert client.get(path, headers=VIEWER_H).status_code == 200, path
    assert client.get("/?q=%00", headers=VIEWER_H).status_code == 200  # the page drops the NUL
    assert client.get("/api/v1/nodes?q=%00", headers=VIEWER_H).status_code == 422
    assert client.get("/api/v1/nodes?q=ab%00cd", headers=VIEWER_H).status_code == 422
    assert client.get("/api/v1/nodes/a%00b", headers=VIEWER_H).status_code == 422


def test_nul_bytes_never_reach_the_database(client: TestClient) -> None:
    event = {"node": "n", "id": "e-nul", "event": {"event": "exit", "time": "2026-11-30T19:37:18\u0000Z"}}
    r = raw_post(client, json.dumps(event), "/api/v1/events")
    assert r.status_code == 422 and "NUL" in r.text
    report = fixture_report()
    report["warnings"].append({"code": "x", "message": "a\u0000b"})
    assert raw_post(client, json.dumps(envelope("n", report))).status_code == 422
    assert (
        raw_post(
            client, '{"node": "n", "id": "x", "report": {"schema_version": 1, "memory": {}, "k\\u0000": 1}}'
        ).status_code
        == 422
    )


def test_a_refusal_never_echoes_the_input(client: TestClient) -> None:
    secret = "leak-" + "z" * 50
    r = raw_post(client, json.dumps({"node": secret + " bad", "id": "x", "report": {}}))
    assert r.status_code == 422 and secret not in r.text
    assert all(set(e) == {"loc", "msg", "type"} for e in r.json()["detail"])


# -- 4. no secret in messages ----------------------------------------------------------------


def test_urls_and_secrets_are_masked() -> None:
    from oomguard.manager.redact import Redactor, mask_url, url_secrets

    assert mask_url("postgresql://u:p%40ss@db:5432/x?sslmode=require") == "postgresql://u:***@db:5432/x?sslmode=require"
    assert mask_url("postgresql://db/x?user=u&password=hunter2&x=1") == "postgresql://db/x?user=u&password=***&x=1"
    assert mask_url("sqlite:////var/lib/oomguard.db") == "sqlite:////var/lib/oomguard.db"
    assert set(url_secrets("postgresql://u:p%40ss@db/x")) == {"p%40ss", "p@ss"}
    redact = Redactor(["tok-" + "1" * 20, *url_secrets("postgresql://u:p%40ss@db/x")])
    line = redact(f"failed for p@ss and tok-{'1' * 20} at postgresql://other:pw@h/d")
    assert "p@ss" not in line and "1" * 20 not in line and ":pw@" not in line and line.count("***") == 3


@pytest.mark.slow
def test_the_cli_masks_the_password_in_its_errors_and_start_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    cmd = [sys.executable, "-m", "oomguard", "manager", "--port", "1", "--db-wait", "0"]  # no retry: one line
    bad = subprocess.run(
        [*cmd, "--db", "postgresql://u:hunter2-secret@127.0.0.1:1/x"], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 2 and "hunter2" not in bad.stderr and "u:***@127.0.0.1:1/x" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    scheme = subprocess.run([*cmd, "--db", "mysql://u:hunter2-secret@h/db"], capture_output=True, text=True, env=env)
    assert scheme.returncode == 2 and "hunter2" not in scheme.stderr
    assert scheme.stderr.strip() == (
        "oomguard: error: --db: unsupported database scheme 'mysql': use sqlite:///PATH or postgresql://USER@HOST/DATABASE"
    )


def test_an_old_sqlite_is_one_line_not_a_500_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """RHEL 8's Python links SQLite 3.26: no RETURNING (3.35), no NULLS LAST (3.30)."""
    import sqlite3

    from oomguard.errors import UsageError

    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 26, 0))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.26.0")
    with pytest.raises(UsageError, match=r"^--db: this Python's SQLite is 3.26.0; the manager needs 3.35 or later"):
        Settings(db_url="sqlite:///x.db").check()
    Settings(db_url="postgresql://u@h/d").check()  # PostgreSQL does not care
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 35, 0))
    Settings(db_url="sqlite:///x.db").check()


def test_a_database_failure_log_masks_the_password(caplog: pytest.LogCaptureFixture) -> None:
    from oomguard.manager.redact import Redactor
    from oomguard.manager.store.health import DbHealth

    health = DbHealth(Redactor(["hunter2-secret"]))
    with caplog.at_level("ERROR", logger="oomguard.manager.database"):
        health.failure("reads", OSError("could not connect to postgresql://u:hunter2-secret@db/x: refused"))
    assert caplog.records and "hunter2" not in caplog.text and "u:***@db/x" in caplog.text


# -- 6. safer defaults -----------------------------------------------------------------------


def test_the_host_allow_list(tmp_path: Path) -> None:
    assert Settings(host="127.0.0.1").hosts() == ("127.0.0.1", "localhost", "::1")
    assert Settings(host="10.0.0.5").hosts() == ("10.0.0.5", "localhost", "127.0.0.1", "::1")
    assert Settings(host="0.0.0.0").hosts() == ("*",)  # any address: tokens are required there
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with client_for(url) as c:
        for host, status in (
            ("localhost", 200),
            ("localhost:8080", 200),
            ("127.0.0.1:8080", 200),
            ("[::1]:8080", 200),
            ("LOCALHOST.", 200),
            ("evil.example", 400),
            ("evil.example:8080", 400),
            ("", 400),
            ("127.0.0.1.evil.example", 400),
        ):
            assert c.get("/healthz", headers={"Host": host}).status_code == status, host
    with client_for(url, host="0.0.0.0", allowed_hosts=("oomguard.example.com", "*.corp.example")) as c:
        for host, status in (("oomguard.example.com", 200), ("a.corp.example:443", 200), ("corp.example", 400)):
            assert c.get("/healthz", headers={"Host": host}).status_code == status, host


def test_guessing_tokens_is_limited_per_client(tmp_path: Path) -> None:
    with client_for(f"sqlite:///{tmp_path / 'g.db'}", login_burst=5, login_refill_s=60) as c:
        for _ in range(5):
            assert c.post("/login", content="token=nope").status_code == 200
        limited = c.post("/login", content="token=nope", follow_redirects=False)
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) > 0
        assert "try again in" in limited.text and "set-cookie" not in limited.headers
        assert c.get("/api/v1/nodes", headers={"Authorization": "Bearer nope"}).status_code == 429  # one bucket
        # a right token always passes (issue 22): a bad client cannot lock out a good one on its address
        assert c.post("/login", content=f"token={VIEWER}", follow_redirects=False).status_code == 303
        assert c.get("/api/v1/nodes", headers=VIEWER_H).status_code == 200
        assert c.post(REPORTS, json=envelope("n", fixture_report()), headers=AGENT_H).status_code == 200
    with client_for(f"sqlite:///{tmp_path / 'g2.db'}", login_burst=3, login_refill_s=60) as c:
        for _ in range(3):
            assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 429
        assert c.get("/healthz").status_code == 200  # open paths stay open


def test_sessions_are_signed_and_expire() -> None:
    from oomguard.manager.web.sessions import FailureLimiter, Sessions

    s = Sessions("v" * 20, ttl_s=60)
    cookie = s.issue(now=1000.0)
    assert s.valid(cookie, now=1059.0) and not s.valid(cookie, now=1061.0)
    sid, expiry, mac = cookie.split(".")
    assert not s.valid(f"{sid}.{int(expiry) + 3600}.{mac}", now=1000.0)  # a later expiry breaks the MAC
    assert not s.valid(f"{sid}x.{expiry}.{mac}", now=1000.0)
    assert not Sessions("w" * 20, ttl_s=60).valid(cookie, now=1000.0)  # a new viewer token ends all sessions
    assert Sessions("v" * 20, ttl_s=60).valid(cookie, now=1000.0)  # a replica with the same token accepts it
    for junk in (None, "", "a.b", "a.b.c", "a.99999999999999.c", "a.١٢.c"):
        assert not s.valid(junk, now=1000.0)
    assert s.revoke(cookie, now=1000.0) and not s.valid(cookie, now=1000.0)
    limiter = FailureLimiter(burst=2, refill_s=10)
    limiter.failed("a", now=0)
    limiter.failed("a", now=0)
    assert limiter.retry_after("a", now=0) == 10 and limiter.retry_after("b", now=0) == 0
    assert limiter.retry_after("a", now=10) == 0


@pytest.mark.slow
def test_tokens_from_the_environment_are_stripped_with_a_warning(tmp_path: Path) -> None:
    server = ManagerProcess(
        f"sqlite:///{tmp_path / 'e.db'}",
        tokens=False,
        env={"OOMGUARD_AGENT_TOKEN": AGENT + "\n", "OOMGUARD_VIEWER_TOKEN": " " + VIEWER + "\n"},
    ).start()
    try:
        import urllib.request

        body = json.dumps(envelope("env-node", fixture_report())).encode()
        req = urllib.request.Request(
            server.url + REPORTS, data=body, headers={**AGENT_H, "Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200  # the agent's token (without the newline) is accepted
    finally:
        server.stop()
    log = server.log()
    assert "warning: OOMGUARD_AGENT_TOKEN: whitespace around the token stripped" in log
    assert "warning: OOMGUARD_VIEWER_TOKEN: whitespace around the token stripped" in log


# -- 5. no single client can stop it ---------------------------------------------------------


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    migrate(url)
    app = create_app(Settings(db_url=url, agent_token=AGENT, viewer_token=VIEWER, body_timeout_s=1.0))
    with LiveServer(app, header_timeout_s=1.0) as server:
        yield server


def plain_get_s(live: LiveServer) -> float:
    """The reference of the tests marked ``timing`` here: the slowest of three plain GETs on
    connections of their own, now, on this machine (its load slows them alike)."""
    return max(live.get()[1] for _ in range(3))


@pytest.mark.slow
@pytest.mark.timing
def test_incomplete_requests_time_out_on_the_wire(live: LiveServer) -> None:
    base = plain_get_s(live)
    late = 1.0 + max(3.0, 10 * base)  # the 1 s deadlines, and the machine's own slowness
    with live.connect() as idle:  # connects, says nothing
        got, after = until_closed(idle, limit_s=2 * late)
        assert got == b"" and 0.7 < after < late, (after, f"a plain GET: {base:.3f}s")
    with live.connect() as slow:  # headers a byte at a time, for ever: not renewed by each byte
        drip = b"POST /api/v1/reports HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * 200
        got, after = until_closed(slow, drip, limit_s=2 * late)
        assert got.startswith(b"HTTP/1.1 408") and 0.7 < after < late, (got[:40], after, f"a plain GET: {base:.3f}s")
    with live.connect() as body:  # headers done, the body stalls
        body.sendall(b'POST /api/v1/reports HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{"node"')
        got, after = until_closed(body, limit_s=2 * late)
        assert got.startswith(b"HTTP/1.1 408") and b"did not arrive within 1s" in got and after < late, (got, after)
    assert live.get()[0] == 200


@pytest.mark.timing
def test_slow_clients_do_not_block_the_others(live: LiveServer) -> None:
    base = plain_get_s(live)
    slow = [live.connect() for _ in range(50)]  # one client at its limit (half of the cap of 100)
    try:
        for s in slow:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
        status, took = live.get(source="127.0.0.2")
        # well before the slow ones' 1 s header deadline would free a slot, on a quiet machine
        assert status == 200 and took < max(2.0, 10 * base), f"{took:.3f}s; a plain GET before: {base:.3f}s"
    finally:
        for s in slow:
            s.close()


def _healthz(port: int, source: str = "127.0.0.1", s: socket.socket | None = None) -> tuple[int, float]:
    """GET /healthz on *s* (kept open) or a connection of its own: (status, seconds it took)."""
    start = time.monotonic()
    own = s is None
    s = s or socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    try:
        s.settimeout(5)
        s.sendall(f"GET /healthz HTTP/1.1\r\nHost: localhost\r\n{'Connection: close' if own else ''}\r\n\r\n".encode())
        answer = http.client.HTTPResponse(s)  # read to the body's end: a kept connection stays clean
        answer.begin()
        answer.read()
        return answer.status, time.monotonic() - start
    finally:
        if own:
            s.close()


def accepted(server: ManagerProcess) -> int:
    """The TCP connections to its port the server process has accepted: the ESTABLISHED rows of
    /proc/net/tcp* with its local port (proc(5); state 01) whose socket inode is one of the process's
    descriptors (/proc/PID/fd: "socket:[INODE]"). One still in the accept queue has no descriptor."""
    assert server.proc is not None
    port = f"{server.port:04X}"
    connected = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[1].rsplit(":", 1)[1] == port and fields[3] == "01":
                    connected.add(fields[9])
    held = 0
    for fd in Path(f"/proc/{server.proc.pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd)[8:-1] in connected:
                held += 1
    return held


@pytest.mark.slow
@pytest.mark.timing
def test_a_connection_cap_answers_503_at_once(tmp_path: Path) -> None:
    server = ManagerProcess(f"sqlite:///{tmp_path / 'cap.db'}", "--max-connections", "8").start()
    idle = []
    try:  # eight clients (one client may hold only half of the cap), then a ninth
        idle = [
            socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=(f"127.0.0.{2 + i}", 0))
            for i in range(8)
        ]
        # The server has accepted the eight (and closed start()'s probe): its process holds exactly
        # eight connected sockets, read from /proc without a byte sent on them.
        wait_until(lambda: accepted(server) == 8, what="the server's accept of the eight silent connections")
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=("127.0.0.10", 0)) as s:
            s.sendall(b"GET /login HTTP/1.1\r\nHost: localhost\r\n\r\n")  # no token: not protected
            head = s.recv(4096)
        took = time.monotonic() - start
        assert head.startswith(b"HTTP/1.1 503"), head[:60]
        with socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=("127.0.0.11", 0)) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")  # issue 37: served above the cap
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        for s in idle:
            s.close()
        idle = []
        wait_until(lambda: _healthz(server.port)[0] == 200, what="a 200 once the eight are closed")
        base = max(_healthz(server.port)[1] for _ in range(3))  # the reference: plain GETs, here, now
        assert took < max(1.5, 10 * base), f"the 503 took {took:.3f}s; a plain GET {base:.3f}s"
    finally:
        for s in idle:
            s.close()
        server.stop()
    assert "at most 8 connections" in server.log()


@pytest.mark.slow
def test_logs_are_rate_limited(tmp_path: Path) -> None:
    from oomguard.manager.web.server import LOG_BURST

    server = ManagerProcess(f"sqlite:///{tmp_path / 'log.db'}").start()
    try:
        for _ in range(300):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
                s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                s.recv(4096)
    finally:
        server.stop()
    invalid = [line for line in server.log().splitlines() if "Invalid HTTP request received" in line]
    assert 1 <= len(invalid) <= LOG_BURST, len(invalid)
    assert len(server.log()) < 20_000


@pytest.mark.slow
def test_the_soft_file_limit_is_raised_and_the_cap_fits_it(tmp_path: Path) -> None:
    raised = ManagerProcess(f"sqlite:///{tmp_path / 'n.db'}", nofile=(256, 4096)).start()
    try:
        assert raised.proc is not None
        limits = Path(f"/proc/{raised.proc.pid}/limits").read_text()
        line = next(li for li in limits.splitlines() if li.startswith("Max open files"))
        assert line.split()[3:5] == ["4096", "4096"], line
    finally:
        raised.stop()
    assert "at most 1000 connections" in raised.log()
    stuck = ManagerProcess(f"sqlite:///{tmp_path / 'n2.db'}", nofile=(256, 256)).start()
    stuck.stop()
    assert "at most 128 connections" in stuck.log()  # 256 descriptors, 128 kept for the rest


def test_deploy_sets_the_file_limit_and_shows_a_proxy_with_tls_and_timeouts() -> None:
    repo = Path(__file__).resolve().parents[2]
    unit = (repo / "deploy/systemd/oomguard-manager.service").read_text()
    limit = int(next(li.split("=", 1)[1] for li in unit.splitlines() if li.startswith("LimitNOFILE=")))
    assert limit >= 65536
    caddy = (repo / "deploy/proxy/Caddyfile").read_text()
    for needed in ("reverse_proxy 127.0.0.1:8080", "read_header", "read_body", "max_size 1MB"):
        assert needed in caddy, needed
    nginx = (repo / "deploy/proxy/nginx.conf").read_text()
    for needed in (
        "listen 443 ssl",
        "ssl_certificate ",
        "client_header_timeout",
        "client_body_timeout",
        "proxy_read_timeout",
        "client_max_body_size 1m",
        "limit_conn",
        "proxy_set_header X-Forwarded-Proto",
        "proxy_pass http://127.0.0.1:8080",
    ):
        assert needed in nginx, needed


@pytest.mark.slow
def test_the_nginx_example_in_front_of_a_real_manager(tmp_path: Path) -> None:
    """deploy/proxy/nginx.conf as shipped (ports, certificate and upstream swapped in): TLS, the
    manager's default Host allow-list through the proxy, no answer for another name, and the
    dashboard's one write (forgetting a node) through it: nginx rewrites Host to the upstream's,
    so the form's Origin check needs the X-Forwarded-Host the example sends."""
    import shutil
    import ssl

    nginx, openssl = shutil.which("nginx") or "/usr/sbin/nginx", shutil.which("openssl")
    if not os.path.exists(nginx) or openssl is None:
        pytest.skip("needs nginx and openssl (scripts/system-deps.sh installs nginx-light)")
    from tests.helpers.manager import free_port

    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=oomguard.example.com",
         "-addext", "subjectAltName=DNS:oomguard.example.com",
         "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    from urllib.parse import urlencode

    from oomguard.manager.web.forget import forget_token

    admin = "admin-token-through-nginx"
    manager = ManagerProcess(  # nginx on 127.0.0.1: its X-Forwarded-* believed (issue 22)
        f"sqlite:///{tmp_path / 'p.db'}", "--trusted-proxy", "127.0.0.1", env={"OOMGUARD_ADMIN_TOKEN": admin}
    ).start()
    tls, plain = free_port(), free_port()
    conf = (Path(__file__).resolve().parents[2] / "deploy/proxy/nginx.conf").read_text()
    for old, new in (
        ("/etc/ssl/oomguard/fullchain.pem", str(tmp_path / "cert.pem")),
        ("/etc/ssl/oomguard/privkey.pem", str(tmp_path / "key.pem")),
        ("listen 443 ssl", f"listen 127.0.0.1:{tls} ssl"),
        ("listen 80;", f"listen 127.0.0.1:{plain};"),
        ("127.0.0.1:8080", f"127.0.0.1:{manager.port}"),
    ):
        assert old in conf, old
        conf = conf.replace(old, new)
    (tmp_path / "oomguard.conf").write_text(conf)
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{ include {tmp_path}/oomguard.conf; }}\n"
    )
    proxy = subprocess.Popen(
        [nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", str(tmp_path / "error.log"),
         "-g", "daemon off;"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))

        def listening() -> bool:
            assert proxy.poll() is None, proxy.stderr and proxy.stderr.read()
            try:
                socket.create_connection(("127.0.0.1", tls), timeout=1).close()
            except OSError:
                return False
            return True

        wait_until(listening, what="nginx to listen")
        public = f"oomguard.example.com:{tls}"

        def post(path: str, body: str, kind: str, *headers: str) -> bytes:
            with (
                socket.create_connection(("127.0.0.1", tls)) as raw,
                ctx.wrap_socket(raw, server_hostname="oomguard.example.com") as s,
            ):
                extra = "".join(f"{h}\r\n" for h in headers)
                s.sendall(
                    (f"POST {path} HTTP/1.1\r\nHost: {public}\r\n{extra}Content-Type: {kind}\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode()
                )  # fmt: skip
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
            return answer

        body = json.dumps(envelope("via-proxy", fixture_report()))
        answer = post("/api/v1/reports", body, "application/json", f"Authorization: Bearer {AGENT}")
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        form = "application/x-www-form-urlencoded"
        answer = post("/login", urlencode({"token": VIEWER, "next": "/"}), form)
        assert answer.startswith(b"HTTP/1.1 303"), answer[:300]
        cookie = next(
            line.split(b":", 1)[1].split(b";")[0].strip().decode()
            for line in answer.split(b"\r\n")
            if line.lower().startswith(b"set-cookie:") and b"oomguard_session=" in line
        )
        session = cookie.split("=", 1)[1]
        fields = {"csrf": forget_token(session, "via-proxy"), "confirm": "via-proxy", "token": admin}
        forged = post(
            "/nodes/via-proxy/forget", urlencode(fields), form, f"Cookie: {cookie}", "Origin: https://evil.example"
        )
        assert forged.startswith(b"HTTP/1.1 403"), forged[:300]
        answer = post(
            "/nodes/via-proxy/forget", urlencode(fields), form, f"Cookie: {cookie}", f"Origin: https://{public}"
        )
        assert answer.startswith(b"HTTP/1.1 303"), answer[:300]  # forgotten through the proxy
        import urllib.error
        import urllib.request

        ask = urllib.request.Request(manager.url + "/api/v1/nodes/via-proxy", headers=VIEWER_H)
        with pytest.raises(urllib.error.HTTPError) as gone:
            urllib.request.urlopen(ask, timeout=10)
        assert gone.value.code == 404
        with pytest.raises(ssl.SSLError), socket.create_connection(("127.0.0.1", tls)) as raw:
            ssl._create_unverified_context().wrap_socket(raw, server_hostname="rebound.example").do_handshake()
    finally:
        proxy.terminate()
        proxy.wait(10)
        manager.stop()


# -- 7. failures are seen --------------------------------------------------------------------


def metric(c: TestClient, kind: str) -> float:
    line = next(li for li in c.get("/metrics", headers=VIEWER_H).text.splitlines() if f'kind="{kind}"' in li)
    return float(line.split()[-1])


def episode_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "oomguard.manager.database"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real file system of 2 MiB (tmpfs), to fill."""
    with tmpfs(tmp_path / "small", "2m") as mnt:
        yield mnt


def test_a_full_disk_is_one_logged_episode_counted_and_in_healthz(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level("WARNING", logger="oomguard.manager.database"),
        client_for(f"sqlite:///{small_disk / 'f.db'}") as c,
    ):
        assert c.post(REPORTS, json=envelope("n", fixture_report()), headers=AGENT_H).status_code == 200
        filler = small_disk / "filler"
        with filler.open("wb", buffering=0) as f, pytest.raises(OSError):  # unbuffered: close flushes nothing
            while True:
                f.write(b"\0" * 65536)
        refused = 0
        for _ in range(40):
            r = c.post(REPORTS, json=envelope("n", fixture_report()), headers=AGENT_H)
            assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
            refused += 1
        assert c.get("/api/v1/nodes", headers=VIEWER_H).status_code == 200  # reads go on
        health = c.get("/healthz")
        assert health.status_code == 503 and health.json()["failing"] == {"writes": "disk-full"}
        assert metric(c, "disk-full") == refused
        lines = episode_lines(caplog)
        assert len(lines) == 1 and "database writes failing (disk-full)" in lines[0], lines
        filler.unlink()
        assert c.post(REPORTS, json=envelope("n", fixture_report()), headers=AGENT_H).status_code == 200
        assert c.get("/healthz").status_code == 200
        lines = episode_lines(caplog)
        assert len(lines) == 2 and "work again after" in lines[1] and f"{refused} request(s)" in lines[1], lines


def test_a_read_only_sqlite_handle_is_reopened_once_writable(tmp_path: Path) -> None:
    db = tmp_path / "ro.db"
    url = f"sqlite:///{db}"
    migrate(url)
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available here (needs root and ext4/xfs)")
    try:
        with client_for(url) as c:  # opened while the file cannot be written: SQLite opens it read-only
            r = c.post(REPORTS, json=envelope("n", fixture_report()), headers=AGENT_H)
            assert r.status_code == 503 and "read-only" in r.text
            subprocess.run(["chattr", "-i", str(db)], check=True)
            assert c.post(REPORTS, json=envelope("n", fixture_report()), headers=AGENT_H).status_code == 200
            assert metric(c, "read-only") == 1
    finally:
        subprocess.run(["chattr", "-i", str(db)], capture_output=True)


@pytest.fixture
def own_pg() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, to stop and hang."""
    with own_server() as server:
        yield server


def _restart(server: PostgresServer) -> None:
    """Start the stopped cluster again, on its data directory and port (what pg.py's start did)."""
    assert server.bindir is not None
    cmd = [f"{server.bindir}/postgres", "-D", f"{server.dir}/data", "-p", str(server.port), "-k", server.dir]
    server.proc = subprocess.Popen(
        server._as_owner([*cmd, "-c", "listen_addresses=127.0.0.1"]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.timing
def test_a_hung_postgresql_is_a_fast_503_and_healthz_says_so(
    own_pg: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = own_pg.create_db("hung")
    with (
        caplog.at_level("WARNING", logger="oomguard.manager.database"),
        client_for(url, db_timeout_s=1.0, request_timeout_s=2.0) as c,
    ):
        start = time.monotonic()
        assert c.post(REPORTS, json=envelope("n", fixture_report()), headers=AGENT_H).status_code == 200
        base = time.monotonic() - start  # the reference: the same write, the database well
        fast = 2.0 + max(2.0, 10 * base)  # the 2 s request timeout, and the machine's own slowness
        stopped = own_pg.cluster_pids()
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)  # hung: connections open, nothing answers
        try:
            for method, path in (("POST", REPORTS), ("GET", "/api/v1/nodes"), ("GET", "/api/v1/nodes/n")):
                start = time.monotonic()
                kwargs: dict[str, Any] = {"json": envelope("n", fixture_report())} if method == "POST" else {}
                r = c.request(method, path, headers={**AGENT_H, **(VIEWER_H if method == "GET" else {})}, **kwargs)
                took = time.monotonic() - start
                assert r.status_code == 503 and took < fast, (path, r.status_code, took, f"healthy: {base:.3f}s")
            start = time.monotonic()
            health = c.get("/healthz")
            took = time.monotonic() - start
            assert health.status_code == 503 and took < fast, (took, f"healthy: {base:.3f}s")
            assert health.json()["database"] == "timeout"
            assert c.get("/readyz").status_code == 503  # readiness: not while the database hangs
            assert c.get("/livez").json() == {"status": "alive"}  # liveness: the process answers
            metrics = c.get("/metrics", headers=VIEWER_H)  # still answers, without the node series
            assert metrics.status_code == 200 and "oomguard_manager_database_up 0.0" in metrics.text
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        back = lambda: c.post(REPORTS, json=envelope("n", fixture_report()), headers=AGENT_H).status_code == 200  # noqa: E731
        wait_until(back, interval=0.5, what="writes to come back")
        assert c.get("/healthz").status_code == 200
    lines = episode_lines(caplog)
    starts = [li for li in lines if "failing" in li]
    assert starts and all("(timeout)" in li for li in starts) and len(starts) <= 2, lines  # reads and writes
    assert any("writes work again" in li for li in lines), lines


def _request(port: int, method: str, path: str, body: bytes | None = None) -> int:
    """One request to a real manager on a connection of its own: its status (0: no answer)."""
    headers = {**(AGENT_H if method == "POST" else VIEWER_H), "Content-Type": "application/json"}
    return one_request(port, method, path, body, headers)


@pytest.mark.slow
def test_a_hung_postgresql_is_one_log_line_per_fault_not_a_traceback_per_request(own_pg: PostgresServer) -> None:
    """Issue 37, item 6: while PostgreSQL hung, a real manager's log had 22 full tracebacks in 84 s
    ("Future exception was never retrieved": /healthz's abandoned checks). Now: the episode's lines
    (reads, writes: each once when it starts, once when it ends), and no traceback, whatever the
    requests meanwhile (health checks, reports, reads, pages, metrics)."""
    import concurrent.futures

    url = own_pg.create_db("faults")
    manager = ManagerProcess(url).start()
    body = json.dumps(envelope("n", fixture_report())).encode()
    try:
        assert _request(manager.port, "POST", REPORTS, body) == 200
        stopped = own_pg.cluster_pids()
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            # Reads and writes hold the pool's open connections (hung) until the reads' episode is
            # logged; then each health check needs a new connection, which fails (connect_timeout,
            # 3 s) after the check's own 2 s answer, and a read in between (which fails the same way)
            # leaves the check to fail with nobody waiting: what a monitor probing now and then does.
            asks: list[tuple[str, str, bytes | None]] = [("POST", REPORTS, body)] * 4
            asks += [("GET", "/api/v1/nodes", None), ("GET", "/metrics", None), ("GET", "/nodes/n", None)] * 2
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                others = pool.map(lambda a: _request(manager.port, *a), asks)
                wait_until(lambda: "database reads failing" in manager.log(), interval=0.2, what="a failed read")
                health = []
                for _ in range(3):
                    health.append(_request(manager.port, "GET", "/healthz"))
                    assert _request(manager.port, "GET", "/api/v1/nodes") == 503
                statuses = list(others)
            assert set(health) == {503} and set(statuses[:4]) == {503}, (health, statuses)  # never a hang
            assert 500 not in statuses and 0 not in statuses, statuses
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        wait_until(lambda: _request(manager.port, "POST", REPORTS, body) == 200, interval=0.5, what="writes back")
        wait_until(lambda: _request(manager.port, "GET", "/healthz") == 200, interval=0.5, what="/healthz back")
        wait_until(lambda: "reads work again" in manager.log(), interval=0.2, what="the reads' episode to end")
    finally:
        manager.stop()
    log = manager.log()
    assert "Traceback" not in log and "never retrieved" not in log, log[-4000:]
    faults = [li for li in log.splitlines() if "database reads failing" in li or "database writes failing" in li]
    assert 1 <= len(faults) <= 4, log[-4000:]  # one per episode and direction (a kind may change once)
    served = [li for li in log.splitlines() if "applied revision" not in li]  # the start's migration, a line each
    assert len(served) <= 12, log  # the start line, the episodes' starts and ends: nothing per request


def test_a_failure_nobody_retrieved_is_one_line_not_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """The server's loop handler (``server.AcceptFailed``), the safety net under the fix above: a
    future or task whose exception nobody awaited any more is one warning line; anything else is
    asyncio's as before."""
    import asyncio
    import gc

    from oomguard.manager.web.server import AcceptFailed

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(AcceptFailed())
        future = asyncio.get_running_loop().create_future()
        future.set_exception(TimeoutError("no answer from the database\nsecond line"))
        del future
        gc.collect()

    with caplog.at_level("WARNING"):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["Future exception was never retrieved: TimeoutError: no answer from the database"]
    assert not any(r.exc_info for r in caplog.records)


def test_a_stopped_postgresql_is_503_unavailable_then_recovers(own_pg: PostgresServer) -> None:
    url = own_pg.create_db("gone")
    with client_for(url, db_timeout_s=2.0) as c:
        assert c.post(REPORTS, json=envelope("n", fixture_report()), headers=AGENT_H).status_code == 200
        assert own_pg.proc is not None
        own_pg.proc.send_signal(signal.SIGINT)  # fast shutdown: every connection is closed
        own_pg.proc.wait(30)
        r = c.get("/api/v1/nodes", headers=VIEWER_H)
        assert r.status_code == 503 and "unavailable" in r.text, r.text  # refused: not a timeout's "timeout"
        assert c.post(REPORTS, json=envelope("n", fixture_report()), headers=AGENT_H).status_code == 503
        assert c.get("/healthz").json()["database"] == "unavailable"
        assert metric(c, "unavailable") >= 2
        _restart(own_pg)
        back = lambda: c.post(REPORTS, json=envelope("n", fixture_report()), headers=AGENT_H).status_code == 200  # noqa: E731
        wait_until(back, interval=0.3, what="writes to come back")
        assert c.get("/healthz").status_code == 200
        assert c.get("/api/v1/nodes", headers=VIEWER_H).json()["total"] == 1


def test_statement_and_pool_timeouts_are_timeouts(own_pg: PostgresServer) -> None:
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    from oomguard.manager.store.health import classify

    engine = make_engine(own_pg.create_db("slow"), timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(DBAPIError) as statement, engine.connect() as conn:
        conn.execute(text("SELECT pg_sleep(10)"))
    assert time.monotonic() - start < 10 and classify(statement.value) == "timeout"  # before pg_sleep's own end
    held = [engine.connect() for _ in range(30)]  # pool_size 10 + max_overflow 20
    try:
        with pytest.raises(PoolTimeout) as pool:  # the pool's own timeout ended the wait (it would not end)
            engine.connect()
        assert classify(pool.value) == "timeout"
    finally:
        for conn in held:
            conn.close()
        engine.dispose()


# -- the command line ------------------------------------------------------------------------


@pytest.mark.slow
def test_one_start_line_with_the_url_and_the_database(tmp_path: Path) -> None:
    first = ManagerProcess(f"sqlite:///{tmp_path / 's.db'}").start()
    first.stop()
    said = [li for li in first.log().splitlines() if "applied revision" not in li]  # the migration's lines apart
    line = [li for li in said if li.startswith("oomguard manager:")]
    assert line == [
        f"oomguard manager: serving http://127.0.0.1:{first.port} (database sqlite:///{tmp_path / 's.db'}; "
        "Host allowed: 127.0.0.1, localhost, ::1; at most 1000 connections)"
    ]


@pytest.mark.slow
def test_a_port_in_use_is_exit_2_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "oomguard",
                "manager",
                "--db",
                f"sqlite:///{tmp_path / 'p.db'}",
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")},
        )
    assert proc.returncode == 2, proc.stderr
    said = "\n".join(li for li in proc.stderr.splitlines() if "applied revision" not in li)  # a new database's
    assert said.strip() == f"oomguard: error: --port: port {port} is already in use on 127.0.0.1"


def test_the_caddy_example_is_valid(tmp_path: Path) -> None:
    import shutil

    caddy = shutil.which("caddy")
    if caddy is None:
        pytest.skip("needs caddy (scripts/system-deps.sh installs it)")
    proc = subprocess.run(
        [
            caddy,
            "validate",
            "--adapter",
            "caddyfile",
            "--config",
            str(Path(__file__).resolve().parents[2] / "deploy/proxy/Caddyfile"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)},
    )
    assert proc.returncode == 0 and "Valid configuration" in proc.stdout + proc.stderr, proc.stderr[-2000:]
