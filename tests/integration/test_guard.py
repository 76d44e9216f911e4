"""``oomguard run --guard``: the decisions on numbers, the guard over fake trees (the worker plays the
kernel and writes its own usage), real v1 cgroups here (a growing worker is stopped before the OOM
killer acts), and the manager taking the ``pressure-stop`` event. The v2 memory.high path runs in
the VM (tests/integration/vm/guest/check_guard.py)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomguard.errors import UsageError
from oomguard.policy.budget import guard_margin
from oomguard.probes.counters import MemorySample, read_sample
from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import DirRoot
from oomguard.supervisor.adapt import Adaptation
from oomguard.supervisor.alarm import Alarm
from oomguard.supervisor.config import GuardSettings, parse_signal, settings_from
from oomguard.supervisor.exits import Evidence, classify, pressure_stopped
from oomguard.supervisor.grace import Grace, GraceLearning
from oomguard.supervisor.guard import Guard, binding_group, make_guard
from oomguard.supervisor.guard_state import HIGH, PRESSURE, STOP, GuardState
from oomguard.supervisor.isolate import Isolation
from oomguard.supervisor.waiting import FAST_QUIET, exit_waiter
from tests.conftest import REPO
from tests.helpers.realcgroup import Group, limited_group, writable_parent
from tests.helpers.supervise import cgroup_tree
from tests.helpers.wait import wait_until
from tests.helpers.workers import GRACEFUL

pytestmark = pytest.mark.usefixtures("clean_env")

MiB = 1024**2
GiB = 1024**3
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}
ENV.pop("OOMGUARD_BUDGET", None)


def sample(usage: int | None, inactive: int = 0, stall_s: float | None = None, high: int = 0) -> MemorySample:
    return MemorySample(usage, inactive, {"high": high}, None if stall_s is None else stall_s * 1e6)


# -- the decisions, on numbers ----------------------------------------------------------------------


def test_the_default_margin_is_64mib_or_2_percent_of_the_ceiling() -> None:
    assert guard_margin(512 * MiB) == 64 * MiB
    assert guard_margin(100 * GiB) == 2 * GiB
    assert guard_margin(100 * GiB, pct=5.0) == 5 * GiB
    assert guard_margin(100 * GiB, 128 * MiB) == 128 * MiB
    # below the floor: no room under the ceiling, no line to guard (the watch says the same)
    assert guard_margin(64 * MiB) is None and guard_margin(64 * MiB + 1) == 64 * MiB
    assert guard_margin(GiB, GiB) is None and guard_margin(GiB, pct=100.0) is None
    assert settings_from("10%", "usr1") == GuardSettings((None, 10.0), signal.SIGUSR1)
    assert settings_from(None, None) == GuardSettings()


@pytest.mark.parametrize(
    ("text", "number"), [("none", None), ("NONE", None), ("SIGUSR1", 10), ("usr2", 12), ("10", 10), ("SIGTERM", 15)]
)
def test_on_pressure_names_a_signal(text: str, number: int | None) -> None:
    assert parse_signal(text) == number


@pytest.mark.parametrize("text", ["SIGFOO", "", "999", "-1", "USR1 USR2"])
def test_on_pressure_refuses_what_is_no_signal(text: str) -> None:
    with pytest.raises(UsageError, match=r"^--on-pressure: expected a signal"):
        parse_signal(text)


def test_at_the_budget_once_per_crossing_with_hysteresis() -> None:
    w = GuardState(256 * MiB, 512 * MiB, 64 * MiB, set_high=True, stall_limit=10)
    assert w.stop_line == 448 * MiB and w.rearm == int(256 * MiB * 0.95)
    assert w.step(sample(200 * MiB)) == []
    assert w.step(sample(256 * MiB)) == [PRESSURE, HIGH]  # at the budget: >=
    assert w.step(sample(300 * MiB)) == []  # once per crossing
    assert w.step(sample(250 * MiB)) == []  # below the budget but above 95% of it: not re-armed
    assert w.step(sample(260 * MiB)) == []
    assert w.step(sample(243 * MiB)) == []  # below 95%: re-armed
    assert w.step(sample(257 * MiB)) == [PRESSURE]  # memory.high is set once per run
    assert w.crossings == 2 and w.peak == 300 * MiB and w.stop_why is None


def test_the_working_set_not_the_usage_decides() -> None:
    w = GuardState(256 * MiB, 512 * MiB, 64 * MiB, set_high=False, stall_limit=10)
    assert w.step(sample(500 * MiB, inactive=300 * MiB)) == []  # 200 MiB working set: page cache is reclaimable
    assert w.step(sample(500 * MiB, inactive=40 * MiB)) == [PRESSURE, STOP]  # 460 MiB: past both lines at once
    assert w.stop_why == "working set 460 MiB reached the stop line 448 MiB (512 MiB limit - 64 MiB guard margin)"
    assert w.step(sample(510 * MiB)) == []  # stopped once; the peak still follows
    assert w.peak == 510 * MiB
    assert w.step(sample(None)) == [] and w.peak == 510 * MiB  # unreadable: nothing decided


def test_a_worker_stalled_under_memory_high_is_stopped() -> None:
    w = GuardState(256 * MiB, 512 * MiB, 64 * MiB, set_high=True, stall_limit=10)
    assert w.step(sample(270 * MiB, stall_s=100.0)) == [PRESSURE, HIGH]
    assert w.step(sample(275 * MiB, stall_s=109.0)) == []  # 9 s of full stall since the crossing
    assert w.step(sample(276 * MiB, stall_s=110.0)) == [STOP]
    assert w.stop_why == (
        "stalled 10s on memory under memory.high 256 MiB with the working set 276 MiB above the budget"
    )
    # without memory.high (v1, or not isolated) a stall is the worker's business, not a stop
    v1 = GuardState(256 * MiB, 512 * MiB, 64 * MiB, set_high=False, stall_limit=10)
    assert v1.step(sample(270 * MiB, stall_s=0.0)) == [PRESSURE]
    assert v1.step(sample(270 * MiB, stall_s=60.0)) == []
    # a new crossing counts its stall afresh
    again = GuardState(256 * MiB, 512 * MiB, 64 * MiB, set_high=True, stall_limit=10)
    again.step(sample(270 * MiB, stall_s=0.0))
    again.step(sample(270 * MiB, stall_s=8.0))
    again.step(sample(100 * MiB, stall_s=8.0))  # re-armed
    assert again.step(sample(270 * MiB, stall_s=9.0)) == [PRESSURE]
    assert again.step(sample(270 * MiB, stall_s=17.0)) == []  # 8 s of this crossing, not 17


def test_a_pressure_stop_is_a_verdict_unless_the_kernel_was_first() -> None:
    why = "working set 460 MiB reached the stop line 448 MiB"
    v = pressure_stopped(classify(-15, Evidence(0, 0)), -15, why)
    assert (v.reason, v.victim) == ("pressure-stop", None)
    assert v.note == f"stopped by the guard before the kernel acted: {why}; the worker then ended with signal 15"
    assert pressure_stopped(classify(0, Evidence(0, 0)), 0, why).reason == "pressure-stop"  # a graceful exit 0 too
    killed = classify(-9, Evidence(1, 0))
    assert pressure_stopped(killed, -9, why) == killed  # the OOM killer acted first: an oom-kill stays one


def test_a_pressure_stop_steps_down_as_an_oom_kill_does() -> None:
    a = Adaptation("concurrency")
    report: Any = {"budget": {"source": "auto", "basis_bytes": 8 * GiB, "safety_margin_bytes": 819 * MiB}}
    assert a.after_oom(report, 3, (8 * GiB, None, 3), "pressure-stop") == "after a pressure stop: concurrency 3 -> 2"
    assert a.after_run(1000, 10, "pressure-stop") is None  # not a healthy end: the cap stays
    assert a.capped(3) == 2
    m = Adaptation("margin")
    assert m.after_oom(report, None, (8 * GiB, None, None), "pressure-stop").startswith(
        "after a pressure stop: safety margin raised by 409.6 MiB"
    )
    # in a small group the step after a pressure stop is 5% of it; after an OOM kill the 256 MiB floor stays
    small: Any = {"budget": {"source": "auto", "basis_bytes": 768 * MiB, "safety_margin_bytes": 256 * MiB}}
    s = Adaptation("margin")
    assert s.after_oom(small, None, (768 * MiB, None, None), "pressure-stop") == (
        "after a pressure stop: safety margin raised by 38.4 MiB (now +38.4 MiB)"
    )
    assert s.after_oom(small, None, (768 * MiB, None, None)) == (
        "after an OOM kill: safety margin raised by 256 MiB (now +294.4 MiB)"
    )


@pytest.mark.parametrize(
    ("limit_file", "limited_by", "version", "watched"),
    [
        ("/sys/fs/cgroup/a/memory.max", "cgroup-v2", 2, "/sys/fs/cgroup/a"),  # the limit is set above: there
        ("/sys/fs/cgroup/a/b/memory.max", "cgroup-v2", 2, "/sys/fs/cgroup/a/b"),
        ("/proc/meminfo:MemTotal", "meminfo", 2, "/sys/fs/cgroup/a/b"),  # no cgroup limit: the own group
        ("/sys/fs/cgroup/a/b/memory.stat:hierarchical_memory_limit", "cgroup-v1", 1, "/sys/fs/cgroup/a/b"),
    ],
)
def test_the_group_whose_limit_binds_is_watched(limit_file: str, limited_by: str, version: int, watched: str) -> None:
    cgroup = {"dir": "/sys/fs/cgroup/a/b", "version": version, "limit_file": limit_file}
    report: Any = {"memory": {"limited_by": limited_by, "cgroup": cgroup}}
    assert binding_group(report) == (watched, version)


# -- reading a group ---------------------------------------------------------------------------------


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / name.lstrip("/")).write_text(text)


def test_read_sample_on_v1_and_v2_trees(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "/g2/memory.current": f"{300 * MiB}\n",
            "/g2/memory.stat": f"anon {200 * MiB}\nfile {100 * MiB}\ninactive_file {60 * MiB}\n",
            "/g2/memory.events": "low 0\nhigh 7\nmax 0\noom 0\noom_kill 0\n",
            "/g2/memory.pressure": "some avg10=1.00 avg60=0.50 avg300=0.10 total=900\n"
            "full avg10=0.50 avg60=0.20 avg300=0.00 total=400\n",
            "/g1/memory.usage_in_bytes": f"{300 * MiB}\n",
            "/g1/memory.stat": f"inactive_file {10 * MiB}\ntotal_inactive_file {50 * MiB}\n",
        },
    )
    root = DirRoot(str(tmp_path))
    s2 = read_sample(root, "/g2", 2)
    assert (s2.working_set, s2.events["high"], s2.stall_us) == (240 * MiB, 7, 400.0)
    s1 = read_sample(root, "/g1", 1)
    assert (s1.working_set, s1.events, s1.stall_us) == (250 * MiB, {}, None)  # the hierarchical total_ key
    assert read_sample(root, "/gone", 2) == MemorySample(None, None, {}, None)


FILES = ["memory.current", "memory.stat", "memory.events", "memory.pressure"]


@given(st.dictionaries(st.sampled_from(FILES), st.text()))
def test_read_sample_never_raises(files: dict[str, str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        write_tree(Path(tmp), {f"/g/{k}": v for k, v in files.items()})
        s = read_sample(DirRoot(tmp), "/g", 2)
        assert s.working_set is None or s.working_set >= 0


# -- the guard over a fake tree: it reads, signals, writes memory.high -----------------------------


def wait_text(path: Path) -> str:
    return wait_until(lambda: path.read_text() if path.exists() else "", what=f"{path} to be written")


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A child that writes which signals it got (SIGUSR1 is recorded, not fatal)."""
    got = tmp_path / "signals"
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda s, f: open(sys.argv[1], 'a').write('USR1\\n'))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen([PY, "-c", code, str(got)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    yield p, got
    p.kill()
    p.wait()


def test_the_guard_signals_and_sets_memory_high(tmp_path: Path, sleeper: tuple[subprocess.Popen[str], Path]) -> None:
    child, got = sleeper
    tree = tmp_path / "tree"
    group = "/sys/fs/cgroup/w"
    write_tree(tree, {group + "/memory.current": f"{100 * MiB}\n", group + "/memory.events": "high 0\n"})
    iso = Isolation(group, 2, DirRoot(str(tree)), CgroupFS(str(tree)))
    watch = GuardState(256 * MiB, 512 * MiB, 64 * MiB, set_high=True, stall_limit=10)
    err = io.StringIO()
    settings = GuardSettings(on_pressure=signal.SIGUSR1)
    root = DirRoot(str(tree))
    now = [100.0]
    g = Guard(settings, watch, root=root, group=group, version=2, pid=child.pid, stderr=err, isolation=iso,
              stop_timeout=30.0, clock=lambda: now[0])  # fmt: skip
    assert g.tick() is False and not (tree / group.lstrip("/") / "memory.high").exists()
    now[0] += 0.1
    write_tree(tree, {group + "/memory.current": f"{300 * MiB}\n", group + "/memory.events": "high 3\n"})
    assert g.tick() is False
    assert (tree / group.lstrip("/") / "memory.high").read_text() == str(256 * MiB)
    assert wait_text(got) == "USR1\n" and child.poll() is None  # delivered, handled, alive
    assert err.getvalue().splitlines() == [
        f"oomguard run: guard: working set 300 MiB reached the budget 256 MiB; SIGUSR1 sent to pid {child.pid}",
        f"oomguard run: guard: memory.high of {group} set to 256 MiB",
    ]
    write_tree(tree, {group + "/memory.current": f"{450 * MiB}\n"})
    now[0] += 0.1  # 100, 300, 450 MiB over 0.2 s: 1750 MiB/s
    assert g.tick() is True and g.tick() is False  # stop once
    # while it stops, memory.high is lifted from the budget to just under the ceiling (half a margin)
    assert (tree / group.lstrip("/") / "memory.high").read_text() == str(480 * MiB)
    assert err.getvalue().splitlines()[2:] == [
        "oomguard run: guard: pressure stop: working set 450 MiB reached the stop line 448 MiB (512 MiB limit - "
        "64 MiB guard margin); growing 1.71 GiB/s, the ceiling 0.0354s away at that rate, within --stop-timeout "
        "30s: the stop must curb the growth; SIGTERM to the worker's process group",
        f"oomguard run: guard: memory.high of {group} set to 480 MiB while the worker stops",
    ]
    stop: dict[str, int | str | None] = {"guard_margin_bytes": 64 * MiB, "grace_bytes": 0}
    stop |= {
        "stop_working_set_bytes": 450 * MiB,
        "grace_source": None,
        "grace_high_bytes": 480 * MiB,
        "stop_rate_bytes_per_s": 1750 * MiB,
    }
    assert g.fields() == {**stop, "working_set_peak_bytes": 450 * MiB, "grown_after_stop_bytes": 0}
    assert g.interval() == settings.fast_interval  # while the worker stops, its growth is followed closely
    write_tree(tree, {group + "/memory.current": f"{480 * MiB}\n"})  # its graceful stop costs 30 MiB
    assert g.tick() is False
    write_tree(tree, {group + "/memory.current": f"{470 * MiB}\n"})
    assert g.tick() is False
    assert g.fields() == {**stop, "working_set_peak_bytes": 480 * MiB, "grown_after_stop_bytes": 30 * MiB}
    assert g.summary() == "guard: the working set reached the budget 1 time(s), memory.high events +3"


# -- the whole supervisor over a fake tree ---------------------------------------------------------

SUPERVISE = """
import json, sys
from oomguard.policy.plan import Shape
from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import DirRoot
from oomguard.supervisor.events import EventLog
from oomguard.supervisor.config import GuardSettings
from oomguard.supervisor.restart import RestartPolicy
from oomguard.supervisor.supervise import RunConfig, Supervisor

tree, events, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
policy = RestartPolicy(opts.get("restart", "on-failure"), backoff_initial=0.01, max_restarts=3)
guard = GuardSettings(on_pressure=opts.get("on_pressure"), stall_limit=opts.get("stall_limit", 10.0))
config = RunConfig(
    opts["command"], budget=opts.get("budget"), shape=Shape(**opts["shape"]) if opts.get("shape") else None,
    policy=policy, isolate=opts.get("isolate", False), guard=guard, stop_timeout=opts.get("stop_timeout", 5.0),
)
sys.exit(Supervisor(config, EventLog(events), root=DirRoot(tree), cgroupfs=CgroupFS(tree)).run())
"""

# Run N (counted in STATE) plays PLAN[N], a list of steps on its group (the isolated group of its
# parent, the supervisor, when ISOLATED): {"usage": n} writes memory.current and waits 50 ms,
# {"write": {file: text}}, {"wait_for": file}, {"copy": [file, dest]}, {"sleep": s}; then it exits 0.
# SIGTERM is written down in MARKER, then it exits 0. Either way it sets memory.current back to
# 1 MiB first, as the kernel uncharges what an exiting process held.
GROWER = """
import json, os, shutil, signal, sys, time
tree, marker, state, plan, isolated = sys.argv[1:6]
n = int(open(state).read()) if os.path.exists(state) else 0
open(state, 'w').write(str(n + 1))
group = tree + '/sys/fs/cgroup' + ('/oomguard-run-%d' % os.getppid() if isolated == '1' else '')
def term(*a):
    open(marker, 'a').write('TERM %d\\n' % n)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
import atexit
atexit.register(lambda: open(group + '/memory.current', 'w').write(str(1 << 20)))
for step in json.loads(plan)[n]:
    if 'usage' in step:
        open(group + '/memory.current', 'w').write(str(step['usage']))
        time.sleep(0.05)
    for name, text in step.get('write', {}).items():
        open(group + '/' + name, 'w').write(text)
    while 'wait_for' in step and not os.path.exists(group + '/' + step['wait_for']):
        time.sleep(0.01)
    if 'copy' in step:
        shutil.copy(group + '/' + step['copy'][0], step['copy'][1])
    time.sleep(step.get('sleep', 0))
"""


def grow(*usages: int) -> list[dict[str, Any]]:
    return [{"usage": u} for u in usages]


def supervise(
    tree: Path, plan: list[list[dict[str, Any]]], isolated: bool = False, **opts: Any
) -> tuple[int, list[Any]]:
    events, marker = tree.parent / "events.jsonl", tree.parent / "marker"
    state = tree.parent / "state"
    grower = [PY, "-c", GROWER, str(tree), str(marker), str(state), json.dumps(plan), "1" if isolated else "0"]
    opts = {"command": grower, "isolate": isolated, **opts}
    proc = subprocess.run([PY, "-c", SUPERVISE, str(tree), str(events), json.dumps(opts)],
                          env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, [json.loads(line) for line in events.read_text().splitlines()]


def test_a_growing_worker_is_stopped_and_restarted_with_one_job_fewer(tmp_path: Path) -> None:
    # 1 GiB: auto budget 768 MiB, 3 jobs of 256 MiB; the guard stops at 1 GiB - 64 MiB = 960 MiB.
    tree = cgroup_tree(tmp_path / "tree", 2, GiB, extra={"sys/fs/cgroup/memory.stat": "inactive_file 0\n"})
    first = [*grow(500 * MiB, 800 * MiB, 900 * MiB, 970 * MiB), {"sleep": 10}]
    rc, ev = supervise(tree, [first, [*grow(500 * MiB), {"sleep": 0.3}]], shape={"per_job": 256 * MiB})
    assert rc == 0
    assert [(e["event"], e["concurrency"]) for e in ev] == [
        ("start", 3), ("exit", 3), ("restart", 3), ("start", 2), ("exit", 2),
    ]  # fmt: skip
    stop = ev[1]
    assert (stop["reason"], stop["exit_code"], stop["oom_kills"]) == ("pressure-stop", 0, 0)
    assert (stop["guard_margin_bytes"], stop["working_set_peak_bytes"]) == (64 * MiB, 970 * MiB)
    assert (
        "stopped by the guard before the kernel acted: working set 970 MiB reached the stop line 960 MiB"
        in (stop["message"])
    )
    assert ev[2]["message"] == "after a pressure stop: concurrency 3 -> 2"
    assert (tmp_path / "marker").read_text() == "TERM 0\n"  # the worker got its SIGTERM
    assert ev[4]["reason"] == "clean" and ev[4]["working_set_peak_bytes"] == 500 * MiB


def test_page_cache_is_no_reason_to_stop(tmp_path: Path) -> None:
    tree = cgroup_tree(tmp_path / "tree", 2, GiB, extra={"sys/fs/cgroup/memory.stat": f"inactive_file {300 * MiB}\n"})
    rc, ev = supervise(tree, [[*grow(1000 * MiB), {"sleep": 0.5}]], restart="never")
    assert rc == 0 and ev[1]["reason"] == "clean" and ev[1]["working_set_peak_bytes"] == 700 * MiB


def test_a_worker_that_ignores_sigterm_gets_sigkill_after_the_stop_timeout(tmp_path: Path) -> None:
    tree = cgroup_tree(tmp_path / "tree", 2, GiB)
    current = tree / "sys/fs/cgroup/memory.current"
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    code += f"open(sys.argv[1], 'w').write('{1000 * MiB}'); time.sleep(30)"
    stubborn = [PY, "-c", code, str(current)]
    rc, ev = supervise(tree, [], restart="never", command=stubborn, stop_timeout=0.3)
    assert rc == 137
    assert (ev[1]["reason"], ev[1]["signal"], ev[1]["duration_s"] < 10) == ("pressure-stop", 9, True)


@pytest.mark.slow
def test_isolated_on_v2_memory_high_then_a_stall_stop(tmp_path: Path) -> None:
    """--budget 256MiB --isolate: a 512 MiB group; at the budget memory.high; 2 s of full stall over a 1 s limit."""
    tree = cgroup_tree(tmp_path / "tree", 2, 2 * GiB, extra={"sys/fs/cgroup/cgroup.subtree_control": "memory\n"})
    psi = "some avg10=90.00 avg60=50.00 avg300=10.00 total=%d\nfull avg10=90.00 avg60=50.00 avg300=10.00 total=%d\n"
    plan = [
        {"write": {"memory.pressure": psi % (0, 0)}},
        *grow(100 * MiB, 300 * MiB),
        {"wait_for": "memory.high", "copy": ["memory.high", str(tmp_path / "high")]},
        {"write": {"memory.pressure": psi % (2_000_000, 2_000_000)}, "sleep": 10},
    ]
    rc, ev = supervise(tree, [plan], isolated=True, budget="256MiB", restart="never", stall_limit=1.0)
    end = ev[1]
    assert rc == 0 and end["reason"] == "pressure-stop", end
    assert (
        "stalled 1s on memory under memory.high 256 MiB with the working set 300 MiB above the budget"
        in (end["message"])
    )
    assert end["message"].endswith("guard: the working set reached the budget 1 time(s), memory stall 2.0s")
    assert (tmp_path / "high").read_text() == str(256 * MiB)  # memory.high as the worker saw it, before removal
    assert (tmp_path / "marker").read_text() == "TERM 0\n"


# -- the manager takes the event as the supervisor sends it -----------------------------------------


def test_the_manager_stores_a_pressure_stop_apart_from_oom_kills(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from oomguard.manager.app import create_app
    from oomguard.manager.bodies import EventEnvelope
    from oomguard.manager.db import migrate
    from oomguard.manager.settings import Settings
    from tests.helpers.manager import AGENT_H, VIEWER, VIEWER_H, local_client

    tree = cgroup_tree(tmp_path / "tree", 2, GiB)
    rc, ev = supervise(tree, [[*grow(970 * MiB), {"sleep": 10}], []], shape={"per_job": 256 * MiB})
    assert rc == 0 and [e["reason"] for e in ev if e["event"] == "exit"] == ["pressure-stop", "clean"]
    for e in ev:  # every field the supervisor sends passes the manager's model, unchanged (its other fields unset)
        got = EventEnvelope.model_validate({"node": "n1", "id": "x", "event": e}).event
        assert got.model_dump(exclude_unset=True) == e
    db = f"sqlite:///{tmp_path / 'oomguard.db'}"
    migrate(db)
    app = create_app(Settings(db_url=db, agent_token="agent-secret-token", viewer_token=VIEWER))
    with local_client(app) as c:
        for e in ev:
            r = c.post("/api/v1/events", json={"node": "n1", "id": uuid.uuid4().hex, "event": e}, headers=AGENT_H)
            assert r.status_code == 200 and r.json()["stored"], r.text
        events = c.get("/api/v1/nodes/n1", headers=VIEWER_H).json()["events"]
        assert sorted(e["reason"] or "" for e in events) == ["", "", "clean", "pressure-stop", "pressure-stop"]
        node = c.get("/api/v1/nodes", headers=VIEWER_H).json()["nodes"][0]
        assert node["oom_kills_24h"] == 0  # a pressure stop is no OOM kill
        bad = {**ev[1], "reason": "pressure-stopp"}
        r = c.post("/api/v1/events", json={"node": "n1", "id": "bad-1", "event": bad}, headers=AGENT_H)
        assert r.status_code == 422


# -- real cgroups here (v1 on this machine kind) ---------------------------------------------------

VERSION, PARENT = writable_parent()
needs_cgroup = pytest.mark.skipif(VERSION is None, reason=f"real cgroups unavailable: {PARENT}")

# Grows by 8 MiB every 50 ms (160 MiB/s) until it is stopped; SIGTERM is written to argv[1], then it
# exits 0. With "shed" as argv[2] it frees all but 64 MiB on SIGUSR1, says so, and exits 0 a second
# later; with a size as argv[3] it stops growing there and exits 0.
GROWING = """
import os, signal, sys, time
marker, mode, upto = sys.argv[1], sys.argv[2], int(eval(sys.argv[3], {'env': os.environ}))
chunks, shed = [], []
def term(*a):
    open(marker, 'a').write('TERM\\n'); sys.exit(0)
def usr1(*a):
    del chunks[8:]; shed.append(time.monotonic()); open(marker, 'a').write('USR1\\n')
signal.signal(signal.SIGTERM, term)
signal.signal(signal.SIGUSR1, usr1)
while not shed and len(chunks) * (8 << 20) < upto:
    c = bytearray(8 << 20); c[::4096] = b'x' * len(range(0, len(c), 4096)); chunks.append(c)
    time.sleep(0.05)
time.sleep(1.0 if shed else 0)
"""


@pytest.fixture
def group() -> Iterator[Group]:
    with limited_group(512 * MiB, no_swap=True) as g:
        yield g


def run_in(g: Group, tmp_path: Path, *args: str, upto: str = str(2 * GiB), mode: str = "grow") -> tuple[int, Any]:
    ev = tmp_path / "ev.jsonl"
    ev.unlink(missing_ok=True)  # this run's events only
    worker = [PY, "-c", GROWING, str(tmp_path / "marker"), mode, upto]
    proc = g.run(PY, "-m", "oomguard", "run", "--events", str(ev), *args, "--", *worker, env=ENV)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, [json.loads(line) for line in ev.read_text().splitlines()]


@needs_cgroup
@pytest.mark.slow
def test_without_the_guard_the_kernel_kills_with_it_the_worker_is_stopped(group: Group, tmp_path: Path) -> None:
    rc, ev = run_in(group, tmp_path, "--restart", "never")
    assert rc == 137 and (ev[1]["reason"], ev[1]["oom_kills"]) == ("oom-kill", 1)
    assert group.oom_kills() == 1 and not (tmp_path / "marker").exists()  # no SIGTERM: the kernel's SIGKILL
    rc, ev = run_in(group, tmp_path, "--restart", "never", "--guard")
    end = ev[1]
    assert rc == 0 and (end["reason"], end["oom_kills"], end["exit_code"]) == ("pressure-stop", 0, 0), end
    assert group.oom_kills() == 1  # not one more: the guard acted first
    assert (tmp_path / "marker").read_text() == "TERM\n"  # the worker got its SIGTERM
    assert end["guard_margin_bytes"] == 64 * MiB  # max(64 MiB, 2% of 512 MiB)
    assert 448 * MiB <= end["working_set_peak_bytes"] < 512 * MiB


@needs_cgroup
@pytest.mark.slow
def test_on_pressure_sigusr1_lets_the_worker_shed_load_and_live(group: Group, tmp_path: Path) -> None:
    # 512 MiB: budget 256 MiB; the worker grows past it, gets SIGUSR1, frees all but 64 MiB, ends well.
    rc, ev = run_in(group, tmp_path, "--restart", "never", "--guard", "--on-pressure", "SIGUSR1", mode="shed")
    assert rc == 0 and ev[1]["reason"] == "clean", ev
    assert (tmp_path / "marker").read_text() == "USR1\n"  # once: the working set fell below 95% after it
    assert 256 * MiB <= ev[1]["working_set_peak_bytes"] < 448 * MiB
    assert ev[1]["message"].endswith("guard: the working set reached the budget 1 time(s)")
    assert group.oom_kills() == 0


@needs_cgroup
@pytest.mark.slow
def test_a_pressure_stop_steps_concurrency_down_on_a_real_group(group: Group, tmp_path: Path) -> None:
    # 3 jobs of 80 MiB planned in the 256 MiB budget; each really takes 150 MiB: 450 MiB is stopped, 300 fits.
    upto = "int(env['OOMGUARD_CONCURRENCY']) * 150 * 2**20"
    rc, ev = run_in(group, tmp_path, "--guard", "--per-job", "80MiB", "--max-jobs", "3", "--backoff-initial",
                    "10ms", upto=upto)  # fmt: skip
    assert rc == 0, ev
    assert [e["concurrency"] for e in ev if e["event"] == "start"] == [3, 2]
    assert [e["reason"] for e in ev if e["event"] == "exit"] == ["pressure-stop", "clean"]
    assert next(e for e in ev if e["event"] == "restart")["message"] == "after a pressure stop: concurrency 3 -> 2"
    assert group.oom_kills() == 0


# -- fast growth: sampling faster near the ceiling, and the kernel's wake-up at the stop line -------


def test_the_guard_samples_faster_near_the_ceiling(tmp_path: Path) -> None:
    group = "/sys/fs/cgroup/w"
    write_tree(tmp_path, {group + "/memory.current": f"{100 * MiB}\n"})
    watch = GuardState(256 * MiB, 512 * MiB, 64 * MiB, set_high=False, stall_limit=10)
    assert watch.near == 256 * MiB  # 4 guard margins under the ceiling
    g = Guard(GuardSettings(), watch, root=DirRoot(str(tmp_path)), group=group, version=2, pid=os.getpid(),
              stderr=io.StringIO())  # fmt: skip
    assert g.interval() == 0.1  # before any sample
    g.tick()
    assert g.interval() == 0.1
    write_tree(tmp_path, {group + "/memory.current": f"{300 * MiB}\n"})
    g.tick()
    assert g.interval() == 0.02
    write_tree(tmp_path, {group + "/memory.current": f"{450 * MiB}\n"})
    assert g.tick() is True and g.interval() == 0.02  # stopped: its growth while it stops, closely


def test_the_grace_moves_the_stop_line_and_the_fast_rate_down_with_it() -> None:
    """--grace-bytes keeps room under the stop line for the worker's graceful stop: the line and
    the fast-sampling zone both come that much earlier; the stop's words say so."""
    watch = GuardState(256 * MiB, 512 * MiB, 64 * MiB, set_high=False, stall_limit=10, grace=100 * MiB)
    assert (watch.stop_line, watch.near) == (348 * MiB, 156 * MiB)
    assert watch.step(MemorySample(347 * MiB, 0, {}, None)) == [PRESSURE]  # the budget, not yet the line
    assert watch.step(MemorySample(348 * MiB, 0, {}, None)) == [STOP]
    assert watch.stop_why is not None and "64 MiB guard margin - 100 MiB grace" in watch.stop_why
    assert watch.step(MemorySample(420 * MiB, 0, {}, None)) == []  # its shutdown grew it 72 MiB
    assert (watch.stopped_ws, watch.grown_after_stop) == (348 * MiB, 72 * MiB)


def test_the_grace_is_learned_from_the_stops_before() -> None:
    """grace.py: an ended stop's growth + 15%; one the kernel ended, at least double it and one
    margin more (a lower bound); never above half of the ceiling less the margin; --grace-bytes
    when it is larger."""
    learning = GraceLearning(0)
    assert learning.for_start(512 * MiB, 64 * MiB) == Grace(0, None)
    learning.learn(None, oom_killed=False, margin=64 * MiB)  # no stop: nothing learned
    assert (learning.stops, learning.learned) == (0, 0)
    learning.learn(60 * MiB, oom_killed=True, margin=64 * MiB)  # killed in its shutdown after 60 MiB
    assert learning.for_start(512 * MiB, 64 * MiB) == Grace(124 * MiB, "learned")  # max(120, 60 + 64)
    learning.learn(100 * MiB, oom_killed=False, margin=64 * MiB)  # ended after 100 MiB: 115 MiB < 124
    assert learning.learned == 124 * MiB
    learning.learn(200 * MiB, oom_killed=False, margin=64 * MiB)
    assert learning.learned == 230 * MiB and learning.stops == 3
    assert learning.for_start(512 * MiB, 64 * MiB) == Grace(224 * MiB, "learned", capped=True)  # (512 - 64) / 2
    assert GraceLearning(300 * MiB).for_start(512 * MiB, 64 * MiB) == Grace(300 * MiB, "given")  # not capped
    given = GraceLearning(100 * MiB)
    given.learn(10 * MiB, oom_killed=True, margin=16 * MiB)  # learned 26 MiB, under what was given
    assert given.for_start(512 * MiB, 16 * MiB) == Grace(100 * MiB, "given")


def test_the_guard_says_a_learned_grace_and_that_v1_has_no_throttle_during_the_stop(tmp_path: Path) -> None:
    group = "/sys/fs/cgroup/memory/w"
    write_tree(tmp_path, {group + "/memory.usage_in_bytes": f"{100 * MiB}\n"})
    err, learning = io.StringIO(), GraceLearning(0)
    learning.learn(40 * MiB, oom_killed=True, margin=64 * MiB)
    report: Any = {"memory": {"cgroup": {"dir": group, "version": 1, "limit_file": f"{group}/memory.limit_in_bytes"},
                              "limited_by": "cgroup-v1", "effective_bytes": 512 * MiB}}  # fmt: skip
    g = make_guard(GuardSettings(kernel_alarm=False), report, 256 * MiB, isolated=None, root=DirRoot(str(tmp_path)),
                   pid=os.getpid(), stderr=err, learning=learning)  # fmt: skip
    assert g is not None and (g.watch.grace, g.watch.stop_line) == (104 * MiB, 344 * MiB)
    assert "stop at 344 MiB (512 MiB limit - 64 MiB guard margin - 104 MiB grace learned from earlier stops)" in (
        err.getvalue()
    )
    write_tree(tmp_path, {group + "/memory.usage_in_bytes": f"{350 * MiB}\n"})
    assert g.tick() is True
    assert err.getvalue().splitlines()[-1] == (
        "oomguard run: guard: no throttle during the stop (cgroup v1 has no memory.high): the room under the "
        "stop line is all it has"
    )
    assert g.fields()["grace_source"] == "learned" and g.fields()["grace_high_bytes"] is None


def test_a_v1_threshold_follows_the_page_cache_but_not_every_sample(tmp_path: Path) -> None:
    group = "/sys/fs/cgroup/memory/w"
    write_tree(tmp_path, {group + "/memory.usage_in_bytes": "0\n", group + "/cgroup.event_control": ""})
    control = tmp_path / group.lstrip("/") / "cgroup.event_control"
    alarm = Alarm(DirRoot(str(tmp_path)), CgroupFS(str(tmp_path)), group, 1)

    def registered() -> int:
        efd, ufd, threshold = control.read_text().split()  # "<event_fd> <fd of usage_in_bytes> <threshold>"
        assert int(efd) == alarm.fd and int(ufd) >= 0
        return int(threshold)

    alarm.arm(700 * MiB, 80 * MiB, 10 * MiB)  # usage = stop line + inactive file cache
    assert alarm.failure is None and registered() == 710 * MiB
    assert alarm.pop_notes() == [
        f"{group} has no memory.pressure_level: no wake-up while the group reclaims at its limit"
    ]
    first = alarm.fd
    alarm.arm(700 * MiB, 80 * MiB, 29 * MiB)  # moved by 19 MiB, under a quarter of the margin: kept
    assert alarm.fd == first and registered() == 710 * MiB
    alarm.arm(700 * MiB, 80 * MiB, 35 * MiB)  # moved by 25 MiB, but within a second of the last
    assert alarm.fd == first
    alarm.armed_at -= 1.0
    alarm.arm(700 * MiB, 80 * MiB, 35 * MiB)
    assert registered() == 735 * MiB and alarm.fd != first
    alarm.close()
    assert alarm.fd is None
    # v1 usage never passes the limit (780 MiB here): with more page cache than half the margin, the
    # threshold stays half a margin above the stop line, where it can still be crossed
    alarm = Alarm(DirRoot(str(tmp_path)), CgroupFS(str(tmp_path)), group, 1)
    alarm.arm(700 * MiB, 80 * MiB, 300 * MiB)
    assert registered() == 740 * MiB
    alarm.close()


def test_without_kernel_wake_ups_the_guard_says_so_once_and_samples(tmp_path: Path) -> None:
    group = "/sys/fs/cgroup/memory/w"
    write_tree(tmp_path, {group + "/memory.usage_in_bytes": f"{100 * MiB}\n"})  # no cgroup.event_control
    err = io.StringIO()
    alarm = Alarm(DirRoot(str(tmp_path)), CgroupFS(str(tmp_path)), group, 1)
    watch = GuardState(256 * MiB, 512 * MiB, 64 * MiB, set_high=False, stall_limit=10)
    g = Guard(GuardSettings(), watch, root=DirRoot(str(tmp_path)), group=group, version=1, pid=os.getpid(),
              stderr=err, alarm=alarm)  # fmt: skip
    assert g.tick() is False and g.tick() is False
    assert err.getvalue() == (
        f"oomguard run: guard: {group} has no cgroup.event_control: no wake-up from the kernel, sampling only\n"
    )
    assert alarm.fd is None


def test_after_a_wake_up_the_alarm_is_quiet_for_20_ms_not_the_whole_wait(
    tmp_path: Path, sleeper: tuple[subprocess.Popen[str], Path]
) -> None:
    child, _ = sleeper
    alarm = Alarm(DirRoot(str(tmp_path)), CgroupFS(str(tmp_path)), "/g", 1)
    alarm.fd = os.eventfd(0, os.EFD_NONBLOCK)  # the kernel's side, played here: a write is an event
    try:
        with exit_waiter(child.pid, alarm) as wait:
            t = time.monotonic()
            wait(0.3)  # nothing pending: the whole wait
            assert time.monotonic() - t >= 0.29 and alarm.wakeups == 0
            # Load only lengthens a wait, so the lower bounds hold on any machine; the upper ones are
            # half the wait asked for: what is asserted is that the event ended the wait, not a speed.
            os.eventfd_write(alarm.fd, 1)
            t = time.monotonic()
            wait(10.0)
            took = time.monotonic() - t
            assert took < 10.0 / 2 and alarm.wakeups == 1, took  # woken before its end, and the event read
            os.eventfd_write(alarm.fd, 1)  # the next event comes at once
            t = time.monotonic()
            wait(10.0)  # left out for FAST_QUIET, then polled again within this wait
            took = time.monotonic() - t
            assert FAST_QUIET - 0.002 <= took < 10.0 / 2 and alarm.wakeups == 2, took
    finally:
        alarm.close()


@needs_cgroup
def test_the_kernel_wakes_the_guard_as_usage_crosses_the_threshold(group: Group) -> None:
    if VERSION != 1:
        pytest.skip("usage thresholds are cgroup v1's; v2's memory.events runs in the VM")
    from oomguard.sources.root import LiveRoot

    alarm = Alarm(LiveRoot(), CgroupFS(), str(group.dir), 1)
    alarm.arm(200 * MiB, 10 * MiB, 0)
    assert alarm.failure is None and alarm.fd is not None and alarm.threshold == 200 * MiB
    assert alarm.reclaim is not None and alarm.pop_notes() == []  # memory.pressure_level listened to as well
    code = "import time\nc = []\nfor i in range(75):\n    c.append(b'x' * (4 << 20)); time.sleep(0.02)\n"
    child = subprocess.Popen(["/bin/sh", "-c", f'echo $$ > "{group.dir}/cgroup.procs" && exec "$@"', "sh", PY,
                              "-S", "-c", code])  # fmt: skip
    try:
        import select

        poller = select.poll()
        poller.register(alarm.fd, select.POLLIN)
        assert poller.poll(10_000), "no wake-up"
        usage = int((group.dir / "memory.usage_in_bytes").read_text())
        assert 200 * MiB <= usage < 216 * MiB, usage / MiB  # woken within a few 4 MiB steps of the crossing
        alarm.drain(alarm.fd)
        assert poller.poll(0) == [] and alarm.wakeups == 1  # reset by the read
    finally:
        child.kill()
        child.wait()
        alarm.close()


# The supervisor in-process, live, with the guard's settings as JSON: {"margin_pct", "fast_interval",
# "kernel_alarm", "interval" (optional)}. Grows by argv[2] MiB every argv[3] s until SIGTERM (written
# to argv[1], exit 0).
LIVE = """
import json, sys
from oomguard.supervisor.config import GuardSettings
from oomguard.supervisor.events import EventLog
from oomguard.supervisor.restart import RestartPolicy
from oomguard.supervisor.supervise import RunConfig, Supervisor
events, opts, command = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
fast, alarm = opts["fast_interval"], opts["kernel_alarm"]
every = {"interval": opts["interval"]} if "interval" in opts else {}
guard = GuardSettings((None, opts["margin_pct"]), fast_interval=fast, kernel_alarm=alarm, **every)
config = RunConfig(command, policy=RestartPolicy("never"), guard=guard, stop_timeout=5.0)
sys.exit(Supervisor(config, EventLog(events)).run())
"""
FAST = """
import signal, sys, time
marker, step, pause = sys.argv[1], int(sys.argv[2]) << 20, float(sys.argv[3])
def term(*a):
    open(marker, 'a').write('TERM\\n'); sys.exit(0)
signal.signal(signal.SIGTERM, term)
chunks = []
while True:
    chunks.append(b'x' * step)
    time.sleep(pause)
"""


def run_live(
    g: Group, tmp_path: Path, step_mib: int, pause: float, worker: list[str] | None = None, **opts: Any
) -> tuple[int, Any]:
    ev = tmp_path / "ev.jsonl"
    ev.unlink(missing_ok=True)
    worker = worker or [PY, "-S", "-c", FAST, str(tmp_path / "marker"), str(step_mib), str(pause)]
    proc = g.run(PY, "-c", LIVE, str(ev), json.dumps(opts), *worker, env=ENV)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, [json.loads(line) for line in ev.read_text().splitlines()]


@needs_cgroup
def test_the_kernel_s_wake_up_stops_a_fast_grower_within_a_2_percent_margin(group: Group, tmp_path: Path) -> None:
    # 100 MiB/s against a 10 MiB margin: 100 ms from the stop line to the limit, and 200 MiB between
    # two samples 2 s apart (fast sampling as slow), so sampling alone lands in those 100 ms 1 time in 20;
    # the kernel's wake-up stops it (measured: OOM-killed in 5 of 5 runs with the wake-up off, stopped
    # in 5 of 5 with it, and in 6 of 6 niced beside three spinning processes on 2 CPUs). It was
    # 800 MiB/s (12 ms to act) with samples 100 ms apart:
    # stopped 0-3 MiB past the line in 5 of 5 quiet runs, OOM-killed in 5 of 5 without the wake-up,
    # but missed under stress (stop 26's note: 3 of 7 stressed rounds had a fast grower's test fail,
    # this one among them), and how fast the guard acts is bench/guard_latency.py's to measure.
    if VERSION != 1:
        pytest.skip("usage thresholds are cgroup v1's; v2's memory.events runs in the VM")
    rc, ev = run_live(group, tmp_path, 4, 0.04, margin_pct=2.0, interval=2.0, fast_interval=2.0, kernel_alarm=True)
    end = ev[-1]
    assert rc == 0 and (end["reason"], end["oom_kills"]) == ("pressure-stop", 0), end
    assert group.oom_kills() == 0 and (tmp_path / "marker").read_text() == "TERM\n"
    assert 501 * MiB < end["working_set_peak_bytes"] < 512 * MiB  # past the stop line (512 - 10.24 MiB)
    assert re.search(r"woken by the kernel [1-9]\d* time", end["message"]), end["message"]


@needs_cgroup
def test_fast_sampling_near_the_ceiling_stops_a_grower_the_normal_rate_misses(group: Group, tmp_path: Path) -> None:
    # 800 MiB/s: 80 MiB per 100 ms passes a 25.6 MiB margin (5% of 512 MiB; measured: OOM-killed in 4 of 6
    # runs), 16 MiB per 20 ms does not (stopped 2-11 MiB past the stop line in 6 of 6). No kernel wake-up
    # here, as on cgroup v2 without --isolate.
    rc, ev = run_live(group, tmp_path, 4, 0.005, margin_pct=5.0, fast_interval=0.02, kernel_alarm=False)
    end = ev[-1]
    assert rc == 0 and (end["reason"], end["oom_kills"]) == ("pressure-stop", 0), end
    assert group.oom_kills() == 0 and (tmp_path / "marker").read_text() == "TERM\n"


# Writes argv[3] MiB to the file argv[2] (fsync) and reads it back: page cache charged to its group;
# writes the group's inactive file cache (memory.stat argv[4]) to argv[1] as "CACHE n", waits 1.2 s
# (the guard moves its threshold at most once a second: now it counts the cache), then grows by
# 4 MiB every 20 ms (200 MiB/s) until SIGTERM (written to argv[1], then exit 0).
CACHED = """
import os, signal, sys, time
marker, data, mib, stat = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def term(*a):
    open(marker, 'a').write('TERM\\n'); sys.exit(0)
signal.signal(signal.SIGTERM, term)
with open(data, 'wb') as f:
    for _ in range(mib):
        f.write(b'y' * (1 << 20))
    f.flush(); os.fsync(f.fileno())
with open(data, 'rb') as f:
    while f.read(1 << 20):
        pass
cache = dict(line.split() for line in open(stat))['total_inactive_file']
open(marker, 'a').write('CACHE %s\\n' % cache)
time.sleep(1.2)
chunks = []
while True:
    chunks.append(b'x' * (4 << 20))
    time.sleep(0.04)
"""


@needs_cgroup
@pytest.mark.slow
def test_the_kernel_s_wake_up_stops_a_fast_grower_whose_group_is_full_of_page_cache(
    group: Group, tmp_path: Path
) -> None:
    # 100 MiB of page cache first, then 100 MiB/s against a 10 MiB margin (100 ms to act), sampling
    # every 100 ms. At the limit the usage stays there while the worker's memory
    # replaces the cache: no usage threshold sees that (and one at the stop line + the cache, 602 MiB,
    # was above the 512 MiB limit: never crossed). The kernel's reclaim events wake the guard then (the
    # message counts the wake-ups). At 800 MiB/s (12 ms to act), measured on a quiet machine, 8 runs
    # each: OOM-killed in 7 with the threshold at the stop line + the cache, 7 with it kept half a margin
    # above the stop line but no reclaim events, 4 with no wake-up at all; stopped in 8 of 8 with both
    # (0.7-8.4 MiB past the line). But under make test's load (host tests niced beside the VM on 2
    # cores) the niced guard missed those 12 ms twice (OOM-killed, rc 137), so the rate became 200 MiB/s
    # (50 ms, issue 24's goal); a clean-clone CI run missed those once too, so it is 100 MiB/s. The
    # guard's own speed is measured by bench/guard.py, not here.
    if VERSION != 1:
        pytest.skip("usage thresholds and memory.pressure_level are cgroup v1's; v2's memory.events runs in the VM")
    marker, data = (
        tmp_path / "marker",
        tmp_path / "data",
    )  # a disk-backed file system, not tmpfs (shmem is no file cache)
    worker = [PY, "-S", "-c", CACHED, str(marker), str(data), "100", str(group.dir / "memory.stat")]
    rc, ev = run_live(group, tmp_path, 0, 0, worker, margin_pct=2.0, fast_interval=0.1, kernel_alarm=True)
    said = marker.read_text().splitlines()
    assert int(said[0].split()[1]) >= 64 * MiB, said  # more page cache than the margin: the case at hand
    end = ev[-1]
    assert rc == 0 and (end["reason"], end["oom_kills"]) == ("pressure-stop", 0), end
    assert group.oom_kills() == 0 and said[1:] == ["TERM"]
    assert 501 * MiB < end["working_set_peak_bytes"] < 512 * MiB  # past the stop line (512 - 10.24 MiB)
    assert re.search(r"woken by the kernel [1-9]\d* time\(s\)$", end["message"]), end["message"]


def graceful_run(g: Group, tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    ev, grew = tmp_path / "ev.jsonl", tmp_path / "grew"
    ev.unlink(missing_ok=True)
    grew.unlink(missing_ok=True)
    run = ("run", "--events", str(ev), "--restart", "never", "--guard", "--stop-timeout", "10s", *args)
    proc = g.run(PY, "-m", "oomguard", *run, "--", PY, "-c", GRACEFUL, str(grew), env=ENV)
    assert "Traceback" not in proc.stderr, proc.stderr
    end = [json.loads(line) for line in ev.read_text().splitlines()][-1]
    return proc.returncode, end, grew.read_text() if grew.exists() else ""


@needs_cgroup
@pytest.mark.slow
def test_a_worker_that_grows_30_percent_after_sigterm_finishes_with_grace_bytes(group: Group, tmp_path: Path) -> None:
    """Issue 24, item 1: the stop leaves room for the worker's graceful shutdown. In a 512 MiB
    group, stopped at 448 MiB (the default 64 MiB margin), a shutdown that adds 30 % meets the
    limit: the kernel kills the worker. With --grace-bytes 160MiB the stop comes at 288 MiB, and
    the same worker finishes its shutdown, 20 runs of 20; each exit event says how much it grew
    after SIGTERM and that it ended before --stop-timeout."""
    rc, end, grew = graceful_run(group, tmp_path)
    assert (end["reason"], end["stop_working_set_bytes"] is not None) == ("oom-kill", True), end
    assert rc == 137 and grew == "" and end["stop_finished"] is False, end  # killed in its shutdown
    kills = group.oom_kills()
    for _ in range(20):
        rc, end, grew = graceful_run(group, tmp_path, "--grace-bytes", "160MiB")
        assert rc == 0 and (end["reason"], end["oom_kills"], end["stop_finished"]) == ("pressure-stop", 0, True), end
        # at the lowered line, 288 MiB, and below the default one, 448 MiB: make test once saw a late
        # stop at 333 MiB with both CPUs busy (the guard's speed is bench/guard_latency.py's to measure)
        assert end["grace_bytes"] == 160 * MiB and 288 * MiB <= end["stop_working_set_bytes"] < 448 * MiB, end
        # the growth the guard saw after its stop (sampled every 20 ms), against what the worker says it
        # added: seen, and never more. How much of it a sample catches depends on the machine's load (a
        # CI run with both CPUs busy saw 52 of 88 MiB): bench/guard_latency.py measures that, not this test.
        assert 0 < end["grown_after_stop_bytes"] <= (int(grew) + 32) * MiB, (grew, end)
    assert group.oom_kills() == kills  # not one more in the 20 runs


@needs_cgroup
@pytest.mark.slow
def test_the_guard_learns_the_grace_from_a_stop_the_kernel_ended(group: Group, tmp_path: Path) -> None:
    """Issue 24, item 1, without --grace-bytes: the same 30 % worker, restarted by one supervisor.
    Its first stop, at the default line, ends in the kernel's OOM kill; the growth seen until then
    is a lower bound, so the next start keeps at least double it as grace (grace.py). From then on
    every stop finishes, 20 of 20, each exit event saying the grace was learned."""
    ev, grew = tmp_path / "ev.jsonl", tmp_path / "grew"
    run = ("run", "--events", str(ev), "--guard", "--budget", "256MiB", "--stop-timeout", "10s",
           "--max-restarts", "20", "--backoff-initial", "10ms", "--backoff-max", "10ms")  # fmt: skip
    proc = group.run(PY, "-m", "oomguard", *run, "--", PY, "-c", GRACEFUL, str(grew), env=ENV)
    assert "Traceback" not in proc.stderr, proc.stderr
    exits = [e for e in map(json.loads, ev.read_text().splitlines()) if e["event"] == "exit"]
    first, rest = exits[0], exits[1:]
    assert (first["reason"], first["stop_finished"], first["grace_source"]) == ("oom-kill", False, None), first
    lesson = first["grown_after_stop_bytes"]
    assert lesson is not None and lesson > 0, first
    assert len(rest) == 20, proc.stderr
    for end in rest:
        assert (end["reason"], end["oom_kills"], end["stop_finished"]) == ("pressure-stop", 0, True), end
        assert end["grace_source"] == "learned" and end["grace_bytes"] >= max(2 * lesson, lesson + 64 * MiB), end
        assert end["stop_working_set_bytes"] <= 448 * MiB - end["grace_bytes"] + 32 * MiB, end
    assert "grace learned from earlier stops)" in proc.stderr


@needs_cgroup
@pytest.mark.slow
def test_with_the_documented_defaults_the_stops_finish_after_one_lesson(group: Group, tmp_path: Path) -> None:
    """Issue 38, item 7: the same 30 % worker with the defaults: an auto budget (256 MiB of the
    512 MiB group), --on-oom margin, no --grace-bytes. Before, the first stop's OOM kill grew the
    margin by 256 MiB: a budget of 0, exit 3, and the learned grace never used. Now that kill teaches
    the grace alone, every later stop finishes, and the 11 pressure stops after it, whose 5 % steps
    (25.6 MiB each) add up to more than the budget, leave it above 0: run ends with its worker's 0."""
    ev, grew = tmp_path / "ev.jsonl", tmp_path / "grew"
    run = ("run", "--events", str(ev), "--guard", "--max-restarts", "12", "--backoff-initial", "10ms",
           "--backoff-max", "10ms")  # fmt: skip
    proc = group.run(PY, "-m", "oomguard", *run, "--", PY, "-c", GRACEFUL, str(grew), env=ENV)
    assert "Traceback" not in proc.stderr, proc.stderr
    events = [json.loads(line) for line in ev.read_text().splitlines()]
    exits = [e for e in events if e["event"] == "exit"]
    budgets = [e["budget_bytes"] for e in events if e["event"] == "start"]
    restarts = [e["message"] for e in events if e["event"] == "restart"]
    first, rest = exits[0], exits[1:]
    assert (first["reason"], first["stop_finished"], first["grace_source"]) == ("oom-kill", False, None), first
    assert restarts[0].startswith("after an OOM kill in the worker's graceful stop"), restarts[0]
    assert restarts[0].endswith("; the budget and the plan are kept"), restarts[0]
    assert budgets[:2] == [256 * MiB, 256 * MiB], budgets  # the lesson was the grace, not the margin
    assert len(rest) == 12, proc.stderr
    for end in rest:
        assert (end["reason"], end["oom_kills"], end["stop_finished"]) == ("pressure-stop", 0, True), end
        assert end["grace_source"] == "learned", end
    assert budgets == sorted(budgets, reverse=True) and budgets[-1] > 0, budgets  # lowered, never to 0
    assert any(m.endswith("would leave no budget that works") for m in restarts), restarts  # the cap was met
    assert proc.returncode == 0 and events[-1]["event"] == "give-up", proc.stderr  # --max-restarts, not exit 3
    assert events[-1]["message"] == "12 restarts within 600s", events[-1]


@needs_cgroup
def test_a_grace_that_leaves_no_stop_line_turns_the_guard_off_and_bad_text_is_a_usage_error(
    group: Group, tmp_path: Path
) -> None:
    proc = group.run(PY, "-m", "oomguard", "run", "--restart", "never", "--guard", "--grace-bytes", "460MiB",
                     "--", "true", env=ENV)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        "oomguard run: guard: the guard margin 64 MiB and --grace-bytes 460 MiB leave no stop line under the "
        "ceiling 512 MiB; the guard is off"
    ) in proc.stderr
    bad = group.run(PY, "-m", "oomguard", "run", "--guard", "--grace-bytes", "lots", "--", "true", env=ENV)
    assert bad.returncode == 2 and "--grace-bytes" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    alone = group.run(PY, "-m", "oomguard", "run", "--grace-bytes", "1MiB", "--", "true", env=ENV)
    assert alone.returncode == 2 and "--guard" in alone.stderr, alone.stderr


# Ignores SIGTERM, grows by 8 MiB every 10 ms to 464 MiB (past a 512 MiB group's default stop line,
# under its limit) and waits there: only --stop-timeout's SIGKILL ends it.
DEAF = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
chunks = []
while len(chunks) < 58:
    c = bytearray(8 << 20); c[::4096] = b'x' * len(range(0, len(c), 4096)); chunks.append(c)
    time.sleep(0.01)
time.sleep(60)
"""


@needs_cgroup
@pytest.mark.slow
def test_a_stop_ended_by_the_stop_timeout_is_not_finished(group: Group, tmp_path: Path) -> None:
    """The guard stopped it and the worker ended, but by SIGKILL at --stop-timeout: the exit event
    says pressure-stop and ``stop_finished: false``, not a graceful end."""
    ev = tmp_path / "ev.jsonl"
    run = ("run", "--events", str(ev), "--restart", "never", "--guard", "--stop-timeout", "300ms")
    proc = group.run(PY, "-m", "oomguard", *run, "--", PY, "-c", DEAF, env=ENV)
    end = [json.loads(line) for line in ev.read_text().splitlines()][-1]
    assert (end["reason"], end["signal"], end["oom_kills"]) == ("pressure-stop", 9, 0), (end, proc.stderr)
    assert end["stop_finished"] is False and end["stop_working_set_bytes"] >= 448 * MiB, end
    assert group.oom_kills() == 0
