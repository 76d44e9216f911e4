"""``oomguard run`` and ``oomguard verify`` in real cgroup v2 groups."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.integration.vm.guest.cg import HOG, PYTHON, Group, MiB, parse_report, read_events

GroupFactory = Callable[..., Group]


def _run(g: Group, events: Path, *args: str) -> tuple[int, list[dict], str]:  # type: ignore[type-arg]
    proc = g.run(PYTHON, "-m", "oomguard", "run", "--restart", "never", "--events", str(events), *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, read_events(events), proc.stdout


def test_run_tells_an_oom_kill_apart_through_memory_events(group: GroupFactory, events: Path) -> None:
    g = group(64 * MiB)
    rc, evs, _ = _run(g, events, "--budget", "32MiB", "--", PYTHON, "-c", HOG, str(256 * MiB))
    assert rc == 137
    assert [e["event"] for e in evs] == ["start", "exit"]
    end = evs[1]
    assert (end["reason"], end["signal"], end["exit_code"], end["oom_victim"]) == ("oom-kill", 9, None, "worker")
    assert end["budget_bytes"] == 32 * MiB
    if end["peak_bytes"] is None:  # the OOM reaper emptied it before it exited (a loaded host): said, not hidden
        assert end["message"].startswith("peak unknown: the OOM reaper emptied the worker"), end["message"]
    else:
        assert end["peak_bytes"] > 32 * MiB  # it got past its budget before the kernel stopped it
    assert g.keyed("memory.events")["oom_kill"] == 1


def test_run_a_plain_sigkill_is_not_an_oom_kill(group: GroupFactory, events: Path) -> None:
    g = group(256 * MiB)  # an auto budget would be 0 here (the 256 MiB margin floor): run would start nothing
    rc, evs, _ = _run(g, events, "--budget", "64MiB", "--", PYTHON, "-c", "import os; os.kill(os.getpid(), 9)")
    assert rc == 137
    assert (evs[-1]["reason"], evs[-1]["signal"], evs[-1]["oom_victim"], evs[-1]["oom_kills"]) == ("signal", 9, None, 0)
    assert g.keyed("memory.events")["oom_kill"] == 0


def test_run_passes_the_budget_of_the_group(group: GroupFactory, events: Path) -> None:
    g = group(512 * MiB)
    show = "import os, sys; print(os.environ['OOMGUARD_BUDGET_BYTES'], os.environ['OOMGUARD_BUDGET'], sys.argv[1])"
    rc, evs, out = _run(g, events, "--", PYTHON, "-c", show, "{budget_bytes}")
    assert rc == 0
    assert out.split() == [str(256 * MiB), "256MiB", str(256 * MiB)]  # 512 MiB - 256 MiB margin
    assert (evs[-1]["reason"], evs[-1]["exit_code"], evs[-1]["budget_bytes"]) == ("clean", 0, 256 * MiB)


def _verify(g: Group, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    proc = g.run(PYTHON, "-m", "oomguard", "verify", "--json", "--hold", "0.2", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_verify_delivers_a_budget_that_fits(group: GroupFactory) -> None:
    g = group(128 * MiB)
    rc, out = _verify(g, "--budget", "32MiB")
    assert rc == 0, out
    assert out["delivered"] is True
    assert out["target_bytes"] == out["touched_bytes"] == 32 * MiB
    assert out["oom_kills"] == 0
    assert out["oom_counter"] == f"{g.path}/memory.events"
    assert (out["effective_bytes"], out["limited_by"]) == (128 * MiB, "cgroup-v2")
    assert [c["outcome"] for c in out["children"]] == ["ok"]


def test_verify_catches_a_budget_above_the_limit(group: GroupFactory) -> None:
    g = group(128 * MiB)
    rc, out = _verify(g, "--budget", "512MiB")
    assert rc == 4, out  # verify itself survives to say so
    assert out["delivered"] is False
    assert out["oom_kills"] >= 1
    assert "oom-kill" in {c["outcome"] for c in out["children"]}
    assert any(w["code"] == "budget-exceeds-limit" for w in out["warnings"])


def test_probe_api_in_a_group(group: GroupFactory) -> None:
    """The public API, not only the CLI: ``oomguard.probe()`` inside the group."""
    g = group(200 * MiB)
    code = "import json, oomguard; r = oomguard.probe(); print(json.dumps(r))"
    proc = g.run(PYTHON, "-c", code)
    report = parse_report(proc)
    assert (report["memory"]["effective_bytes"], report["memory"]["limited_by"]) == (200 * MiB, "cgroup-v2")
