"""Workers speak only for themselves, and limits cannot be turned against the honest (issue 22,
items 3 and 4): per-node tokens from a fleet secret (``oomguard manager token NODE``), bound to
their node (403 for another), rotation with two secrets, the new-node cap of the fleet-wide token
(on SQLite and PostgreSQL, counted in the shared table), failed-token limits that never refuse a
right token, a global failure budget that rotating addresses do not escape, and ``X-Forwarded-*``
believed from ``--trusted-proxy`` addresses only. Real manager processes over real sockets for
the command line and the wire; the app in process where the clock must move."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from fastapi.testclient import TestClient

from oomguard.manager.app import create_app
from oomguard.manager.db import migrate
from oomguard.manager.settings import Settings
from oomguard.manager.web.credentials import node_token, token_node
from oomguard.manager.web.forget import forget_token
from oomguard.manager.web.proxies import address, client_address
from oomguard.manager.web.sessions import FailureLimiter
from tests.conftest import run_oomguard
from tests.helpers.fuzz import FAST
from tests.helpers.manager import (
    AGENT,
    AGENT_H,
    VIEWER,
    VIEWER_H,
    Clock,
    ManagerProcess,
    db_url_of,
    envelope,
    fixture_report,
    make_store,
    refused_at_start,
)
from tests.helpers.wait import wait_until

SECRET = "fleet-secret-0123456789abcdef"
OLD_SECRET = "old-fleet-secret-0123456789"
REPORTS, EVENTS = "/api/v1/reports", "/api/v1/events"
HOUR_MS = 3_600_000
T0 = 1_800_000_000_000


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def event_body(node: str, event: dict[str, Any]) -> dict[str, Any]:
    return {"node": node, "id": uuid.uuid4().hex, "event": event}


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    url = db_url_of(request.param, tmp_path, "cred_")
    migrate(url)
    return url


def app_client(db_url: str, clock: Clock | None = None, **settings: Any) -> TestClient:
    """The app on *db_url* in process (its store on *clock*), seen from the address ``10.9.9.9``."""
    base: dict[str, Any] = {"db_url": db_url, "viewer_token": VIEWER}
    app = create_app(Settings(**{**base, **settings}), store=make_store(db_url, clock or Clock(T0)))
    return TestClient(app, base_url="http://localhost", client=("10.9.9.9", 40000))


# -- per-node tokens -----------------------------------------------------------------------------


def test_a_node_token_names_its_node_and_only_its_secrets_verify_it() -> None:
    token = node_token(SECRET, "gpu-07.example")
    assert token.startswith("ogn1.gpu-07.example.") and token.isascii() and " " not in token
    assert token_node(token, [SECRET]) == "gpu-07.example"
    assert token_node(token, [OLD_SECRET, SECRET]) == "gpu-07.example"  # any secret of a rotation
    assert token_node(token, [OLD_SECRET]) is None
    assert token_node(token, []) is None
    forged = token.replace("gpu-07.example", "gpu-08.example")  # the MAC of another name
    assert token_node(forged, [SECRET]) is None
    for junk in ("", "ogn1.", "ogn1.x", "ogn1..abc", token[:-1], token + "A", "ogn1.-bad." + token[-43:]):
        assert token_node(junk, [SECRET]) is None, junk
    with pytest.raises(ValueError, match="not a node name"):
        node_token(SECRET, "../etc")


@pytest.mark.parametrize("route", ["report", "start", "oom-kill", "gate", "heartbeat"])
def test_a_node_token_writes_its_own_node_and_is_403_for_any_other(db_url: str, route: str) -> None:
    """The attack: a worker holding node A's token overwrites node B's state, fakes B's OOM kills,
    refuses B at the gate or keeps B alive. Each write for B with A's token is 403 and stores nothing."""
    events: dict[str, dict[str, Any]] = {
        "start": {"event": "start"},
        "oom-kill": {"event": "exit", "reason": "oom-kill", "signal": 9, "pid": 42},
        "gate": {"event": "gate", "step": "check", "passed": False, "exit_code": 3, "message": "x"},
        "heartbeat": {"event": "heartbeat", "interval_s": 60},
    }

    def write(node: str, token: str) -> Any:
        if route == "report":
            return c.post(REPORTS, json=envelope(node, fixture_report()), headers=bearer(token))
        return c.post(EVENTS, json=event_body(node, events[route]), headers=bearer(token))

    with app_client(db_url, fleet_secrets=(SECRET,)) as c:
        a, b = node_token(SECRET, "node-a"), node_token(SECRET, "node-b")
        assert write("node-b", b).status_code == 200
        before = c.get("/api/v1/nodes/node-b", headers=VIEWER_H).json()
        refused = write("node-b", a)
        assert refused.status_code == 403, refused.text
        assert "another node's" in refused.json()["detail"] and "node-a" not in refused.text  # no echo
        assert write("node-a", a).status_code == 200
        after = c.get("/api/v1/nodes/node-b", headers=VIEWER_H).json()
        for key in ("events_total", "history_count", "status", "last_seen"):
            assert after[key] == before[key], key
        assert write("node-b", "ogn1.node-b." + "A" * 43).status_code == 401  # a forged MAC: no credential
        assert write("node-c", AGENT).status_code == 401  # no fleet-wide token on this manager


def test_rotation_two_secrets_verify_and_the_first_signs(db_url: str) -> None:
    new = "new-fleet-secret-0123456789"
    with app_client(db_url, fleet_secrets=(new, OLD_SECRET)) as c:  # mid-rollover
        for secret in (new, OLD_SECRET):
            body = envelope("rolling", fixture_report())
            assert c.post(REPORTS, json=body, headers=bearer(node_token(secret, "rolling"))).status_code == 200
        stranger = node_token("someone-elses-secret-0123", "rolling")
        assert c.post(REPORTS, json=envelope("rolling", fixture_report()), headers=bearer(stranger)).status_code == 401
    with app_client(db_url, fleet_secrets=(new,)) as c:  # the old secret retired
        old = bearer(node_token(OLD_SECRET, "rolling"))
        assert c.post(REPORTS, json=envelope("rolling", fixture_report()), headers=old).status_code == 401
        fresh = bearer(node_token(new, "rolling"))
        assert c.post(REPORTS, json=envelope("rolling", fixture_report()), headers=fresh).status_code == 200
    out = run_oomguard("manager", "token", "rolling", env={"OOMGUARD_FLEET_SECRETS": f"{new},{OLD_SECRET}"})
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout == node_token(new, "rolling") + "\n"  # the first secret signs
    flags = run_oomguard("manager", "token", "rolling", "--fleet-secret", OLD_SECRET, "--fleet-secret", new)
    assert flags.stdout == node_token(OLD_SECRET, "rolling") + "\n"  # flags beat the variable, first signs


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["token", "n1"], {}, "manager token: needs the fleet secret: --fleet-secret or OOMGUARD_FLEET_SECRETS"),
        (["token"], {"OOMGUARD_FLEET_SECRETS": SECRET}, "manager token: needs the node's name"),
        (["token", "../x"], {"OOMGUARD_FLEET_SECRETS": SECRET}, "manager token: NODE: not a node name"),
        (["token", "n1", "--fleet-secret", "short"], {}, "--fleet-secret: at least 16 characters"),
        (["token", "n1"], {"OOMGUARD_FLEET_SECRETS": "a" * 20 + " b" * 9}, "--fleet-secret: only visible ASCII"),
        (["tokens", "n1"], {}, "expected one of token, migrate, revoke, unrevoke, revoked, got 'tokens'"),
        (["--trusted-proxy", "10.0.0.300"], {}, "--trusted-proxy: '10.0.0.300' is not an address or a network"),
        ([], {"OOMGUARD_TRUSTED_PROXIES": "10.0.0.0/8, nope"}, "OOMGUARD_TRUSTED_PROXIES: 'nope' is not an address"),
        (["--max-new-nodes", "0"], {}, "--max-new-nodes: must be 1 to 1000000, got 0"),
        (["--max-new-nodes", "lots"], {}, "--max-new-nodes: expected a whole number, got 'lots'"),
        ([], {"OOMGUARD_MAX_CONNECTIONS_PER_CLIENT": "0"}, "--max-connections-per-client: must be 1 to 1000000"),
        (["--max-connections-per-client", "-3"], {}, "--max-connections-per-client: expected a whole number"),
        (["--agent-token", "ogn1.node-a.xyz0123456789abc"], {}, "--agent-token: must not start with 'ogn1.'"),
        (["--fleet-secret", SECRET, "--agent-token", SECRET], {}, "--agent-token and --fleet-secret must differ"),
        (
            ["--host", "0.0.0.0", "--viewer-token", VIEWER],
            {},
            "without both an agent credential (--fleet-secret or --agent-token)",
        ),
    ],
)
def test_bad_credential_and_proxy_flags_are_one_line_exit_2(
    tmp_path: Path,
    argv: list[str],
    env: dict[str, str],
    message: str,
    clean_env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command line in process (``oomguard.cli.main``, as ``python -m oomguard`` runs it)."""
    refused_at_start(tmp_path, argv, env, message, monkeypatch, capsys)


@pytest.mark.slow
def test_flag_errors_of_a_real_process_are_one_line(tmp_path: Path) -> None:
    cases = [
        (["token", "n1"], {}, "oomguard: error: manager token: needs the fleet secret"),
        (["--trusted-proxy", "10.0.0.0/33"], {}, "oomguard: error: --trusted-proxy: '10.0.0.0/33' is not an address"),
        ([], {"OOMGUARD_MAX_NEW_NODES": "2000000"}, "oomguard: error: --max-new-nodes: must be 1 to 1000000"),
    ]
    for argv, env, message in cases:
        out = run_oomguard("manager", "--db", f"sqlite:///{tmp_path / 'x.db'}", *argv, env=env)
        assert out.returncode == 2 and out.stderr.startswith(message) and out.stderr.count("\n") == 1, out.stderr


# -- the new-node cap ----------------------------------------------------------------------------


def test_the_fleet_token_creates_at_most_max_new_nodes_an_hour_shared_by_replicas(db_url: str) -> None:
    clock = Clock(T0)
    settings = {"agent_token": AGENT, "fleet_secrets": (SECRET,), "max_new_nodes": 3}
    with app_client(db_url, clock, **settings) as c, app_client(db_url, Clock(T0), **settings) as replica:
        for i in range(3):
            assert c.post(REPORTS, json=envelope(f"n{i}", fixture_report()), headers=AGENT_H).status_code == 200
        refused = c.post(REPORTS, json=envelope("n3", fixture_report()), headers=AGENT_H)
        assert refused.status_code == 429 and "at most 3 new nodes an hour" in refused.json()["detail"]
        assert 0 < int(refused.headers["retry-after"]) <= 3600
        assert c.post(EVENTS, json=event_body("n4", {"event": "start"}), headers=AGENT_H).status_code == 429
        # the other replica counts the shared table: it refuses a fourth node too
        assert replica.post(REPORTS, json=envelope("n5", fixture_report()), headers=AGENT_H).status_code == 429
        # known nodes are not new; a node's own token is bound to its node and not capped
        assert c.post(REPORTS, json=envelope("n0", fixture_report()), headers=AGENT_H).status_code == 200
        own = bearer(node_token(SECRET, "n6"))
        assert c.post(REPORTS, json=envelope("n6", fixture_report()), headers=own).status_code == 200
        names = {n["name"] for n in c.get("/api/v1/nodes", headers=VIEWER_H).json()["nodes"]}
        assert names == {"n0", "n1", "n2", "n6"}
        clock.t += HOUR_MS + 1000  # the hour has passed for the first three
        assert c.post(REPORTS, json=envelope("n3", fixture_report()), headers=AGENT_H).status_code == 200


def test_the_cap_holds_for_concurrent_new_nodes(db_url: str) -> None:
    """Requests in flight are counted by the replica that admitted them, before their commit."""
    with app_client(db_url, agent_token=AGENT, max_new_nodes=5) as c:
        bodies = [envelope(f"burst-{i}", fixture_report()) for i in range(20)]
        with ThreadPoolExecutor(10) as pool:
            codes = list(pool.map(lambda b: c.post(REPORTS, json=b, headers=AGENT_H).status_code, bodies))
        assert Counter(codes) == {200: 5, 429: 15}
        assert c.get("/api/v1/nodes", headers=VIEWER_H).json()["total"] == 5


def test_a_restarted_manager_looks_up_none_of_the_nodes_it_read_at_start(db_url: str) -> None:
    """At start the manager reads the nodes' names and ids once (``app.warm``): after a restart the
    first report of each known node makes no lookup of it (the new-node cap's read, the writer's
    node id); a new node's first report still does, and still counts against the cap."""
    with app_client(db_url, agent_token=AGENT) as c:
        for i in range(5):
            assert c.post(REPORTS, json=envelope(f"old-{i}", fixture_report()), headers=AGENT_H).status_code == 200
    client = app_client(db_url, agent_token=AGENT, max_new_nodes=6)  # the five old ones were new this hour
    app: Any = client.app
    lookups: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if "FROM nodes" in statement and "nodes.name =" in statement:
            lookups.append(str(parameters))

    with client as c:
        wait_until(lambda: app.state.new_nodes.known("old-0"), what="the node names read at start")
        sqlalchemy.event.listen(app.state.store.engine, "before_cursor_execute", seen)
        for i in range(5):
            assert c.post(REPORTS, json=envelope(f"old-{i}", fixture_report()), headers=AGENT_H).status_code == 200
        assert lookups == []
        assert c.post(REPORTS, json=envelope("new-0", fixture_report()), headers=AGENT_H).status_code == 200
        assert lookups and all("new-0" in p for p in lookups), lookups
        assert c.post(REPORTS, json=envelope("new-1", fixture_report()), headers=AGENT_H).status_code == 429
        sqlalchemy.event.remove(app.state.store.engine, "before_cursor_execute", seen)


# -- failed-token limits -------------------------------------------------------------------------


def test_the_limiter_counts_failures_per_client_and_globally() -> None:
    limiter = FailureLimiter(burst=3, refill_s=10, global_per_minute=6)
    assert [limiter.failed("a", now=0) for _ in range(4)] == [0, 0, 0, 10]
    assert [limiter.failed(f"r{i}", now=0) for i in range(4)] == [0, 0, 10, 10]  # 6 a minute in all
    assert limiter.retry_after("fresh", now=0) == 0  # its own bucket is full ...
    assert limiter.failed("fresh", now=0) == 10  # ... but the global one is spent: 429
    assert limiter.failed("fresh", now=20) == 0  # one back every 10 s


def test_a_right_token_passes_whatever_the_wrong_ones_did(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    migrate(url)
    with app_client(url, agent_token=AGENT, login_burst=3, login_refill_s=600, failed_tokens_per_minute=5) as c:
        codes = [c.get("/metrics", headers=bearer("wrong")).status_code for _ in range(6)]
        assert codes == [401, 401, 401, 429, 429, 429]
        assert c.get("/metrics", headers=VIEWER_H).status_code == 200  # the same address, right token
        assert c.post(REPORTS, json=envelope("n", fixture_report()), headers=AGENT_H).status_code == 200


def _raw(port: int, source: str, request: bytes) -> int:
    """One request from the loopback address *source*; the answer's status (0: no answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
        s.sendall(request)
        answer = b""
        while b"\r\n" not in answer:
            chunk = s.recv(4096)
            if not chunk:
                return 0
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def _post(token: str, body: dict[str, Any], *headers: str) -> bytes:
    data = json.dumps(body).encode()
    extra = "".join(f"{h}\r\n" for h in headers)
    return (
        f"POST {REPORTS} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n{extra}"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode() + data


def _get(path: str, token: str, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n{extra}Connection: close\r\n\r\n"
    ).encode()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    """A real manager with the fleet-wide token, a fleet secret, and 127.0.0.1 as its one trusted
    proxy. Its failure budget is shared by this module's tests, which run in file order on one
    worker (``make test``: ``--dist loadfile``): the flood that spends it comes last."""
    args = ("--fleet-secret", SECRET, "--trusted-proxy", "127.0.0.1")
    server = ManagerProcess(f"sqlite:///{tmp_path_factory.mktemp('live') / 'm.db'}", *args).start()
    yield server
    server.stop()


def test_a_good_agent_beside_a_bad_client_on_one_address_is_never_429(tmp_path: Path) -> None:
    """The finding: agents with the right token got 429 (and spooled) because another process on
    their address sent wrong ones."""
    url = f"sqlite:///{tmp_path / 'g.db'}"
    migrate(url)
    app = create_app(Settings(db_url=url, agent_token=AGENT, viewer_token=VIEWER), store=make_store(url, Clock(T0)))
    with TestClient(app, base_url="http://localhost", client=("127.77.0.1", 40000)) as c:

        def bad() -> int:
            return int(c.post(REPORTS, json=envelope("x", {}), headers=bearer("wrong-token")).status_code)

        def good() -> int:
            return int(c.post(REPORTS, json=envelope("good", fixture_report()), headers=AGENT_H).status_code)

        codes = [(bad(), good()) for _ in range(15)]
        assert [b for b, _ in codes] == [401] * 10 + [429] * 5  # the bad client's bucket: 10, then 429
        assert [g for _, g in codes] == [200] * 15  # interleaved, same address: never 429


@pytest.mark.slow
def test_x_forwarded_for_counts_only_from_a_trusted_proxy(live: ManagerProcess) -> None:
    """An untrusted client (127.0.0.9) cannot pick its bucket with X-Forwarded-For; the trusted
    proxy (127.0.0.1) can, each forwarded client in its own bucket."""
    untrusted = [
        _raw(live.port, "127.0.0.9", _get("/metrics", "wrong", f"X-Forwarded-For: 198.51.100.{i}")) for i in range(12)
    ]
    assert untrusted == [401] * 10 + [429] * 2  # one bucket, whatever the header said
    via_proxy = [
        _raw(live.port, "127.0.0.1", _get("/metrics", "wrong", f"X-Forwarded-For: 203.0.113.7, 198.18.0.{i}"))
        for i in range(12)
    ]
    assert via_proxy == [401] * 12  # 12 clients, one failure each
    spoofed_chain = [
        _raw(live.port, "127.0.0.1", _get("/metrics", "wrong", f"X-Forwarded-For: 10.0.0.{i}, 198.18.1.1"))
        for i in range(12)
    ]
    assert spoofed_chain == [401] * 10 + [429] * 2  # the right-most untrusted hop is the client, not the left


def test_the_client_address_rule() -> None:
    trusted = [ipaddress_network("10.0.0.0/8"), ipaddress_network("127.0.0.1/32")]
    assert client_address("192.0.2.1", ["198.51.100.1"], trusted) == "192.0.2.1"  # untrusted peer
    assert client_address("10.1.1.1", ["198.51.100.1, 10.2.2.2"], trusted) == "198.51.100.1"
    assert client_address("10.1.1.1", ["1.1.1.1", "198.51.100.1"], trusted) == "198.51.100.1"  # two headers
    assert client_address("10.1.1.1", ["10.3.3.3, 10.2.2.2"], trusted) == "10.3.3.3"  # all trusted: left-most
    assert client_address("10.1.1.1", [], trusted) == "10.1.1.1"
    assert client_address("::ffff:10.1.1.1", ["[2001:db8::1]:443"], trusted) == "2001:db8::1"  # mapped peer
    assert client_address("10.1.1.1", ["junk"], trusted) == "junk"
    assert address("198.51.100.1:8080") == address("198.51.100.1") and address("nope") is None


def ipaddress_network(text: str) -> Any:
    import ipaddress

    return ipaddress.ip_network(text)


# -- the forget form behind a proxy --------------------------------------------------------------


@pytest.mark.parametrize(("peer", "status"), [("192.0.2.50", 403), ("10.0.0.5", 303)])
def test_the_forget_form_believes_x_forwarded_host_only_from_a_trusted_proxy(
    tmp_path: Path, peer: str, status: int
) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    migrate(url)
    admin = "admin-token-0123456789"
    settings = Settings(
        db_url=url,
        agent_token=AGENT,
        viewer_token=VIEWER,
        admin_token=admin,
        trusted_proxies=(ipaddress_network("10.0.0.0/8"),),
    )
    app = create_app(settings, store=make_store(url, Clock(T0)))
    with TestClient(app, base_url="http://localhost", client=(peer, 40000)) as c:
        assert c.post(REPORTS, json=envelope("gone", fixture_report()), headers=AGENT_H).status_code == 200
        login = c.post("/login", content=f"token={VIEWER}", follow_redirects=False)
        session = login.cookies["oomguard_session"]
        fields = {"csrf": forget_token(session, "gone"), "confirm": "gone", "token": admin}
        headers = {
            "Origin": "https://oomguard.example.com",
            "X-Forwarded-Host": "oomguard.example.com",
            "X-Forwarded-Proto": "https",
        }
        answer = c.post("/nodes/gone/forget", data=fields, headers=headers, follow_redirects=False)
        assert answer.status_code == status, answer.text[:300]


# -- the agent needs no change -------------------------------------------------------------------


@pytest.mark.slow
def test_an_agent_with_its_own_token_delivers_and_with_another_nodes_exits_77(
    live: ManagerProcess, tmp_path: Path
) -> None:
    """``oomguard agent`` sends OOMGUARD_AGENT_TOKEN as it always did: a node's own token is
    delivered (0); another node's is refused (403): exit 77, the report in rejected/ until moved back."""
    env = {"OOMGUARD_AGENT_TOKEN": node_token(SECRET, "worker-1")}
    argv = ("agent", "--once", "--no-gpu", "--manager", live.url, "--node")
    ok = run_oomguard(*argv, "worker-1", "--spool", str(tmp_path / "ok"), env=env)
    assert ok.returncode == 0, ok.stderr
    spool = tmp_path / "bad"
    refused = run_oomguard(*argv, "worker-2", "--spool", str(spool), env=env)
    assert refused.returncode == 77, refused.stderr
    assert "token refused by the manager (403" in refused.stderr
    kept = sorted((spool / "rejected").glob("*.json"))
    assert len(kept) == 1 and json.loads((spool / "rejected" / (kept[0].name + ".why")).read_text())["status"] == 403
    # moved back by hand with the right token, it is delivered
    kept[0].rename(spool / kept[0].name)
    env2 = {"OOMGUARD_AGENT_TOKEN": node_token(SECRET, "worker-2")}
    again = run_oomguard(*argv, "worker-2", "--spool", str(spool), env=env2)
    assert again.returncode == 0 and not list(spool.glob("*.json")), again.stderr


@pytest.mark.slow
def test_the_start_line_warns_about_the_fleet_wide_token(live: ManagerProcess, tmp_path: Path) -> None:
    assert "oomguard: warning: the fleet-wide --agent-token is on: whoever holds it may write any node's" in live.log()
    quiet = ManagerProcess(f"sqlite:///{tmp_path / 'q.db'}", "--fleet-secret", SECRET, tokens=False).start()
    try:
        body = envelope("q-node", fixture_report())
        assert _raw(quiet.port, "127.0.0.1", _post(node_token(SECRET, "q-node"), body)) == 200
        assert _raw(quiet.port, "127.0.0.1", _post(AGENT, envelope("q-node", fixture_report()))) == 401
    finally:
        quiet.stop()
    assert "fleet-wide" not in quiet.log() and "serving http://127.0.0.1" in quiet.log()


@pytest.mark.slow
def test_6000_wrong_tokens_from_rotating_addresses_draw_429_and_a_right_token_passes(live: ManagerProcess) -> None:
    """The attack: 6,000 wrong tokens, each from its own 127.x address, drew no 429 (the limit was
    per address). The global budget (120 a minute) answers them 429; right tokens pass throughout."""
    wrong = _post("wrong-token", envelope("x", {}))
    n = 1000 if FAST else 6000  # the 6,000 in make test; the quick loop sends a sixth
    sources = [f"127.{1 + i // 62500}.{i // 250 % 250 + 1}.{i % 250 + 1}" for i in range(n)]
    right = _post(AGENT, envelope("honest", fixture_report()))
    honest: list[int] = []

    def agent() -> None:
        for i in range(30):
            honest.append(_raw(live.port, sources[i * (n // 30)], _post(AGENT, envelope("honest", fixture_report()))))

    beside = threading.Thread(target=agent)
    beside.start()
    with ThreadPoolExecutor(8) as pool:
        codes = Counter(pool.map(lambda src: _raw(live.port, src, wrong), sources))
    beside.join()
    assert set(codes) <= {401, 429} and codes[429] >= n - 300, codes
    assert honest == [200] * 30  # from the same rotating addresses, during the flood
    assert _raw(live.port, "127.200.0.1", right) == 200
    node_tok = node_token(SECRET, "own-node")
    assert _raw(live.port, sources[-1], _post(node_tok, envelope("own-node", fixture_report()))) == 200
    assert _raw(live.port, sources[-1], _get("/api/v1/nodes", VIEWER)) == 200
