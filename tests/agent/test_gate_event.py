"""The gate event (``agent/gate.py``) and ``oomguard agent --gate ... [--once --max-time]``: its
shape, the line it carries, its order after the report, the exit code, and a bounded delivery."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomguard.agent import Sender, Spool, run_agent
from oomguard.agent.gate import MESSAGE_MAX, STEPS, gate_event, gate_message
from oomguard.errors import EXIT_OK, EXIT_REJECTED, EXIT_SPOOLED, EXIT_USAGE, BadParameter
from tests.conftest import run_oomguard
from tests.helpers.agent_fake import TOKEN, FakeManager, Logs, agent_args

CHECK_ERR = "oomguard: error: --require: budget 0 B is below the required 1 B"

# --- the line -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "code", "text", "line"),
    [
        ("check", 3, CHECK_ERR + "\n", "--require: budget 0 B is below the required 1 B"),
        (
            "plan",
            3,
            "warning: x\noomguard: error: first\noomguard: error: --require-jobs: 0 jobs fit, 1 required\n",
            "--require-jobs: 0 jobs fit, 1 required",
        ),  # the last error line
        (
            "verify",
            4,
            "oomguard verify: 1 of 2 children touched 768 MiB of 1.5 GiB in 3.1s (1.20 GB/s)\n",
            "oomguard verify: 1 of 2 children touched 768 MiB of 1.5 GiB in 3.1s (1.20 GB/s)",
        ),  # its own line
        ("check", 2, "something odd\n  the last words  \n\n", "the last words"),  # else the last line
        ("check", 3, "", "oomguard check failed (exit 3)"),  # else the exit code in words
        ("verify", 0, "  \n", "oomguard verify passed"),
        (
            "plan",
            0,
            "passed: check --require 1B, plan --require-jobs 2",
            "passed: check --require 1B, plan --require-jobs 2",
        ),
        ("verify", 4, "oomguard verify: child 7: 1 GiB\x1b[K\n", "oomguard verify: child 7: 1 GiB?[K"),  # a terminal's
    ],
)
def test_the_message_is_the_steps_one_line(step: str, code: int, text: str, line: str) -> None:
    assert gate_message(step, code, text) == line


@given(st.sampled_from(STEPS), st.integers(0, 255), st.text())
def test_any_text_gives_one_printable_line_within_the_limit(step: str, code: int, text: str) -> None:
    line = gate_message(step, code, text)
    assert line and line.isprintable() and len(line) <= MESSAGE_MAX
    assert line == line.strip() and "  " not in line


def test_a_long_message_is_cut_at_the_limit() -> None:
    line = gate_message("check", 3, "oomguard: error: " + "x" * 10_000)
    assert len(line) == MESSAGE_MAX and line.endswith("...")


def test_the_event_has_the_contracted_shape() -> None:
    event = gate_event("check", 3, CHECK_ERR)
    assert set(event) == {"event", "time", "step", "passed", "exit_code", "message"}
    assert event["event"] == "gate" and event["step"] == "check" and event["time"].endswith("Z")
    assert event["passed"] is False and event["exit_code"] == 3
    assert event["message"] == "--require: budget 0 B is below the required 1 B"
    assert gate_event("plan", 0, "", time="2025-01-01T00:00:00Z") == {
        "event": "gate",
        "time": "2025-01-01T00:00:00Z",
        "step": "plan",
        "passed": True,
        "exit_code": 0,
        "message": "oomguard plan passed",
    }
    with pytest.raises(ValueError, match="unknown gate step 'run'"):
        gate_event("run", 0, "")


# --- after the report, and the exit code ---------------------------------------------------------


class _RefusesEvents(FakeManager):
    """Stores reports, answers every event 422 (the manager before the gate event was known)."""

    def _answer_for(self, body: dict[str, Any]) -> tuple[int, bool]:
        return (422, False) if "event" in body else super()._answer_for(body)


@pytest.fixture
def refuses_events() -> Iterator[FakeManager]:
    m = _RefusesEvents()
    m.start()
    yield m
    m.stop()


def _gate_once(tmp_path: Path, url: str, **kw: Any) -> int:
    gate = gate_event("check", 3, CHECK_ERR)
    return run_agent(**agent_args(tmp_path, manager=url, once=True, gate=gate, make_report=lambda: {"r": 1}, **kw))


def test_once_sends_the_report_then_the_gate_event(manager: FakeManager, tmp_path: Path) -> None:
    assert _gate_once(tmp_path, manager.url, labels={"zone": "z"}) == EXIT_OK
    report, event = (r["body"] for r in manager.requests)
    assert report["report"] == {"r": 1}
    assert set(event) == {"node", "id", "event", "labels"} and event["node"] == "n1"
    assert event["event"]["event"] == "gate" and event["event"]["passed"] is False
    assert report["labels"] == event["labels"] == {"zone": "z"}


def test_once_exits_with_the_first_item_not_delivered(
    manager: FakeManager, refuses_events: FakeManager, dead_url: str, tmp_path: Path
) -> None:
    assert _gate_once(tmp_path / "a", refuses_events.url) == EXIT_REJECTED  # the report went, the event not
    assert [r["path"] for r in refuses_events.requests] == ["/api/v1/reports", "/api/v1/events"]
    assert _gate_once(tmp_path / "b", dead_url) == EXIT_SPOOLED
    assert len(Spool(str(tmp_path / "b" / "spool")).pending()) == 2  # both wait, in order
    manager.status = 422
    assert _gate_once(tmp_path / "c", manager.url) == EXIT_REJECTED


def test_the_loop_sends_the_gate_event_after_its_first_report_only(manager: FakeManager, tmp_path: Path) -> None:
    gate = gate_event("plan", 0, "passed: check --require 1B, plan --require-jobs 1")
    args = agent_args(tmp_path, manager=manager.url, max_cycles=3, interval=0.01, gate=gate, sleep=lambda _: None)
    assert run_agent(**args) == EXIT_OK
    paths = [r["path"].rsplit("/", 1)[1] for r in manager.requests]
    assert paths == ["reports", "events", "reports", "reports"]
    assert manager.requests[1]["body"]["event"]["passed"] is True


# --- --max-time: the delivery is bounded --------------------------------------------------------


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_max_time_bounds_once_and_leaves_the_items_spooled(silent_url: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    assert _gate_once(tmp_path, silent_url, max_time=0.5) == EXIT_SPOOLED
    assert time.monotonic() - t0 < 3  # not 2 x the 10 s POST time-out
    assert len(Spool(str(tmp_path / "spool")).pending()) == 2


def test_a_sender_past_its_deadline_posts_nothing(manager: FakeManager, tmp_path: Path) -> None:
    logs = Logs()
    sender = Sender(manager.url, TOKEN, Spool(str(tmp_path)), log=logs)
    sender.deadline = time.monotonic() - 1
    assert sender.event("n1", {"event": "start"}) == "spooled"
    assert manager.requests == []
    assert logs == [f"manager not reachable (no time left (--max-time)); 1 item(s) spooled in {tmp_path}"]
    sender.deadline = None
    assert sender.flush() and len(manager.requests) == 1


def test_max_time_needs_once(tmp_path: Path) -> None:
    with pytest.raises(BadParameter, match="max_time"):
        run_agent(**agent_args(tmp_path, max_time=5.0))
    with pytest.raises(BadParameter, match="max_time"):
        run_agent(**agent_args(tmp_path, once=True, max_time=0.0))


# --- the command line -----------------------------------------------------------------------------


def test_the_command_line_sends_the_gate_event(manager: FakeManager, tmp_path: Path) -> None:
    proc = run_oomguard(
        *("agent", "--once", "--manager", manager.url, "--token", TOKEN, "--node", "gpu-07", "--no-gpu"),
        *("--spool", str(tmp_path), "--per-job", "1TiB", "--max-time", "5s", "--label", "zone=eu-1"),
        *(
            "--gate",
            "plan",
            "--gate-exit",
            "3",
            "--gate-message",
            "oomguard: error: --require-jobs: 0 jobs fit, 1 required\n",
        ),
    )
    assert proc.returncode == EXIT_OK, proc.stderr
    report, event = (r["body"] for r in manager.requests)
    assert report["report"]["plan"]["concurrency"] == 0  # the plan flags: the report carries the plan
    assert event["event"] == {
        "event": "gate",
        "time": event["event"]["time"],
        "step": "plan",
        "passed": False,
        "exit_code": 3,
        "message": "--require-jobs: 0 jobs fit, 1 required",
    }
    assert report["labels"] == event["labels"] == {"zone": "eu-1"}
    assert report["node"] == event["node"] == "gpu-07"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--gate-exit", "3"], "--gate-exit needs --gate STEP"),
        (["--gate-message", "x"], "--gate-message needs --gate STEP"),
        (["--gate", "run"], "--gate: expected one of check, plan, verify, got 'run'"),
        (["--gate", "check", "--gate-exit", "x"], "--gate-exit: expected a whole number, got 'x'"),
        (["--gate", "check", "--gate-exit", "256"], "--gate-exit: an exit status is 0-255, got '256'"),
        (["--max-time", "5s"], "--max-time: bounds --once only, and must be > 0 seconds"),
        (["--once", "--max-time", "soon"], "--max-time: invalid duration 'soon'"),
    ],
)
def test_bad_gate_flags_are_one_line_and_exit_2(argv: list[str], line: str, tmp_path: Path) -> None:
    proc = run_oomguard("agent", "--manager", "http://127.0.0.1:9", "--spool", str(tmp_path), "--no-gpu", *argv)
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr.startswith(f"oomguard: error: {line}") and proc.stderr.count("\n") == 1, proc.stderr
