"""``run``, ``verify`` and ``check`` numbers from the v2 kernel (issue 19, item 5; v1:
tests/integration/test_run_numbers.py).

- the peak of a run: the worker tree's VmHWM (``vmhwm``), the isolated group's ``memory.peak``
  ("The max memory usage recorded for the cgroup and its descendants", cgroup-v2.rst 5-2-1);
- ``--isolate`` says the ``memory.max`` the kernel holds ("may be rounded ... when read back");
- an OOM kill is the kernel's OOM killer at the limit;
- ``memory.events`` changes (cgroup-v2.rst 5-2-1: "A value change in this file generates a file
  modified event") date each OOM kill: a neighbour's OOM kill 3 s before a ``kill -9`` of the
  worker is not the worker's, and the worker's own OOM kill 3 s after a neighbour's ``kill -9`` is;
- a pressure stop or an OOM kill at a neighbour's memory does not step the worker down;
- ``verify`` says the group's ``memory.peak``; ``check`` shows ``memory.low``/``min`` as protections
  (cgroup-v2.rst 3-3, "Protections").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers.wait import wait_until
from tests.helpers.workers import FIRST_RUN, HOLDER, OUTSIDER
from tests.integration.vm.guest.cg import PYTHON, Group, MiB, oomguard_env, read_events

GroupFactory = Callable[..., Group]
SHAPE = ("--per-job", "16MiB", "--max-jobs", "3")
ONE_RESTART = ("--max-restarts", "1", "--backoff-initial", "10ms")
HOG = "b = []\nwhile True: c = bytearray(16 << 20); c[::4096] = b'x' * (len(c) // 4096); b.append(c)\n"


def _run(g: Group, events: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = g.run(PYTHON, "-m", "oomguard", "run", "--events", str(events), *args, timeout=240)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, read_events(events) if events.exists() else [], proc.stderr


def _start(g: Group, events: Path, *args: str) -> subprocess.Popen[str]:
    return g.popen(PYTHON, "-m", "oomguard", "run", "--events", str(events), *args, stderr=subprocess.PIPE)


def _wait_for(path: Path) -> str:
    return wait_until(lambda: path.read_text().strip() if path.exists() else "", what=f"{path} to be written")


def _exits(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in evs if e["event"] == "exit"]


def _starts(evs: list[dict[str, Any]]) -> list[int | None]:
    return [e["concurrency"] for e in evs if e["event"] == "start"]


def test_run_numbers_the_peak_is_the_workers_vmhwm(group: GroupFactory, events: Path) -> None:
    g = group(256 * MiB)
    direct = subprocess.Popen(["sleep", "2"])
    status = Path(f"/proc/{direct.pid}/status")
    wait_until(lambda: "State:\tS" in status.read_text(), interval=0.005, what="sleep 2 to sleep")  # loaded
    own = int(next(x for x in status.read_text().splitlines() if "VmHWM" in x).split()[1])
    direct.wait()
    rc, evs, err = _run(g, events, "--restart", "never", "--budget", "64MiB", "--", "sleep", "2")
    end = evs[-1]
    assert rc == 0 and end["peak_source"] == "vmhwm", err
    assert 0.75 * own * 1024 <= end["peak_bytes"] <= 1.25 * own * 1024 < 4 * MiB, (end["peak_bytes"], own)
    assert "(VmHWM), within its 64 MiB budget" in end["message"]


def test_run_numbers_isolated_limit_as_held_and_peak_as_memory_peak(events: Path, tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    code = (
        "import sys\n"
        "g = '/sys/fs/cgroup' + open('/proc/self/cgroup').read().split('::')[1].strip()\n"
        "b = bytearray(64 << 20); b[::4096] = b'x' * (len(b) // 4096)\n"
        "open(sys.argv[1], 'w').write(open(g + '/memory.max').read().strip() + ' ' + open(g + '/memory.peak').read())\n"
    )
    cmd = [PYTHON, "-m", "oomguard", "run", "--isolate", "--budget", "100000001", "--restart", "never"]
    cmd += ["--events", str(events), "--", PYTHON, "-c", code, str(seen)]
    proc = subprocess.run(cmd, env=oomguard_env(), capture_output=True, text=True, timeout=240)  # from the root
    held, peak = map(int, seen.read_text().split())
    assert proc.returncode == 0 and held == 200000002 // 4096 * 4096, proc.stderr  # budget + its margin (100%)
    assert f"with a limit of {held} bytes (200000002 written; the kernel keeps whole pages)" in proc.stderr
    end = read_events(events)[-1]
    assert end["peak_source"] == "memory.peak" and peak <= end["peak_bytes"] < peak + 16 * MiB


def test_run_numbers_an_oom_kill_is_the_kernels_at_the_limit(group: GroupFactory, events: Path) -> None:
    g = group(192 * MiB)
    rc, evs, _ = _run(g, events, "--restart", "never", "--budget", "32MiB", "--", PYTHON, "-c", HOG)
    end = evs[-1]
    assert rc == 137 and (end["reason"], end["oom_victim"]) == ("oom-kill", "worker")
    assert end["message"].endswith("; killed by the kernel's OOM killer at the 192 MiB limit (cgroup-v2, oom_kill +1)")
    assert "within the 192 MiB limit" not in end["message"]


def test_run_numbers_a_neighbours_oom_kill_then_a_kill_9(group: GroupFactory, events: Path, tmp_path: Path) -> None:
    g = group(256 * MiB)
    pidfile, go, ready = tmp_path / "pid", tmp_path / "go", tmp_path / "ready"
    go.write_text("now")
    sup = _start(g, events, *SHAPE, "--budget", "64MiB", *ONE_RESTART, "--", PYTHON, "-c", FIRST_RUN,
                 str(pidfile), str(go), "sleep")  # fmt: skip
    worker = int(_wait_for(pidfile))
    neighbour = g.run(PYTHON, "-c", OUTSIDER, str(ready), str(go))  # joins after the start, OOM-killed
    assert neighbour.returncode == -signal.SIGKILL, neighbour
    time.sleep(3)  # the scenario: the worker runs on for 3 s after the neighbour's OOM kill
    os.kill(worker, signal.SIGKILL)
    _, err = sup.communicate(timeout=240)
    evs = read_events(events)
    end = _exits(evs)[0]
    assert (end["reason"], end["oom_kills"], end["oom_victim"]) == ("signal", 1, "group"), err
    assert "was not the worker's, which ran on after it" in end["message"]
    assert _starts(evs) == [3, 3]  # no step-down


def test_run_numbers_a_neighbours_kill_9_then_the_workers_oom_kill(
    group: GroupFactory, events: Path, tmp_path: Path
) -> None:
    g = group(256 * MiB)
    pidfile, go, held = tmp_path / "pid", tmp_path / "go", tmp_path / "held"
    neighbour = g.popen(PYTHON, "-c", HOLDER, "16", str(held))
    try:
        _wait_for(held)
        sup = _start(g, events, *SHAPE, "--budget", "64MiB", *ONE_RESTART, "--", PYTHON, "-c", FIRST_RUN,
                     str(pidfile), str(go), "hog")  # fmt: skip
        _wait_for(pidfile)
        started = lambda: events.exists() and any(e["event"] == "start" for e in read_events(events))  # noqa: E731
        wait_until(started, what="the supervisor's start event (past watching the group)")
        neighbour.kill()
        neighbour.wait()
        time.sleep(3)  # the scenario: 3 s later (past MARK_EVERY: the supervisor saw the neighbour gone)
        go.write_text("now")
        _, err = sup.communicate(timeout=240)
    finally:
        neighbour.kill()
        neighbour.wait()
    evs = read_events(events)
    end = _exits(evs)[0]
    assert (end["reason"], end["oom_victim"], end["oom_kills"]) == ("oom-kill", "worker", 1), err
    assert "killed by the kernel's OOM killer at the 256 MiB limit (cgroup-v2, oom_kill +1)" in end["message"]
    assert _starts(evs) == [3, 2]


def test_run_numbers_a_pressure_stop_at_a_neighbours_memory(group: GroupFactory, events: Path, tmp_path: Path) -> None:
    g = group(384 * MiB)  # the stop line: 384 - 64 MiB
    pidfile, go, held = tmp_path / "pid", tmp_path / "go", tmp_path / "held"
    go.write_text("now")
    neighbour = g.popen(PYTHON, "-c", HOLDER, "150", str(held))
    try:
        _wait_for(held)
        worker = (PYTHON, "-c", FIRST_RUN, str(pidfile), str(go), "grow")
        _, evs, err = _run(g, events, "--guard", *SHAPE, "--budget", "200MiB", *ONE_RESTART, "--", *worker)
    finally:
        neighbour.kill()
        neighbour.wait()
    stop = _exits(evs)[0]
    assert stop["reason"] == "pressure-stop", err
    assert 145 * MiB <= stop["outside_bytes"] <= 165 * MiB
    assert "working set was outside the worker's tree" in stop["message"] and "nothing lowered" in stop["message"]
    assert _starts(evs) == [3, 3]


def test_run_numbers_an_oom_kill_at_a_neighbours_memory(group: GroupFactory, events: Path, tmp_path: Path) -> None:
    g = group(384 * MiB)
    pidfile, go, held = tmp_path / "pid", tmp_path / "go", tmp_path / "held"
    go.write_text("now")
    neighbour = g.popen(PYTHON, "-c", HOLDER, "200", str(held))
    try:
        _wait_for(held)
        worker = (PYTHON, "-c", FIRST_RUN, str(pidfile), str(go), "hog")
        _, evs, err = _run(g, events, *SHAPE, "--budget", "200MiB", *ONE_RESTART, "--", *worker)
        assert neighbour.poll() is None
    finally:
        neighbour.kill()
        neighbour.wait()
    end = _exits(evs)[0]
    assert (end["reason"], end["oom_victim"]) == ("oom-kill", "worker"), err
    assert 195 * MiB <= end["outside_bytes"] <= 215 * MiB
    assert "of the 384 MiB limit was outside the worker's tree" in end["message"]
    assert _starts(evs) == [3, 3]


def test_run_numbers_verify_says_the_groups_memory_peak(group: GroupFactory) -> None:
    g = group(256 * MiB)
    proc = g.run(PYTHON, "-m", "oomguard", "verify", "--json", "--hold", "0.2", "--budget", "96MiB", timeout=240)
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["group_peak_source"] == "memory.peak", proc.stderr
    assert out["group_peak_bytes"] == int(g.read("memory.peak"))  # a fresh group: its peak is verify's
    assert out["touched_bytes"] <= out["group_peak_bytes"] and "peak_rss_bytes" not in out
    n = len(out["children"])
    assert f"oomguard verify: {n} children touched 96 MiB of 96 MiB in " in proc.stderr


def test_run_numbers_check_shows_protections_as_such(group: GroupFactory) -> None:
    g = group(512 * MiB)
    g.write("memory.low", 64 * MiB)
    g.write("memory.min", 32 * MiB)
    proc = g.run(PYTHON, "-m", "oomguard", "check", "--json")
    prot = json.loads(proc.stdout)["memory"]["protection"]
    assert prot == {"low_bytes": 64 * MiB, "min_bytes": 32 * MiB, "v1_soft_limit_bytes": None}
    human = g.run(PYTHON, "-m", "oomguard", "check").stdout
    assert "  protection       32 MiB         memory.min: kept from reclaim, not a cap\n" in human
    assert "  protection       64 MiB         memory.low: kept from reclaim where it can, not a cap\n" in human
    assert json.loads(proc.stdout)["budget"]["basis_bytes"] == 512 * MiB  # not caps
