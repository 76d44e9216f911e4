"""The agent's client side against a real HTTP server (a small fake manager in a thread)."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from oomguard.agent import (
    NODE_NAME_CHARS,
    EventForwarder,
    Sender,
    Spool,
    default_node_name,
    default_spool_dir,
    run_agent,
    sanitize_node_name,
)
from oomguard.agent.loop import EXIT_INTERNAL, MAX_INTERNAL_ERRORS
from oomguard.errors import EXIT_OK, EXIT_SPOOLED, UsageError

TOKEN = "s3cret-token"


class FakeManager:
    """Records every POST, stores each id once (like the real manager), answers ``status``;
    ``drop_next`` requests are stored and then the socket is closed without an answer."""

    def __init__(self) -> None:
        self.status = 200
        self.reject_ids: set[str] = set()  # answered 422
        self.drop_next = 0
        self.requests: list[dict[str, Any]] = []
        self.stored: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def received_ids(self) -> list[str]:
        return [r["body"]["id"] for r in self.requests]

    def start(self, port: int = 0) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def _handler_for(manager: FakeManager) -> type[BaseHTTPRequestHandler]:
    """The request handler of *manager*: it records, stores, drops and answers as told."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, payload: dict[str, Any], extra: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            with manager.lock:
                manager.requests.append({"method": "GET", "path": self.path, "body": {"id": None}})
            self._answer(200, {"looks": "like success"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with manager.lock:
                manager.requests.append(
                    {
                        "method": "POST",
                        "path": self.path,
                        "auth": self.headers.get("Authorization"),
                        "ctype": self.headers.get("Content-Type"),
                        "body": body,
                    }
                )
                status = 422 if body["id"] in manager.reject_ids else manager.status
                if status == 200 and body["id"] not in manager.stored:
                    manager.stored[body["id"]] = body
                    manager.order.append(body["id"])
                drop = status == 200 and manager.drop_next > 0
                if drop:
                    manager.drop_next -= 1
            if drop:  # stored, but the answer never arrives
                self.close_connection = True
                return
            extra = {"Location": "https://elsewhere.example/api"} if 300 <= status < 400 else None
            self._answer(status, {"error": f"fake answer {status}"} if status >= 300 else {"stored": True}, extra)

    return Handler


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """urllib honours *_proxy variables: the fake manager must be reached directly."""
    for key in list(os.environ):
        if key.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
            monkeypatch.delenv(key)


@pytest.fixture
def manager() -> Iterator[FakeManager]:
    m = FakeManager()
    m.start()
    yield m
    m.stop()


@pytest.fixture
def dead_url() -> str:
    """A port with nothing listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class Logs(list[str]):
    def __call__(self, line: str) -> None:
        assert "\n" not in line and "Traceback" not in line
        self.append(line)


def names(paths: list[str]) -> list[str]:
    return [os.path.basename(p) for p in paths]


def agent_args(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """``run_agent`` keywords for a loop against nothing (override *manager* to reach one)."""
    args: dict[str, Any] = {
        "manager": "http://127.0.0.1:9",
        "token": TOKEN,
        "node": "n1",
        "interval": 10,
        "once": False,
        "spool_dir": str(tmp_path / "spool"),
        "make_report": dict,
        "log": Logs(),
    }
    return {**args, **overrides}


def put_reports(spool: Spool, n: int) -> list[str]:
    ids = [f"id{i:03d}" for i in range(n)]
    for i in ids:
        spool.put("report", {"node": "n1", "id": i, "report": {"i": i}, "interval_s": None})
    return ids


# --- delivery ---------------------------------------------------------------------------


def test_report_and_event_delivered_with_auth_and_body_shape(manager: FakeManager, tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / "spool"))
    sender = Sender(manager.url + "/", TOKEN, spool, log=Logs())
    assert sender.report("node-1", {"memory": {"effective_bytes": 1}}, 60.0) is True
    assert sender.event("node-1", {"event": "start", "pid": 7}) is True
    rep, ev = manager.requests
    assert rep["path"] == "/api/v1/reports" and ev["path"] == "/api/v1/events"
    assert rep["auth"] == ev["auth"] == f"Bearer {TOKEN}"
    assert rep["ctype"] == "application/json"
    assert set(rep["body"]) == {"node", "id", "report", "interval_s", "time"}
    assert rep["body"]["time"].endswith("Z")  # when it was made: a spooled report keeps its time
    assert rep["body"]["node"] == "node-1" and rep["body"]["interval_s"] == 60.0
    assert rep["body"]["report"] == {"memory": {"effective_bytes": 1}}
    assert set(ev["body"]) == {"node", "id", "event"} and ev["body"]["event"] == {"event": "start", "pid": 7}
    for body in (rep["body"], ev["body"]):
        assert len(body["id"]) == 32 and int(body["id"], 16) >= 0
    assert rep["body"]["id"] != ev["body"]["id"]
    assert spool.pending() == []


@pytest.mark.parametrize("suffix", ["", "/", "//"])
def test_manager_url_with_path_prefix_and_slashes(manager: FakeManager, tmp_path: Path, suffix: str) -> None:
    sender = Sender(manager.url + "/fleet" + suffix, TOKEN, Spool(str(tmp_path)), log=Logs())
    assert sender.post("event", {"node": "n", "id": "x", "event": {}}) == "ok"
    assert manager.requests[0]["path"] == "/fleet/api/v1/events"


# --- manager down, restart, replay ------------------------------------------------------


def test_manager_down_spools_and_replays_in_order_after_restart(
    manager: FakeManager, dead_url: str, tmp_path: Path
) -> None:
    d = str(tmp_path / "spool")
    logs = Logs()
    sender = Sender(dead_url, TOKEN, Spool(d), log=logs)
    assert sender.report("n1", {"r": 1}, 30) is False
    assert sender.event("n1", {"event": "start"}) is False
    assert sender.report("n1", {"r": 2}, 30) is False
    assert sender.event("n1", {"event": "exit"}) is False
    assert len(logs) == 1 and "connection refused" in logs[0] and "1 item(s) spooled" in logs[0]
    files = sorted(os.listdir(d))
    assert files == [
        "000000000001-report.json",
        "000000000002-event.json",
        "000000000003-report.json",
        "000000000004-event.json",
    ]
    put_ids = [json.loads((Path(d) / f).read_text())["id"] for f in files]

    # a new process: new Spool and Sender instances, the manager is up again
    logs2 = Logs()
    sender2 = Sender(manager.url, TOKEN, Spool(d), log=logs2)
    assert sender2.flush() is True
    assert manager.received_ids() == put_ids
    assert manager.order == put_ids
    assert [r["path"] for r in manager.requests] == ["/api/v1/reports", "/api/v1/events"] * 2
    assert manager.stored[put_ids[1]]["event"] == {"event": "start"}
    assert os.listdir(d) == []
    assert logs2 == []  # this instance never saw a failure


def test_same_sender_recovers_when_the_manager_restarts(tmp_path: Path) -> None:
    m = FakeManager()
    m.start()
    port = m.port
    m.stop()  # down: nothing listens on the port any more
    logs = Logs()
    sender = Sender(f"http://127.0.0.1:{port}", TOKEN, Spool(str(tmp_path)), log=logs)
    assert sender.report("n", {"a": 1}, None) is False
    assert sender.report("n", {"a": 2}, None) is False
    m.start(port)  # back on the same port
    try:
        assert sender.report("n", {"a": 3}, None) is True
    finally:
        m.stop()
    assert [m.stored[i]["report"] for i in m.order] == [{"a": 1}, {"a": 2}, {"a": 3}]
    assert len(m.received_ids()) == len(set(m.received_ids())) == 3
    assert logs[-1] == "manager reachable again; delivered 3 spooled item(s)"


def test_answer_lost_after_store_is_retried_and_stored_once(manager: FakeManager, tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    ids = put_reports(spool, 3)
    logs = Logs()
    sender = Sender(manager.url, TOKEN, spool, log=logs)
    # the first item goes through; the second is stored but its answer is lost
    assert sender.post("report", json.loads(Path(spool.pending()[0]).read_text())) == "ok"
    spool.done(spool.pending()[0])
    manager.drop_next = 1
    assert sender.flush() is False
    assert "connection closed without an answer" in logs[0]
    assert names(spool.pending()) == ["000000000002-report.json", "000000000003-report.json"]
    assert manager.order == ids[:2]  # stored although the agent does not know it
    assert sender.flush() is True
    assert manager.received_ids() == [ids[0], ids[1], ids[1], ids[2]]
    assert manager.order == ids  # each id exactly once, in put order
    assert spool.pending() == []


# --- rejections and retries -------------------------------------------------------------


def test_422_goes_to_rejected_and_does_not_block(manager: FakeManager, tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    ids = put_reports(spool, 3)
    manager.reject_ids = {ids[1]}
    logs = Logs()
    assert Sender(manager.url, TOKEN, spool, log=logs).flush() is True
    assert manager.order == [ids[0], ids[2]]
    assert spool.pending() == []
    rejected = tmp_path / "rejected"
    assert sorted(os.listdir(rejected)) == ["000000000002-report.json", "000000000002-report.json.why"]
    assert json.loads((rejected / "000000000002-report.json").read_text())["id"] == ids[1]
    why = (rejected / "000000000002-report.json.why").read_text()
    assert "422" in why and "fake answer 422" in why
    assert len(logs) == 1 and "000000000002-report.json" in logs[0] and "rejected" in logs[0]
    # seq numbers keep counting past the rejected file, even in a new instance
    assert names([Spool(str(tmp_path)).put("event", {"id": "later"})]) == ["000000000003-event.json"]


@pytest.mark.parametrize("status", [400, 404, 409, 413, 422, 405, 410])
def test_4xx_means_rejected(manager: FakeManager, tmp_path: Path, status: int) -> None:
    manager.status = status
    sender = Sender(manager.url, TOKEN, Spool(str(tmp_path)), log=Logs())
    outcome = sender.post("report", {"node": "n", "id": "x", "report": {}, "interval_s": None})
    assert outcome.startswith(f"rejected:{status} ")
    assert "\n" not in outcome


@pytest.mark.parametrize("status", [500, 502, 503, 504, 429, 408, 401, 403, 302, 307])
def test_5xx_429_408_3xx_mean_retry(manager: FakeManager, tmp_path: Path, status: int) -> None:
    manager.status = status
    sender = Sender(manager.url, TOKEN, Spool(str(tmp_path)), log=Logs())
    outcome = sender.post("report", {"node": "n", "id": "x", "report": {}, "interval_s": None})
    assert outcome.startswith(f"retry:{status} ")
    assert [r["method"] for r in manager.requests] == ["POST"]  # a redirect is never followed


def test_503_keeps_the_queue_in_order(manager: FakeManager, tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    ids = put_reports(spool, 3)
    before = spool.pending()
    manager.status = 503
    logs = Logs()
    sender = Sender(manager.url, TOKEN, spool, log=logs)
    assert sender.flush() is False
    assert sender.flush() is False
    assert spool.pending() == before
    assert manager.received_ids() == [ids[0], ids[0]]  # stops at the first retry
    assert len(logs) == 1 and "503" in logs[0] and "3 item(s) spooled" in logs[0]  # logged once, not per try
    manager.status = 200
    assert sender.send("event", {"node": "n", "id": "ev", "event": {}}) is True
    assert manager.order == [*ids, "ev"]
    assert logs[-1] == "manager reachable again; delivered 4 spooled item(s)"


def test_network_failures_are_retry_values(dead_url: str, tmp_path: Path) -> None:
    sender = Sender(dead_url, TOKEN, Spool(str(tmp_path)), log=Logs())
    assert sender.post("report", {"id": "x"}) == "retry:connection refused"
    # a server that accepts the connection and never answers
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        slow = Sender(f"http://127.0.0.1:{s.getsockname()[1]}", TOKEN, Spool(str(tmp_path)), timeout=0.3)
        t0 = time.monotonic()
        assert slow.post("report", {"id": "x"}) == "retry:timed out"
        assert time.monotonic() - t0 < 3


def test_corrupt_spool_file_is_rejected_and_does_not_block(manager: FakeManager, tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    (tmp_path / "000000000001-report.json").write_text('{"node": "n", "id": "trunc')
    (tmp_path / "000000000002-event.json").write_text("[1, 2]")
    ids = put_reports(spool, 1)
    logs = Logs()
    assert Sender(manager.url, TOKEN, spool, log=logs).flush() is True
    assert manager.order == ids
    assert {"000000000001-report.json", "000000000002-event.json"} <= set(os.listdir(tmp_path / "rejected"))
    assert len(logs) == 2


def test_default_log_goes_to_stderr_on_one_line(
    manager: FakeManager, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manager.status = 401  # a wrong token: kept for when an operator fixes it, said once
    assert Sender(manager.url, TOKEN, Spool(str(tmp_path))).report("n", {}, None) is False
    err = capsys.readouterr().err
    assert err.startswith("oomguard agent: ") and err.count("\n") == 1 and "401" in err


def test_invalid_manager_urls(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    for url in ("ftp://host/", "file:///etc/passwd", "127.0.0.1:8080", "http://", "http://host:port/", ""):
        with pytest.raises(UsageError) as e:
            Sender(url, TOKEN, spool)
        assert str(e.value).startswith("--manager: ") and "\n" not in str(e.value)
    with pytest.raises(UsageError, match=r"^--manager: .*query"):
        Sender("http://x/?a=1", TOKEN, spool)
    with pytest.raises(UsageError, match=r"^--manager: .*http"):
        run_agent(**agent_args(tmp_path, manager="gopher://x", once=True))
    with pytest.raises(UsageError, match=r"^--token "):
        Sender("http://x", "bad\ntoken", spool)
    Sender("HTTPS://x.example:8443/", TOKEN, spool)  # accepted


# --- run_agent --------------------------------------------------------------------------


def test_run_agent_once_exit_codes(manager: FakeManager, dead_url: str, tmp_path: Path) -> None:
    d = str(tmp_path / "spool")
    calls: list[int] = []

    def make_report() -> dict[str, Any]:
        calls.append(1)
        return {"n": len(calls)}

    common: dict[str, Any] = {"token": TOKEN, "node": "n1", "once": True, "spool_dir": d, "log": Logs()}
    assert run_agent(manager=dead_url, interval=0, make_report=make_report, **common) == EXIT_SPOOLED
    assert len(os.listdir(d)) == 1
    assert run_agent(manager=manager.url, interval=300, make_report=make_report, **common) == EXIT_OK
    assert [manager.stored[i]["report"] for i in manager.order] == [{"n": 1}, {"n": 2}]  # the spooled one first
    assert [manager.stored[i]["interval_s"] for i in manager.order] == [None, 300]
    assert os.listdir(d) == []


def test_run_agent_once_propagates_a_failing_report(manager: FakeManager, tmp_path: Path) -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("probe failed")

    with pytest.raises(RuntimeError):
        run_agent(
            manager=manager.url,
            token=TOKEN,
            node="n",
            interval=0,
            once=True,
            spool_dir=str(tmp_path),
            make_report=broken,
        )


def test_run_agent_loop_backoff_and_failing_reports(manager: FakeManager, tmp_path: Path) -> None:
    manager.status = 503
    sleeps: list[float] = []

    def fake_sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 3:  # the manager comes back during the third backoff sleep
            manager.status = 200

    cycle = [0]

    def make_report() -> dict[str, Any]:
        cycle[0] += 1
        if cycle[0] == 3:
            raise OSError("cannot read /proc\nsecond line")
        return {"cycle": cycle[0]}

    logs = Logs()
    d = tmp_path / "spool"
    args = agent_args(tmp_path, manager=manager.url, make_report=make_report, sleep=fake_sleep, log=logs)
    assert run_agent(**args, max_cycles=4) == EXIT_OK
    # cycle 1 spooled; backoff 1, 2, 4 inside the interval, then the rest of it; cycles 2 and 3: full
    # intervals (spool empty); no sleep after the last cycle
    assert sleeps == pytest.approx([1, 2, 4, 3, 10, 10], abs=0.5)
    assert [manager.stored[i]["report"] for i in manager.order] == [{"cycle": 1}, {"cycle": 2}, {"cycle": 4}]
    assert all(manager.stored[i]["interval_s"] == 10 for i in manager.order)
    failed = [line for line in logs if line.startswith("internal error")]
    assert failed == ["internal error in the report (1 of 5 in a row): OSError: cannot read /proc second line"]
    assert os.listdir(d) == []


def test_internal_error_is_logged_with_its_traceback_and_the_loop_goes_on(
    manager: FakeManager, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[int] = []

    sections: dict[str, dict[str, Any]] = {"gpus": {}}

    def buggy_probe() -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            return sections["cpus"]
        return {"call": len(calls)}

    logs = Logs()
    args = agent_args(tmp_path, manager=manager.url, make_report=buggy_probe, sleep=lambda s: None, log=logs)
    assert run_agent(**args, max_cycles=3) == EXIT_OK
    assert [manager.stored[i]["report"] for i in manager.order] == [{"call": 2}, {"call": 3}]
    assert logs == ["internal error in the report (1 of 5 in a row): KeyError: 'cpus'"]
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "oomguard agent: Traceback (most recent call last):"
    assert any("in buggy_probe" in line for line in err)  # the frame that failed, not only its type
    assert any('return sections["cpus"]' in line for line in err)
    assert err[-1] == "oomguard agent: KeyError: 'cpus'"
    assert all(line.startswith("oomguard agent: ") for line in err)


def test_run_agent_loop_backoff_stays_inside_the_interval(dead_url: str, tmp_path: Path) -> None:
    sleeps: list[float] = []
    rc = run_agent(
        manager=dead_url,
        token=TOKEN,
        node="n1",
        interval=5,
        once=False,
        spool_dir=str(tmp_path),
        make_report=dict,
        sleep=sleeps.append,
        log=Logs(),
        max_cycles=3,
    )
    assert rc == 0
    # per interval: 1 + 2 + the remaining ~2 (a step never goes past the interval)
    assert sleeps == pytest.approx([1, 2, 2, 1, 2, 2], abs=0.5)
    assert sum(sleeps) == pytest.approx(10, abs=0.5)
    assert len(Spool(str(tmp_path)).pending()) == 3  # nothing lost


def failing_every(pattern: str) -> tuple[list[str], Any]:
    """A make_report that fails ("x") or succeeds (".") per call as *pattern* says, then succeeds."""
    calls: list[str] = []

    def make_report() -> dict[str, Any]:
        outcome = pattern[len(calls)] if len(calls) < len(pattern) else "."
        calls.append(outcome)
        if outcome == "x":
            raise RuntimeError(f"bug number {len(calls)}")
        return {"call": len(calls)}

    return calls, make_report


def test_consecutive_internal_errors_end_the_loop_with_exit_internal(
    dead_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert MAX_INTERNAL_ERRORS == 5 and EXIT_INTERNAL == 70  # documented; 70 is EX_SOFTWARE (sysexits.h)
    calls, make_report = failing_every("x" * 100)
    sleeps: list[float] = []
    logs = Logs()
    args = agent_args(tmp_path, manager=dead_url, make_report=make_report, sleep=sleeps.append, log=logs)
    assert run_agent(**args) == EXIT_INTERNAL  # max_cycles=None: only the errors end it
    assert len(calls) == MAX_INTERNAL_ERRORS
    assert sleeps == pytest.approx([10] * (MAX_INTERNAL_ERRORS - 1), abs=0.5)  # a full interval apart, no spin
    assert [line.split(":")[0] for line in logs[:-1]] == [
        f"internal error in the report ({n} of 5 in a row)" for n in range(1, 6)
    ]
    assert logs[-1] == "giving up after 5 internal errors in a row (tracebacks above)"
    assert capsys.readouterr().err.count("Traceback (most recent call last):") == MAX_INTERNAL_ERRORS


def test_a_good_report_resets_the_internal_error_count(dead_url: str, tmp_path: Path) -> None:
    calls, make_report = failing_every("xxxx.xxxx.xxxx")
    logs = Logs()
    args = agent_args(tmp_path, manager=dead_url, make_report=make_report, sleep=lambda s: None, log=logs)
    assert run_agent(**args, max_cycles=16) == EXIT_OK
    assert len(calls) == 16
    assert sum(line.startswith("internal error") for line in logs) == 12
    assert not any(line.startswith("giving up") for line in logs)
    assert len(Spool(str(tmp_path / "spool")).pending()) == 4  # the good ones, spooled: nothing lost


def test_a_failing_wait_is_an_internal_error_and_still_waits(manager: FakeManager, tmp_path: Path) -> None:
    manager.status = 503  # the report is spooled: the wait retries it with backoff
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 1:
            raise RuntimeError("broken clock")

    logs = Logs()
    args = agent_args(tmp_path, manager=manager.url, sleep=sleep, log=logs)
    assert run_agent(**args, max_cycles=2) == EXIT_OK
    assert sleeps == pytest.approx([1, 10], abs=0.5)  # the backoff step failed: the rest of the interval
    assert [line for line in logs if line.startswith("internal")] == [
        "internal error in the wait between reports (1 of 5 in a row): RuntimeError: broken clock"
    ]


def test_a_usage_error_from_the_probe_is_not_an_internal_error(tmp_path: Path) -> None:
    def make_report() -> dict[str, Any]:
        raise UsageError("--budget: not a size: 'lots'")

    logs = Logs()
    with pytest.raises(UsageError, match="--budget"):
        run_agent(**agent_args(tmp_path, make_report=make_report, sleep=lambda s: None, log=logs))
    assert logs == []


@pytest.mark.parametrize("interval", [0, -1, float("nan")])
def test_run_agent_loop_rejects_an_interval_not_above_zero(tmp_path: Path, interval: float) -> None:
    with pytest.raises(UsageError, match=r"^--interval: .*> 0 seconds, got") as e:
        run_agent(**agent_args(tmp_path, interval=interval), max_cycles=1)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "spool").exists()  # refused before anything was created


def test_an_unusable_spool_is_a_usage_error_naming_the_flag(manager: FakeManager, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    for bad, why in ((a_file, "not a directory"), (a_file / "spool", "Not a directory")):
        for once in (True, False):
            with pytest.raises(UsageError, match=r"^--spool: cannot use .* as the spool directory \(") as e:
                run_agent(**agent_args(tmp_path, manager=manager.url, spool_dir=str(bad), once=once))
            assert str(e.value).endswith(f"{str(bad)!r} as the spool directory ({why})")
        with pytest.raises(UsageError, match=r"^--spool: "):
            EventForwarder(manager.url, TOKEN, "n1", str(bad))
    assert manager.requests == []


def test_event_forwarder_usage_errors_name_the_flag(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^--manager: "):
        EventForwarder("manager:8080", TOKEN, "n1", str(tmp_path))
    with pytest.raises(UsageError, match=r"^--token "):
        EventForwarder("http://manager:8080", "two words", "n1", str(tmp_path))


# --- spool durability and order ---------------------------------------------------------


def test_put_is_complete_and_private(tmp_path: Path) -> None:
    d = tmp_path / "a" / "spool"
    spool = Spool(str(d))
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    body = {"node": "n", "id": "abc", "report": {"text": 'ü\n"q"', "big": list(range(1000))}, "interval_s": 1.5}
    path = spool.put("report", body)
    assert os.path.dirname(path) == str(d) and os.path.basename(path) == "000000000001-report.json"
    assert json.loads(Path(path).read_text(encoding="utf-8")) == body
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(d) == ["000000000001-report.json"]  # no temp file left behind
    with pytest.raises(ValueError):
        spool.put("metrics", body)
    with pytest.raises(TypeError):
        spool.put("report", {"x": object()})
    assert os.listdir(d) == ["000000000001-report.json"]  # a failed put leaves nothing


def test_pending_ignores_temp_files_strays_and_rejected(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    a = spool.put("report", {"id": "a"})
    (tmp_path / ".tmp-0123abcd").write_text('{"id": "half')  # a crash between write and rename
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "000000000009-metrics.json").write_text("{}")
    (tmp_path / "rejected").mkdir()
    (tmp_path / "rejected" / "000000000005-report.json").write_text("{}")
    b = spool.put("event", {"id": "b"})
    assert spool.pending() == [a, b]
    assert os.path.basename(b) == "000000000006-event.json"  # after the rejected one


def test_stale_temp_files_are_removed_fresh_ones_kept(tmp_path: Path) -> None:
    old = tmp_path / ".tmp-old"
    old.write_text("{")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    fresh = tmp_path / ".tmp-fresh"  # maybe another process writing right now
    fresh.write_text("{")
    Spool(str(tmp_path))
    assert not old.exists() and fresh.exists()


def test_seq_order_across_spool_instances(tmp_path: Path) -> None:
    d = str(tmp_path)
    first = Spool(d)
    p1 = first.put("report", {"id": "1"})
    p2 = first.put("event", {"id": "2"})
    second = Spool(d)  # a process restart
    p3 = second.put("report", {"id": "3"})
    p4 = first.put("event", {"id": "4"})  # an older instance still running alongside
    assert names([p1, p2, p3, p4]) == [
        "000000000001-report.json",
        "000000000002-event.json",
        "000000000003-report.json",
        "000000000004-event.json",
    ]
    assert Spool(d).pending() == [p1, p2, p3, p4]
    first.done(p1)
    first.done(p1)  # twice: no error
    assert names([Spool(d).put("report", {"id": "5"})]) == ["000000000005-report.json"]


def test_concurrent_puts_never_collide(tmp_path: Path) -> None:
    spools = [Spool(str(tmp_path)) for _ in range(4)]  # as if four processes
    paths: list[str] = []
    lock = threading.Lock()

    def work(k: int) -> None:
        for i in range(25):
            p = spools[k].put("event", {"id": f"{k}-{i}"})
            with lock:
                paths.append(p)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 100
    pending = spools[0].pending()
    assert len(pending) == 100
    ids = {json.loads(Path(p).read_text())["id"] for p in pending}
    assert len(ids) == 100
    # each writer's own items are in its put order
    for k in range(4):
        mine = [p for p in pending if json.loads(Path(p).read_text())["id"].startswith(f"{k}-")]
        assert [json.loads(Path(p).read_text())["id"] for p in mine] == [f"{k}-{i}" for i in range(25)]


# --- node names and defaults ------------------------------------------------------------


def test_sanitize_node_name() -> None:
    assert sanitize_node_name("gpu-node_01.example") == "gpu-node_01.example"
    assert sanitize_node_name("gpu node/1:ä") == "gpu-node-1--"
    assert sanitize_node_name("") == "node"
    assert sanitize_node_name("..") == "node"
    assert sanitize_node_name("x" * 300) == "x" * 128
    assert set(sanitize_node_name("".join(map(chr, range(300))))) <= set(NODE_NAME_CHARS)
    assert set(NODE_NAME_CHARS) == set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def test_default_node_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "host a")
    assert default_node_name({"VAST_CONTAINERLABEL": "C.12345"}) == "C.12345"
    assert default_node_name({"VAST_CONTAINERLABEL": "my box/1"}) == "my-box-1"
    assert default_node_name({"VAST_CONTAINERLABEL": ""}) == "host-a"
    assert default_node_name({}) == "host-a"
    monkeypatch.setattr(socket, "gethostname", lambda: "")
    assert default_node_name({}) == "node"


def test_default_spool_dir_precedence() -> None:
    env = {"OOMGUARD_SPOOL": "/s/p", "XDG_STATE_HOME": "/state", "HOME": "/home/u"}
    assert default_spool_dir(env) == "/s/p"
    del env["OOMGUARD_SPOOL"]
    assert default_spool_dir(env) == "/state/oomguard/spool"
    env["XDG_STATE_HOME"] = "relative/state"  # invalid per the XDG spec: ignored
    assert default_spool_dir(env) == "/home/u/.local/state/oomguard/spool"
    assert default_spool_dir({"HOME": "/root", "OOMGUARD_SPOOL": ""}) == "/root/.local/state/oomguard/spool"
    assert default_spool_dir({}).endswith(os.path.join(".local", "state", "oomguard", "spool"))


def test_the_package_exports_what_the_commands_use() -> None:
    from oomguard import agent

    public = {name for name in vars(agent) if not name.startswith("_")} - {"annotations"}
    modules = {"forwarder", "log", "loop", "node", "sender", "spool"}
    assert sorted(agent.__all__) == sorted(public - modules)
    assert set(agent.__all__) == {
        "EventForwarder",
        "NODE_NAME_CHARS",
        "Sender",
        "Spool",
        "default_node_name",
        "default_spool_dir",
        "run_agent",
        "sanitize_node_name",
    }
