"""The agent's delivery against a real HTTP server (a small fake manager in a thread): order,
replay, what each answer means, refused items in rejected/, 5xx items given up, episodes."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from oomguard.agent import Sender, Spool
from oomguard.agent.rejected import GIVE_UP_ANSWERS, GIVE_UP_MAX_S, GIVE_UP_MIN_S, give_up, read_retry
from oomguard.errors import UsageError
from tests.helpers.agent_fake import (
    TOKEN,
    FakeManager,
    Logs,
    names,
    put_reports,
    why_of,
)
from tests.helpers.wait import wait_until

# --- delivery ---------------------------------------------------------------------------


def test_report_and_event_delivered_with_auth_and_body_shape(manager: FakeManager, tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / "spool"))
    sender = Sender(manager.url + "/", TOKEN, spool, log=Logs())
    assert sender.report("node-1", {"memory": {"effective_bytes": 1}}, 60.0) == "delivered"
    assert sender.event("node-1", {"event": "start", "pid": 7}) == "delivered"
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
    assert sender.post("event", {"node": "n", "id": "x", "event": {}}).kind == "ok"
    assert manager.requests[0]["path"] == "/fleet/api/v1/events"


# --- manager down, restart, replay ------------------------------------------------------


def test_manager_down_spools_and_replays_in_order_after_restart(
    manager: FakeManager, dead_url: str, tmp_path: Path
) -> None:
    d = str(tmp_path / "spool")
    logs = Logs()
    sender = Sender(dead_url, TOKEN, Spool(d), log=logs)
    assert sender.report("n1", {"r": 1}, 30) == "spooled"
    assert sender.event("n1", {"event": "start"}) == "spooled"
    assert sender.report("n1", {"r": 2}, 30) == "spooled"
    assert sender.event("n1", {"event": "exit"}) == "spooled"
    assert logs == [f"manager not reachable (connection refused); 1 item(s) spooled in {d}"]
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
    assert manager.received_ids() == manager.order == put_ids
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
    assert sender.report("n", {"a": 1}, None) == "spooled"
    assert sender.report("n", {"a": 2}, None) == "spooled"
    m.start(port)  # back on the same port
    try:
        assert sender.report("n", {"a": 3}, None) == "delivered"
    finally:
        m.stop()
    assert m.stored_reports() == [{"a": 1}, {"a": 2}, {"a": 3}]
    assert len(m.received_ids()) == len(set(m.received_ids())) == 3
    assert logs[-1] == "manager reachable again; delivered 3 spooled item(s)"


def test_answer_lost_after_store_is_retried_and_stored_once(manager: FakeManager, tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    ids = put_reports(spool, 3)
    logs = Logs()
    sender = Sender(manager.url, TOKEN, spool, log=logs)
    # the first item goes through; the second is stored but its answer is lost
    assert sender.post("report", json.loads(Path(spool.pending()[0]).read_text())).kind == "ok"
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


# --- what each answer means --------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "rejected"),
        (409, "rejected"),
        (410, "rejected"),
        (413, "rejected"),
        (422, "rejected"),
        (401, "token"),
        (403, "token"),
        (404, "url"),
        (405, "url"),
        (302, "url"),
        (307, "url"),
        (408, "retry"),
        (429, "retry"),
        (500, "server"),
        (502, "server"),
        (503, "server"),
        (504, "server"),
    ],
)
def test_each_status_has_one_meaning(manager: FakeManager, tmp_path: Path, status: int, kind: str) -> None:
    manager.status = status
    sender = Sender(manager.url, TOKEN, Spool(str(tmp_path)), log=Logs())
    outcome = sender.post("report", {"node": "n", "id": "x", "report": {}, "interval_s": None})
    assert (outcome.kind, outcome.status) == (kind, status)
    assert outcome.why.startswith(f"{status} ") and "\n" not in outcome.why
    assert outcome.body == json.dumps({"error": f"fake answer {status}"})
    assert outcome.later == (kind in ("retry", "server"))
    assert [r["method"] for r in manager.requests] == ["POST"]  # a redirect is never followed


@pytest.mark.parametrize(
    ("after", "kind"),
    [
        ("60", "retry"),
        ("3599", "retry"),
        ("3600", "rejected"),
        ("86400", "rejected"),
        ("soon", "retry"),
        ("Wed, 21 Oct 2037 07:28:00 GMT", "retry"),
    ],
)
def test_a_429_that_lasts_is_a_refusal(manager: FakeManager, tmp_path: Path, after: str, kind: str) -> None:
    """The manager's caps on distinct profiles and classes answer 429 with a day's Retry-After
    (store/claims.py): the queue goes on past such an item rather than wait behind it for days;
    a quota's minute stays "try later" (only delay-seconds are read; a date is "later")."""
    manager.status, manager.headers = 429, {"Retry-After": after}
    spool = Spool(str(tmp_path))
    sender = Sender(manager.url, TOKEN, spool, log=Logs())
    assert sender.post("observation", {"node": "n", "id": "x"}).kind == kind
    spool.put("observation", {"node": "n", "id": "o-1"})
    manager.status_for["r-2"] = 200
    spool.put("report", {"node": "n", "id": "r-2"})
    assert sender.flush() is (kind == "rejected")
    assert ("r-2" in manager.stored) is (kind == "rejected")


def test_network_failures_are_retry_values(dead_url: str, tmp_path: Path) -> None:
    sender = Sender(dead_url, TOKEN, Spool(str(tmp_path)), log=Logs())
    refused = sender.post("report", {"id": "x"})
    assert (refused.kind, refused.status, refused.why) == ("retry", None, "connection refused")
    # a server that accepts the connection and never answers
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        slow = Sender(f"http://127.0.0.1:{s.getsockname()[1]}", TOKEN, Spool(str(tmp_path)), timeout=0.3)
        t0 = time.monotonic()
        assert slow.post("report", {"id": "x"}).why == "timed out"
        assert time.monotonic() - t0 < 3


# --- refused items: rejected/, the queue goes on ----------------------------------------------


def test_422_goes_to_rejected_with_its_reason_and_does_not_block(manager: FakeManager, tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    ids = put_reports(spool, 3)
    manager.status_for = {ids[1]: 422}
    logs = Logs()
    assert Sender(manager.url, TOKEN, spool, log=logs).flush() is True
    assert manager.order == [ids[0], ids[2]]
    assert spool.pending() == []
    rejected = tmp_path / "rejected"
    assert sorted(os.listdir(rejected)) == ["000000000002-report.json", "000000000002-report.json.why"]
    assert json.loads((rejected / "000000000002-report.json").read_text())["id"] == ids[1]
    why = why_of(rejected, "000000000002-report.json")
    assert why["reason"] == "rejected" and why["status"] == 422 and why["answers"] == 1
    assert why["why"] == "422 Unprocessable Entity: fake answer 422"
    assert why["answer"] == '{"error": "fake answer 422"}' and why["rejected_at"].endswith("Z")
    assert logs == [
        f"manager rejected the report 000000000002-report.json (422 Unprocessable Entity: fake answer 422); "
        f"refused items are kept in {rejected}",
        "manager accepts items again; delivered 2 spooled item(s), 1 item(s) moved to rejected/",
    ]
    # seq numbers keep counting past the rejected file, even in a new instance
    assert names([Spool(str(tmp_path)).put("event", {"id": "later"})]) == ["000000000003-event.json"]


def test_a_wrong_token_says_token_refused_and_never_spools_for_ever(manager: FakeManager, tmp_path: Path) -> None:
    manager.status = 401
    logs = Logs()
    sender = Sender(manager.url, "wrong-token", Spool(str(tmp_path)), log=logs)
    assert [sender.report("n", {"i": i}, None) for i in range(3)] == ["token", "token", "token"]
    assert sender.spool.pending() == []
    assert len(os.listdir(tmp_path / "rejected")) == 6  # three items, three reasons
    assert len(logs) == 1  # one episode, one line
    assert logs[0].startswith("token refused by the manager (401 Unauthorized: fake answer 401): check --token")
    assert "not reachable" not in logs[0]
    assert why_of(tmp_path / "rejected", "000000000001-report.json")["reason"] == "token"
    manager.status = 200
    assert sender.report("n", {"i": 3}, None) == "delivered"
    assert logs[1] == "manager accepts items again; delivered 1 spooled item(s), 3 item(s) moved to rejected/"


def test_a_wrong_url_says_so(manager: FakeManager, tmp_path: Path) -> None:
    manager.status = 404
    logs = Logs()
    assert Sender(manager.url + "/typo", TOKEN, Spool(str(tmp_path)), log=logs).report("n", {}, None) == "url"
    assert logs[0].startswith(f"wrong manager URL: {manager.url}/typo answered 404 Not Found")


def test_corrupt_spool_file_is_rejected_and_does_not_block(manager: FakeManager, tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    (tmp_path / "000000000001-report.json").write_text('{"node": "n", "id": "trunc')
    (tmp_path / "000000000002-event.json").write_text("[1, 2]")
    ids = put_reports(spool, 1)
    logs = Logs()
    assert Sender(manager.url, TOKEN, spool, log=logs).flush() is True
    assert manager.order == ids
    assert {"000000000001-report.json", "000000000002-event.json"} <= set(os.listdir(tmp_path / "rejected"))
    assert why_of(tmp_path / "rejected", "000000000002-event.json")["reason"] == "unreadable"
    assert len(logs) == 2


# --- 5xx: retried in order, given up after a while -----------------------------------------------


def test_503_keeps_the_queue_in_order_and_is_said_once(manager: FakeManager, tmp_path: Path) -> None:
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
    assert read_retry(before[0] + ".retry")[0] == 2  # type: ignore[index]  # counted on disk
    assert logs == [
        f"manager busy or failing (503 Service Unavailable: fake answer 503); 3 item(s) spooled in {tmp_path}"
    ]
    manager.status = 200
    assert sender.send("event", {"node": "n", "id": "ev", "event": {}}) == "delivered"
    assert manager.order == [*ids, "ev"]
    assert logs[-1] == "manager reachable again; delivered 4 spooled item(s)"
    assert os.listdir(tmp_path) == []  # the counter went with its item


def test_the_rules_for_giving_up_a_5xx_item() -> None:
    assert (GIVE_UP_ANSWERS, GIVE_UP_MIN_S, GIVE_UP_MAX_S) == (20, 3600, 86400)  # as documented
    assert not give_up(1000, 0, 3599)  # many answers in under an hour: an outage, not the item
    assert not give_up(19, 0, 7200)
    assert give_up(20, 0, 3600)
    assert give_up(2, 0, 86400)  # a day of 5xx, however few answers (a daily cron)
    assert not give_up(50, 10_000, 0)  # the clock went back: never older


def write_retry_state(item: str, answers: int, age_s: float) -> None:
    Path(item + ".retry").write_text(json.dumps({"answers": answers, "first": time.time() - age_s}))


def test_an_item_that_always_gets_5xx_is_given_up_and_the_queue_moves_on(manager: FakeManager, tmp_path: Path) -> None:
    """The issue's poison item: one spooled item the manager answers 500 for ever blocked every report."""
    spool = Spool(str(tmp_path))
    ids = put_reports(spool, 3)
    manager.status_for = {ids[0]: 500}
    logs = Logs()
    sender = Sender(manager.url, TOKEN, spool, log=logs)
    assert sender.flush() is False  # the first 5xx: kept, in order
    first = spool.pending()[0]
    write_retry_state(first, GIVE_UP_ANSWERS - 1, GIVE_UP_MIN_S + 5)  # as after an hour of retries
    assert sender.report("n1", {"i": "new"}, None) == "delivered"
    assert manager.order == [*ids[1:], manager.order[-1]]
    assert manager.stored_reports()[-1] == {"i": "new"}
    why = why_of(tmp_path / "rejected", os.path.basename(first))
    assert why["reason"] == "gave-up" and why["status"] == 500 and why["answers"] == GIVE_UP_ANSWERS
    gave_up = [line for line in logs if line.startswith("gave up on")]
    assert gave_up == [
        f"gave up on 000000000001-report.json ({GIVE_UP_ANSWERS} answers 5xx over 1.0 h, the last "
        f"500 Internal Server Error: fake answer 500); kept in {tmp_path / 'rejected'}"
    ]
    assert not os.path.exists(first + ".retry")


def test_an_outage_gives_up_only_the_head_of_the_queue(manager: FakeManager, tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    put_reports(spool, 3)
    head, second, third = spool.pending()
    manager.status = 503  # everything fails: the manager is down, the items are fine
    write_retry_state(head, 1, GIVE_UP_MAX_S + 1)
    assert Sender(manager.url, TOKEN, spool, log=Logs()).flush() is False
    assert spool.pending() == [second, third]  # one given up; the next has its first 5xx now
    assert read_retry(second + ".retry")[0] == 1  # type: ignore[index]


def test_many_quick_5xx_are_not_enough_to_give_up(manager: FakeManager, tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    put_reports(spool, 1)
    manager.status = 502
    sender = Sender(manager.url, TOKEN, spool, log=Logs())
    for _ in range(GIVE_UP_ANSWERS + 5):
        assert sender.flush() is False
    assert len(spool.pending()) == 1 and not (tmp_path / "rejected").exists()


def test_a_broken_retry_counter_starts_again(manager: FakeManager, tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    put_reports(spool, 1)
    item = spool.pending()[0]
    for junk in ("", "{", "[]", '{"answers": -1, "first": 1}', '{"answers": 1, "first": NaN}', '{"answers": true}'):
        Path(item + ".retry").write_text(junk)
        assert read_retry(item + ".retry") is None
    manager.status = 500
    Sender(manager.url, TOKEN, Spool(str(tmp_path)), log=Logs()).flush()
    assert read_retry(item + ".retry")[0] == 1  # type: ignore[index]


# --- logs: one line per episode, never a traceback ----------------------------------------------


def test_a_flapping_failure_is_one_episode(tmp_path: Path) -> None:
    m = FakeManager()
    m.start()
    port = m.port
    logs = Logs()
    sender = Sender(f"http://127.0.0.1:{port}", TOKEN, Spool(str(tmp_path)), log=logs)
    m.status = 503
    assert sender.report("n", {}, None) == "spooled"
    m.stop()
    assert sender.report("n", {}, None) == "spooled"  # connection refused now: same episode
    m.start(port)
    m.status = 502
    try:
        assert sender.flush() is False
        m.status = 200
        assert sender.flush() is True
    finally:
        m.stop()
    assert len(logs) == 2 and "503" in logs[0] and logs[1].startswith("manager reachable again")


def test_default_log_goes_to_stderr_on_one_line(
    manager: FakeManager, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manager.status = 503
    assert Sender(manager.url, TOKEN, Spool(str(tmp_path))).report("n", {}, None) == "spooled"
    err = capsys.readouterr().err
    assert err.startswith("oomguard agent: ") and err.count("\n") == 1 and "503" in err


def test_invalid_manager_urls(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    for url in ("ftp://host/", "file:///etc/passwd", "127.0.0.1:8080", "http://", "http://host:port/", ""):
        with pytest.raises(UsageError) as e:
            Sender(url, TOKEN, spool)
        assert str(e.value).startswith("manager: ") and "\n" not in str(e.value)  # the parameter's name
        assert e.value.param == "manager"  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match=r"^manager: .*query"):
        Sender("http://x/?a=1", TOKEN, spool)
    with pytest.raises(UsageError, match=r"^token: "):
        Sender("http://x", "bad\ntoken", spool)
    assert Sender("http://x", " padded-token\n", spool).client.token == "padded-token"
    Sender("HTTPS://x.example:8443/", TOKEN, spool)  # accepted


# --- run --manager: the event forwarder -----------------------------------------------------------


def test_event_forwarder_delivers_and_survives_a_broken_spool(
    manager: FakeManager, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from oomguard.agent import EventForwarder

    spool = tmp_path / "spool"
    fwd = EventForwarder(manager.url, TOKEN, "_gpu-1", str(spool))  # a name the manager would refuse
    fwd({"event": "start", "pid": 1})
    wait_until(lambda: manager.order, what="the start event, sent by the background thread")
    shutil.rmtree(spool)
    spool.write_text("in the way")  # the spool breaks under a running supervisor: no exception
    fwd({"event": "exit", "pid": 1})
    fwd.close()
    events = [manager.stored[i] for i in manager.order]
    assert [e["event"]["event"] for e in events] == ["start", "exit"]
    assert {e["node"] for e in events} == {"gpu-1"}
    assert not fwd.memory
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "oomguard agent: node name '_gpu-1' is not one the manager accepts: using 'gpu-1'"
    assert "Traceback" not in "\n".join(err)
