"""``run_agent`` and ``oomguard agent``: exit codes that tell the truth, the loop's lines,
internal errors, and spool faults (at start and in the long-running loop) without a traceback."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oomguard.agent import EventForwarder, Spool, run_agent
from oomguard.agent.loop import FATE_EXIT, MAX_INTERNAL_ERRORS
from oomguard.errors import (
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_LOST,
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_SPOOLED,
    EXIT_TOKEN_REFUSED,
    EXIT_USAGE,
    EXIT_WRONG_URL,
    UsageError,
)
from tests.conftest import REPO, run_oomguard
from tests.helpers.agent_fake import (
    TOKEN,
    FakeManager,
    Logs,
    agent_args,
)

# --- --once: the exit code is the report's fate -------------------------------------------------


def test_every_fate_has_a_documented_exit_code() -> None:
    documented = {code for code, _ in EXIT_CODES}
    assert set(FATE_EXIT.values()) <= documented
    assert FATE_EXIT["delivered"] == EXIT_OK and FATE_EXIT["spooled"] == EXIT_SPOOLED
    assert len({FATE_EXIT[f] for f in ("delivered", "spooled", "lost", "token", "url", "rejected")}) == 6


def test_once_delivered_then_spooled_then_replayed(manager: FakeManager, dead_url: str, tmp_path: Path) -> None:
    d = str(tmp_path / "spool")
    calls: list[int] = []

    def make_report() -> dict[str, Any]:
        calls.append(1)
        return {"n": len(calls)}

    common: dict[str, Any] = {"token": TOKEN, "node": "n1", "once": True, "spool_dir": d, "log": Logs()}
    assert run_agent(manager=dead_url, interval=0, make_report=make_report, **common) == EXIT_SPOOLED
    assert len(os.listdir(d)) == 1
    assert run_agent(manager=manager.url, interval=300, make_report=make_report, **common) == EXIT_OK
    assert manager.stored_reports() == [{"n": 1}, {"n": 2}]  # the spooled one first
    assert [manager.stored[i]["interval_s"] for i in manager.order] == [None, 300]
    assert os.listdir(d) == []
    assert common["log"] == [
        f"manager not reachable (connection refused); 1 item(s) spooled in {d}"
    ]  # --once: no start line


@pytest.mark.parametrize(
    ("status", "code", "said"),
    [
        (401, EXIT_TOKEN_REFUSED, "token refused by the manager (401"),
        (403, EXIT_TOKEN_REFUSED, "token refused by the manager (403"),
        (404, EXIT_WRONG_URL, "wrong manager URL"),
        (307, EXIT_WRONG_URL, "wrong manager URL"),
        (422, EXIT_REJECTED, "manager rejected the report"),
        (413, EXIT_REJECTED, "manager rejected the report"),
        (503, EXIT_SPOOLED, "manager busy or failing (503"),
        (429, EXIT_SPOOLED, "manager busy or failing (429"),
    ],
)
def test_once_a_refused_report_has_its_own_exit_code(
    manager: FakeManager, tmp_path: Path, status: int, code: int, said: str
) -> None:
    manager.status = status
    logs = Logs()
    assert run_agent(**agent_args(tmp_path, manager=manager.url, once=True, interval=0, log=logs)) == code
    assert len(logs) == 1 and logs[0].startswith(said)
    left = Spool(str(tmp_path / "spool")).pending()
    assert len(left) == (1 if code == EXIT_SPOOLED else 0)
    assert (tmp_path / "spool" / "rejected").exists() == (code != EXIT_SPOOLED)


def test_once_a_report_the_manager_refuses_is_never_exit_0(manager: FakeManager, tmp_path: Path) -> None:
    """The issue: a 404 exited 0 ("delivered") and a 422 on every report still exited 0."""
    for status in (400, 404, 405, 409, 410, 413, 422, 401, 403):
        manager.status = status
        assert run_agent(**agent_args(tmp_path, manager=manager.url, once=True, interval=0)) not in (0, 75)
    assert manager.order == []


def test_once_a_refused_report_exits_77_from_the_command_line(manager: FakeManager, tmp_path: Path) -> None:
    manager.status = 401
    proc = run_oomguard(
        "agent", "--once", "--no-gpu", "--manager", manager.url, "--token", "wrong", "--spool", str(tmp_path)
    )
    assert proc.returncode == EXIT_TOKEN_REFUSED == 77
    assert proc.stderr.startswith("oomguard agent: token refused by the manager (401 Unauthorized")
    assert proc.stderr.count("\n") == 1 and "not reachable" not in proc.stderr


def _limit_file_size_to_zero() -> None:
    """As a full disk: every write fails (EFBIG; Python ignores SIGXFSZ)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def test_once_a_report_lost_to_a_full_disk_with_the_manager_down_exits_74(dead_url: str, tmp_path: Path) -> None:
    """The issue: "lost" was logged and the agent exited 75 ("spooled")."""
    proc = run_oomguard(
        "agent",
        *("--once", "--no-gpu", "--manager", dead_url, "--spool", str(tmp_path)),
        preexec_fn=_limit_file_size_to_zero,
    )
    assert proc.returncode == EXIT_LOST == 74, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(f"oomguard agent: cannot write to the spool {tmp_path} (File too large)")
    assert lines[1].startswith("oomguard agent: manager not reachable (connection refused); the report ")
    assert lines[1].endswith(" is lost") and len(lines) == 2
    assert os.listdir(tmp_path) == []


def test_once_a_full_disk_with_the_manager_up_delivers_directly(manager: FakeManager, tmp_path: Path) -> None:
    proc = run_oomguard(
        "agent",
        *("--once", "--no-gpu", "--manager", manager.url, "--token", TOKEN, "--spool", str(tmp_path)),
        preexec_fn=_limit_file_size_to_zero,
    )
    assert proc.returncode == EXIT_OK, proc.stderr
    assert len(manager.order) == 1
    assert "sending directly" in proc.stderr and "Traceback" not in proc.stderr


def test_run_agent_once_propagates_a_failing_report(manager: FakeManager, tmp_path: Path) -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("probe failed")

    with pytest.raises(RuntimeError):
        run_agent(**agent_args(tmp_path, manager=manager.url, once=True, interval=0, make_report=broken))


# --- node names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "sent"), [("_private", "private"), (".hidden", "hidden"), ("ñodo", "nodo")])
def test_a_node_name_the_manager_refuses_is_sanitized_and_said(
    manager: FakeManager, tmp_path: Path, given: str, sent: str
) -> None:
    logs = Logs()
    args = agent_args(tmp_path, manager=manager.url, once=True, node=given, log=logs)
    assert run_agent(**args) == EXIT_OK
    assert manager.stored[manager.order[0]]["node"] == sent
    assert logs == [f"node name {given!r} is not one the manager accepts: using {sent!r}"]


# --- the loop ------------------------------------------------------------------------------------


def test_the_loop_says_one_start_line(manager: FakeManager, tmp_path: Path) -> None:
    logs = Logs()
    args = agent_args(tmp_path, manager=manager.url + "/", interval=30, sleep=lambda s: None, log=logs)
    assert run_agent(**args, max_cycles=3) == EXIT_OK
    assert logs == [f"reporting to {manager.url} as node n1 every 30s (spool {tmp_path / 'spool'})"]
    assert len(manager.order) == 3


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
    args = agent_args(tmp_path, manager=manager.url, make_report=make_report, sleep=fake_sleep, log=logs)
    assert run_agent(**args, max_cycles=4) == EXIT_OK
    # cycle 1 spooled; backoff 1, 2, 4 inside the interval, then the rest of it; cycles 2 and 3: full
    # intervals (spool empty); no sleep after the last cycle
    assert sleeps == pytest.approx([1, 2, 4, 3, 10, 10], abs=0.5)
    assert manager.stored_reports() == [{"cycle": 1}, {"cycle": 2}, {"cycle": 4}]
    assert all(manager.stored[i]["interval_s"] == 10 for i in manager.order)
    assert logs[1].startswith("manager busy or failing (503") and logs[2].startswith("manager reachable again")
    failed = [line for line in logs if line.startswith("internal error")]
    assert failed == ["internal error in the report (1 of 5 in a row): OSError: cannot read /proc second line"]
    assert os.listdir(tmp_path / "spool") == []


def test_the_loop_goes_on_past_a_report_the_manager_always_fails(manager: FakeManager, tmp_path: Path) -> None:
    """A poison item (5xx for ever) at the head: given up once its time is up, later reports arrive."""
    spool = Spool(str(tmp_path / "spool"))
    spool.put("report", {"node": "n1", "id": "poison", "report": {}, "interval_s": None})
    (tmp_path / "spool" / "000000000001-report.json.retry").write_text('{"answers": 100, "first": 0}')
    manager.status_for = {"poison": 500}
    args = agent_args(tmp_path, manager=manager.url, once=True)
    assert run_agent(**args) == EXIT_OK
    assert len(manager.order) == 1 and os.listdir(tmp_path / "spool") == ["rejected"]


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
    assert manager.stored_reports() == [{"call": 2}, {"call": 3}]
    assert logs[1:] == ["internal error in the report (1 of 5 in a row): KeyError: 'cpus'"]
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "oomguard agent: Traceback (most recent call last):"
    assert any("in buggy_probe" in line for line in err)  # the frame that failed, not only its type
    assert any('return sections["cpus"]' in line for line in err)
    assert err[-1] == "oomguard agent: KeyError: 'cpus'"
    assert all(line.startswith("oomguard agent: ") for line in err)


def test_run_agent_loop_backoff_stays_inside_the_interval(dead_url: str, tmp_path: Path) -> None:
    sleeps: list[float] = []
    args = agent_args(tmp_path, manager=dead_url, interval=5, sleep=sleeps.append)
    assert run_agent(**args, max_cycles=3) == EXIT_OK
    # per interval: 1 + 2 + the remaining ~2 (a step never goes past the interval)
    assert sleeps == pytest.approx([1, 2, 2, 1, 2, 2], abs=0.5)
    assert sum(sleeps) == pytest.approx(10, abs=0.5)
    assert len(Spool(str(tmp_path / "spool")).pending()) == 3  # nothing lost
    assert len(args["log"]) == 2  # the start line and one line for the whole outage


def failing_every(pattern: str) -> tuple[list[str], Callable[[], dict[str, Any]]]:
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
    assert [line.split(":")[0] for line in logs[1:-1]] == [
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
    assert len(logs) == 1 and logs[0].startswith("reporting to")


@pytest.mark.parametrize("interval", [0, -1, float("nan")])
def test_run_agent_loop_rejects_an_interval_not_above_zero(tmp_path: Path, interval: float) -> None:
    with pytest.raises(UsageError, match=r"^interval: .*> 0 seconds, got") as e:
        run_agent(**agent_args(tmp_path, interval=interval), max_cycles=1)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "spool").exists()  # refused before anything was created


# --- spool faults: one line and a documented exit at start, no traceback ever ------------------


def test_an_unusable_spool_is_a_usage_error_naming_the_flag(manager: FakeManager, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    for bad in (a_file, a_file / "spool"):
        for once in (True, False):
            with pytest.raises(UsageError) as e:
                run_agent(**agent_args(tmp_path, manager=manager.url, spool_dir=str(bad), once=once))
            assert str(e.value) == f"spool: cannot use {str(bad)!r} as the spool directory (not a directory)"
        with pytest.raises(UsageError, match=r"^spool: "):
            EventForwarder(manager.url, TOKEN, "n1", str(bad))
    assert manager.requests == []
    proc = run_oomguard("agent", "--once", "--no-gpu", "--manager", manager.url, "--spool", str(a_file))
    assert proc.returncode == EXIT_USAGE and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("oomguard: error: --spool: cannot use ")


def test_the_loop_survives_its_spool_turning_into_a_file(manager: FakeManager, tmp_path: Path) -> None:
    """The spool is removed and a file put in its place mid-run: reports go directly, said once."""
    spool = tmp_path / "spool"
    cycle = [0]

    def make_report() -> dict[str, Any]:
        cycle[0] += 1
        if cycle[0] == 2:
            shutil.rmtree(spool)
            spool.write_text("in the way")
        return {"cycle": cycle[0]}

    logs = Logs()
    args = agent_args(tmp_path, manager=manager.url, make_report=make_report, sleep=lambda s: None, log=logs)
    assert run_agent(**args, max_cycles=4) == EXIT_OK
    assert manager.stored_reports() == [{"cycle": n} for n in range(1, 5)]
    assert logs[1:] == [
        f"cannot write to the spool {spool} (not a directory); "
        "sending directly (what the manager does not take is lost)"
    ]


AS_NOBODY = textwrap.dedent(
    """
    import os, sys
    from oomguard.agent import run_agent
    spool, url, mode = sys.argv[1:]
    cycle = [0]
    def make_report():
        cycle[0] += 1
        if cycle[0] == 2:
            os.chmod(spool, 0)  # unreadable and unwritable from now on
        return {"cycle": cycle[0]}
    once = mode == "once"
    sys.exit(run_agent(manager=url, token="t", node="n", interval=5, once=once, spool_dir=spool,
                       make_report=make_report, sleep=lambda s: None, max_cycles=3))
    """
)


_PR_CAPBSET_DROP = 24  # prctl(2)
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2  # capabilities(7): what lets root read any directory


def _run_unprivileged(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` without the capabilities that let root read a mode-000 directory: dropped
    from the bounding set before exec, so the new program never has them (capabilities(7))."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def drop() -> None:
        if os.geteuid() != 0:
            return  # mode 000 already keeps an ordinary user out
        for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
            if prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                os._exit(99)

    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, preexec_fn=drop, cwd=tmp_path)
    if proc.returncode == 99 and not proc.stderr:
        pytest.skip("cannot drop CAP_DAC_OVERRIDE here (prctl PR_CAPBSET_DROP refused)")
    return proc


def test_the_loop_survives_an_unreadable_spool(manager: FakeManager, tmp_path: Path) -> None:
    """The issue: an unreadable spool crashed the long-running agent with a traceback."""
    proc = _run_unprivileged(tmp_path, "-c", AS_NOBODY, str(tmp_path / "spool"), manager.url, "loop")
    assert proc.returncode == EXIT_OK, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert [r["body"]["report"] for r in manager.requests] == [{"cycle": n} for n in (1, 2, 3)]
    spool_lines = [line for line in proc.stderr.splitlines() if "spool" in line and "reporting to" not in line]
    assert len(spool_lines) == 1 and "(Permission denied); sending directly" in spool_lines[0]


def test_an_unreadable_spool_at_start_is_one_line_and_exit_2(manager: FakeManager, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir(mode=0)
    argv = ("-m", "oomguard", "agent", "--once", "--no-gpu", "--manager", manager.url, "--spool", str(spool))
    proc = _run_unprivileged(tmp_path, *argv)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr == (
        f"oomguard: error: --spool: cannot use {str(spool)!r} as the spool directory (Permission denied)\n"
    )
    assert manager.requests == []


# --- against the real manager ---------------------------------------------------------------------


@pytest.mark.slow
def test_once_against_the_real_manager_tells_each_fate_apart(tmp_path: Path) -> None:
    """A real ``oomguard manager`` (SQLite): delivered 0, wrong token 77, wrong URL 78, and a node
    name it would refuse (422 on every report before) is sanitized, said, and stored."""
    pytest.importorskip("fastapi")
    import json
    import urllib.request

    from tests.helpers.manager import AGENT, VIEWER_H, ManagerProcess

    server = ManagerProcess(f"sqlite:///{tmp_path / 'fleet.db'}").start()
    try:
        base = ("agent", "--once", "--no-gpu", "--spool", str(tmp_path / "spool"))
        cases = [
            (("--manager", server.url, "--token", AGENT, "--node", "_edge"), EXIT_OK, "using 'edge'"),
            (("--manager", server.url, "--token", "not-the-token"), EXIT_TOKEN_REFUSED, "token refused"),
            (("--manager", server.url + "/nope", "--token", AGENT), EXIT_WRONG_URL, "wrong manager URL"),
        ]
        for args, code, said in cases:
            proc = run_oomguard(*base, *args)
            assert proc.returncode == code, proc.stderr
            assert said in proc.stderr and "Traceback" not in proc.stderr
        req = urllib.request.Request(f"{server.url}/api/v1/nodes/edge", headers=VIEWER_H)
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())["latest"]["memory"]["effective_bytes"] > 0
    finally:
        server.stop()
