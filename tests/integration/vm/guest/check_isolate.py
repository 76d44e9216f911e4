"""``oomguard run --isolate`` on cgroup v2: the worker in its own memory cgroup.

The no-internal-process rule (cgroup-v2.rst, "No Internal Process Constraint"): a non-root
group with processes in it cannot enable controllers for its children. The root group is
exempt, so isolation from the root works as it is; from a group the supervisor sits in, the
supervisor first moves itself into the leaf ``<group>/oomguard-supervisor``, as systemd's
Delegate= documentation prescribes. Clean-up writes ``cgroup.kill`` (Linux >= 5.14; this is 6.1),
and a new supervisor removes the ``oomguard-run-<pid>`` groups of supervisors that died.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import LiveRoot
from oomguard.supervisor.isolate import SUPERVISOR_LEAF, Isolation
from tests.helpers.wait import wait_until
from tests.integration.vm.guest.cg import CGROOT, HOG, PYTHON, Group, MiB, oomguard_env, read_events

GroupFactory = Callable[..., Group]
# The worker prints its cgroup and that group's memory.max, then runs the rest of its code.
SHOW = (
    "import sys; p = open('/proc/self/cgroup').read().split('::')[1].strip(); "
    "print(p, open('/sys/fs/cgroup' + p + '/memory.max').read().strip(), flush=True); "
)


def _cmd(events: Path, worker: str, *args: str) -> list[str]:
    cmd = [PYTHON, "-m", "oomguard", "run", "--isolate", "--restart", "never", "--events", str(events), *args]
    return [*cmd, "--", PYTHON, "-c", worker]


def _run(events: Path, worker: str, *args: str, group: Group | None = None) -> subprocess.CompletedProcess[str]:
    cmd = _cmd(events, worker, *args)
    if group is None:  # the supervisor in the root group, where this test process runs
        proc = subprocess.run(cmd, env=oomguard_env(), capture_output=True, text=True, timeout=120)
    else:
        proc = group.run(*cmd)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _leftover_run_groups(under: Path) -> list[str]:
    return sorted(p.name for p in under.iterdir() if p.name.startswith("oomguard-run-"))


def _state(pid: int) -> str:
    """proc(5) state letter of *pid*, or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except FileNotFoundError:
        return "gone"


def _leaf(g: Group) -> Group:
    """The supervisor's leaf below *g*, removed with *g* by the fixture."""
    leaf = Group(g.path / SUPERVISOR_LEAF)
    g.children.append(leaf)
    return leaf


def test_isolate_from_the_root_group(events: Path) -> None:
    proc = _run(events, SHOW, "--budget", "300MiB")
    assert proc.returncode == 0, proc.stderr
    path, limit = proc.stdout.split()
    assert path.startswith("/oomguard-run-")
    assert int(limit) == (300 + 256) * MiB  # budget + the default 256 MiB margin
    assert _leftover_run_groups(CGROOT) == []  # removed after the run


def test_isolate_from_the_root_group_attributes_the_oom_kill(events: Path) -> None:
    proc = _run(events, SHOW + HOG.replace("int(sys.argv[1])", str(512 * MiB)), "--budget", "64MiB")
    assert proc.returncode == 137, proc.stderr
    path, limit = proc.stdout.split()[:2]
    assert path.startswith("/oomguard-run-")
    end = read_events(events)[-1]
    assert (end["reason"], end["signal"]) == ("oom-kill", 9)
    # peak_bytes is the isolated group's memory.peak: at most its limit, and close to it.
    assert int(limit) * 0.8 <= end["peak_bytes"] <= int(limit)
    assert _leftover_run_groups(CGROOT) == []


def test_isolate_cleanup_leaves_no_process_and_no_group(events: Path) -> None:
    """A grandchild in a session of its own (out of the worker's process group) dies with the run."""
    spawn = "import subprocess; p = subprocess.Popen(['setsid', 'sleep', '300']); print(p.pid, flush=True)"
    proc = _run(events, spawn, "--budget", "64MiB")
    assert proc.returncode == 0, proc.stderr
    grandchild = int(proc.stdout.split()[0])
    state = _state(grandchild)
    assert state in ("gone", "Z"), f"pid {grandchild} still runs ({state})"
    assert _leftover_run_groups(CGROOT) == []


def test_isolate_in_a_read_only_cgroup_mount_says_why_and_runs(group: GroupFactory, events: Path) -> None:
    """Docker's default: a private cgroup namespace with /sys/fs/cgroup mounted read-only."""
    g = group(384 * MiB)
    remount = "umount /sys/fs/cgroup && mount -t cgroup2 -o ro none /sys/fs/cgroup"
    inner = (
        f'{remount} && exec "{PYTHON}" -m oomguard run --isolate --restart never --events "{events}" '
        f'-- "{PYTHON}" -c "print(open(\'/proc/self/cgroup\').read().strip())"'
    )
    proc = g.run("unshare", "-C", "-m", "--propagation", "private", "sh", "-c", inner)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0::/"  # ran, unisolated, in the container's group
    assert "cannot isolate" in proc.stderr  # and said why
    assert read_events(events)[-1]["reason"] == "clean"


def _delegated_case(g: Group, events: Path, worker: str) -> tuple[subprocess.CompletedProcess[str], str, int]:
    proc = _run(events, worker, "--budget", "64MiB", group=g)
    assert "cannot isolate" not in proc.stderr, proc.stderr
    path, limit = proc.stdout.split()[:2]
    return proc, path, int(limit)


def test_isolate_delegates_below_the_group_the_supervisor_sits_in(group: GroupFactory, events: Path) -> None:
    g = group(384 * MiB)
    leaf = _leaf(g)
    proc, path, limit = _delegated_case(g, events, SHOW)
    assert proc.returncode == 0
    assert path.startswith(g.rel + "/"), path  # the worker in a group of its own below the supervisor's
    assert limit < 384 * MiB
    assert "memory" in g.read("cgroup.subtree_control").split()
    assert g.read("cgroup.procs") == "" and leaf.read("cgroup.procs") == ""  # the supervisor sat in the leaf
    assert limit == 128 * MiB  # 64 MiB + default_margin(64 MiB) = 64 MiB (the 256 MiB floor capped at the budget)
    assert _leftover_run_groups(g.path) == []


def test_isolate_below_the_supervisors_group_attributes_the_oom_kill(group: GroupFactory, events: Path) -> None:
    g = group(512 * MiB)
    _leaf(g)
    proc, path, limit = _delegated_case(g, events, SHOW + HOG.replace("int(sys.argv[1])", str(400 * MiB)))
    assert proc.returncode == 137
    assert path.startswith(g.rel + "/"), path
    end = read_events(events)[-1]
    assert end["reason"] == "oom-kill"
    assert int(limit) * 0.8 <= end["peak_bytes"] <= limit
    assert os.path.isdir(g.path)  # the supervisor's own group survives


def test_other_processes_in_the_group_are_not_moved(group: GroupFactory, events: Path) -> None:
    g = group(384 * MiB)
    neighbour = g.popen("sleep", "300")
    try:
        proc = _run(events, SHOW, "--budget", "64MiB", group=g)
        assert proc.returncode == 0, proc.stderr
        assert f"cannot isolate: 1 other process(es) share {g.path} (pid {neighbour.pid})" in proc.stderr
        assert proc.stdout.split()[0] == g.rel  # ran unisolated, in the group itself
        assert g.read("cgroup.subtree_control").split() == [] and not (g.path / SUPERVISOR_LEAF).exists()
    finally:
        neighbour.kill()
        neighbour.wait()


def test_a_new_supervisor_reaps_what_a_sigkilled_one_left(group: GroupFactory, events: Path) -> None:
    """Issue #12 item 5: the worker dies with its supervisor (PR_SET_PDEATHSIG), its setsid'd child stays
    in the worker's group; the next ``run --isolate`` there kills it and removes the group."""
    g = group(384 * MiB)
    leaf = _leaf(g)
    spawn = "import subprocess as s, time; print(s.Popen(['setsid', 'sleep', '300']).pid, flush=True); time.sleep(300)"
    first = g.popen(*_cmd(events, spawn, "--budget", "64MiB"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert first.stdout is not None
    orphan = int(first.stdout.readline())
    first.kill()
    first.wait()
    left = g.path / f"oomguard-run-{first.pid}"
    assert str(orphan) in left.joinpath("cgroup.procs").read_text().split()  # what a SIGKILL leaves behind
    # g now has memory enabled for its children and takes no process: the next supervisor starts in the leaf.
    second = leaf.run(*_cmd(events, "pass", "--budget", "64MiB"))
    assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr
    assert f"removed leftover {left} (supervisor {first.pid} is gone, 1 process(es) in it killed)" in second.stderr
    assert _leftover_run_groups(g.path) == []
    wait_until(lambda: _state(orphan) in ("gone", "Z"), what=f"pid {orphan} to end")


class _Recording(CgroupFS):
    """The live cgroup file system, with every write and every SIGKILL by PID noted."""

    def __init__(self) -> None:
        super().__init__("/")
        self.writes: list[tuple[str, str]] = []
        self.killed: list[int] = []

    def write_text(self, path: str, value: str) -> None:
        self.writes.append((path, value))
        super().write_text(path, value)

    def kill_pids(self, pids: Iterable[int]) -> int:
        pids = list(pids)
        self.killed += pids
        return super().kill_pids(pids)


def test_clean_up_uses_cgroup_kill(group: GroupFactory) -> None:
    g = group()
    gone = subprocess.Popen(["true"])
    gone.wait()
    run = g.child(f"oomguard-run-{gone.pid}")
    sub = Group(run.path / "sub")  # a group the worker made below its own: cgroup.kill reaches it too
    sub.path.mkdir()  # (no controller enabled for it: run may still hold processes itself)
    run.children.append(sub)
    a = run.popen("sh", "-c", "sleep 300 & exec sleep 301")
    b = sub.popen("sleep", "302")
    forked = lambda: len(run.read("cgroup.procs").split()) == 2  # noqa: E731
    wait_until(forked, what="the sh to fork its first sleep")
    fs = _Recording()
    report: Any = {"memory": {"cgroup": {"dir": str(g.path), "version": 2}}}  # all reaping reads of a report
    notes = Isolation.reap_leftovers(report, LiveRoot(), fs)
    assert notes == [f"removed leftover {run.path} (supervisor {gone.pid} is gone, 3 process(es) in it killed)"]
    # cgroup.kill, never PID by PID. Written again while killed processes still show in cgroup.procs
    # (drain reads every 10 ms): make test's slow TCG guest once saw two writes, which kill nothing new.
    assert fs.writes and set(fs.writes) == {(f"{run.path}/cgroup.kill", "1")} and fs.killed == [], fs.writes
    assert a.wait(5) == b.wait(5) == -signal.SIGKILL
    assert not run.path.exists()
