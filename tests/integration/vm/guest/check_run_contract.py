"""``oomguard run``'s contract on cgroup v2, where ``memory.events`` is hierarchical.

- A descendant's OOM kill (the worker is a wrapper, as the seed's run.sh was) is an OOM kill,
  and concurrency steps down.
- An operator's ``kill -9`` of the worker while another process of the same group is
  OOM-killed is not blamed on the OOM killer.
- An OOM kill of the worker beside a living outsider (an agent, the entrypoint's shell) is.
- A budget that cannot work (0: the margin takes the whole basis) starts nothing: exit 3.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.helpers.wait import wait_until
from tests.helpers.workers import KILLED_9, OUTSIDER
from tests.integration.vm.guest.cg import HOG, PYTHON, Group, MiB, check, read_events, warning_codes

GroupFactory = Callable[..., Group]


def _run(g: Group, events: Path, *args: str) -> tuple[int, list[dict], str]:  # type: ignore[type-arg]
    proc = g.run(PYTHON, "-m", "oomguard", "run", "--events", str(events), *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, read_events(events) if events.exists() else [], proc.stderr


def _wait_for(path: Path) -> str:
    return wait_until(lambda: path.read_text().strip() if path.exists() else "", what=f"{path} to be written")


def test_a_descendants_oom_kill_is_an_oom_kill_and_steps_down(group: GroupFactory, events: Path) -> None:
    g = group(320 * MiB)
    hog = HOG.replace("int(sys.argv[1])", "int(sys.argv[1]) * 120 * 2**20")
    wrapper = f'{PYTHON} -c "{hog}" "$OOMGUARD_CONCURRENCY" || exit 3'  # 3 x 120 MiB does not fit, 2 x 120 does
    rc, evs, err = _run(
        g, events, "--budget", "64MiB", "--per-job", "16MiB", "--max-jobs", "3", "--backoff-initial", "10ms",
        "--", "sh", "-c", wrapper,
    )  # fmt: skip
    assert rc == 0, err
    exits = [e for e in evs if e["event"] == "exit"]
    assert [(e["reason"], e["oom_victim"], e["exit_code"], e["concurrency"]) for e in exits] == [
        ("oom-kill", "descendant", 3, 3),
        ("clean", None, 0, 2),
    ]
    assert exits[0]["oom_kills"] == 1 and exits[0]["limited_by"] == "cgroup-v2"
    assert next(e for e in evs if e["event"] == "restart")["message"] == "after an OOM kill: concurrency 3 -> 2"
    assert g.keyed("memory.events")["oom_kill"] == 1


def test_a_kill_9_beside_an_oom_kill_is_no_oom_kill(group: GroupFactory, events: Path, tmp_path: Path) -> None:
    g = group(192 * MiB)
    ready, go = tmp_path / "ready", tmp_path / "go"
    outsider = g.popen(PYTHON, "-c", OUTSIDER, str(ready), str(go))
    try:
        pid = _wait_for(ready)
        worker = (PYTHON, "-c", KILLED_9, str(go), pid)
        rc, evs, err = _run(g, events, "--restart", "never", "--budget", "32MiB", "--", *worker)
    finally:
        outsider.kill()
        outsider.wait()
    assert outsider.returncode == -9  # the OOM killer's victim
    assert g.keyed("memory.events")["oom_kill"] == 1
    assert rc == 137, err
    end = evs[-1]
    assert (end["reason"], end["signal"], end["oom_victim"], end["oom_kills"]) == ("signal", 9, "group", 1)
    # The worker kills itself just after the outsider's death: the kernel's notification found it still
    # running (not its kill: supervisor/oomwatch.py), or it was at the same moment (cannot tell).
    ran_on = "was not the worker's, which ran on after it"
    unplaced = "cannot tell whether it was this process (1 other process(es) of the group ended meanwhile"
    assert ran_on in end["message"] or unplaced in end["message"], end["message"]


def test_an_oom_kill_of_the_worker_beside_a_living_outsider(group: GroupFactory, tmp_path: Path) -> None:
    """The kernel may OOM-kill a second process of the group just after the worker: CI's VM saw the
    supervisor itself end by SIGKILL (rc -9, only its start event written), as the v1 host saw a
    neighbour in tests/integration/test_run_numbers.py (the MMF_OOM_SKIP window: the victim's mm is skipped
    before its last pages are uncharged, and the next largest process is taken). That attempt did
    not set up the case under test, so it is said and run again, three attempts at most; every
    assertion holds on the attempt that counts."""
    g = group(192 * MiB)
    code = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
    for attempt in range(1, 4):
        ready, log = tmp_path / f"ready-{attempt}", tmp_path / f"events-{attempt}.jsonl"
        outsider = g.popen(PYTHON, "-c", code, str(ready))
        try:
            _wait_for(ready)
            worker = (PYTHON, "-c", HOG, str(512 * MiB))
            rc, evs, err = _run(g, log, "--restart", "never", "--budget", "32MiB", "--", *worker)
            assert outsider.poll() is None  # it lives on
        finally:
            outsider.kill()
            outsider.wait()
        if rc != -9:
            break
        print(f"attempt {attempt}: the kernel OOM-killed the supervisor as well (the MMF_OOM_SKIP window); again")
    assert rc == 137, err
    assert (evs[-1]["reason"], evs[-1]["oom_victim"], evs[-1]["oom_kills"]) == ("oom-kill", "worker", 1)
    assert "over its 32 MiB budget" in evs[-1]["message"]


def test_a_budget_of_zero_starts_nothing(group: GroupFactory, events: Path, tmp_path: Path) -> None:
    g = group(256 * MiB)  # the auto margin's 256 MiB floor takes all of it
    marker = tmp_path / "started"
    rc, evs, err = _run(g, events, "--", "touch", str(marker))
    assert rc == 3 and not marker.exists()
    assert [e["event"] for e in evs] == ["give-up"] and evs[0]["budget_bytes"] == 0
    assert err.count("\n") == 1 and "the budget is 0 B: the 256 MiB safety margin takes all" in err
    assert "budget-too-small" in warning_codes(check(g))
