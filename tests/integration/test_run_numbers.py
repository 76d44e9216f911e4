"""``run``, ``verify`` and ``check`` numbers from the kernel (issue 19, item 5).

- the peak of a run: the worker's own group's peak (``--isolate``), else the worker tree's VmHWM,
  never ``ru_maxrss`` with the supervisor's pre-exec fork in it; the event says which;
- an OOM kill is said as the kernel's OOM killer at the limit; a budget over the limit as such;
- the kernel's OOM notification dates each kill: a neighbour's OOM kill long before a ``kill -9``
  of the worker is not the worker's, and the worker's own OOM kill long after a neighbour left is;
- a pressure stop or an OOM kill says what neighbours held, and does not step the worker down for it;
- ``--isolate`` says the limit the kernel holds; ``verify`` one touched figure and the group's peak;
  ``check`` a v1 soft limit as a reclaim target.

First the rules on numbers and over fake trees (a DirRoot, a fake clock), then real cgroup v1 groups
on this machine (tests/helpers/realcgroup.py). The same on a real v2 kernel:
tests/integration/vm/guest/check_run_numbers.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oomguard.commands.render import format_human
from oomguard.policy.budget import probe
from oomguard.probes.counters import parse_dying, read_limit
from oomguard.sources.root import DirRoot
from oomguard.supervisor.events import neighbour_note, neighbour_share, own_share, peak_story
from oomguard.supervisor.exits import Evidence, classify
from oomguard.supervisor.members import Outside
from oomguard.supervisor.oomwatch import GRACE, MARK_EVERY, POLL_EVERY, OomWatch
from oomguard.supervisor.peak import TreePeak, run_peak
from oomguard.units import format_size
from tests.conftest import REPO
from tests.helpers.realcgroup import Group, limited_group, writable_parent
from tests.helpers.supervise import cgroup_tree
from tests.helpers.wait import wait_until
from tests.helpers.workers import FIRST_RUN, HOLDER, OUTSIDER

pytestmark = pytest.mark.usefixtures("clean_env")

MiB, GiB = 1024**2, 1024**3
PY = sys.executable
ENV = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")} | {"PYTHONPATH": str(REPO / "src")}
STAT = "{pid} (w) {state} 1 {pid} {pid} 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 1 0 5187 0 0"


# -- the rules, on numbers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "flags", "sigpnd", "shdpnd", "dying"),
    [
        ("S", 4194560, "0000000000000000", "0000000000000000", False),  # running on
        ("Z", 4194560, "0000000000000000", "0000000000000000", True),  # a zombie
        ("R", 4194564, "0000000000000000", "0000000000000000", True),  # PF_EXITING (0x4)
        ("S", 4194560, "0000000000000100", "0000000000000000", True),  # SIGKILL pending (bit 9 - 1)
        ("S", 4194560, "0000000000000000", "0000000000000100", True),  # for the whole process
        ("S", 4194560, "0000000000004000", "0000000000000000", False),  # SIGTERM pending: not dying
    ],
)
def test_a_process_on_its_way_out(state: str, flags: int, sigpnd: str, shdpnd: str, dying: bool) -> None:
    status = f"Name:\tw\nSigPnd:\t{sigpnd}\nShdPnd:\t{shdpnd}\n"
    assert parse_dying(STAT.format(pid=7, state=state, flags=flags), status) is dying
    assert parse_dying("7 (w) S 1", status) is None  # too short to tell


def test_the_limit_is_read_back_as_the_kernel_holds_it(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1/memory.limit_in_bytes").write_text("4294545408\n")
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2/memory.max").write_text("max\n")
    root = DirRoot(str(tmp_path))
    assert read_limit(root, "/v1", 1) == 4294545408
    assert read_limit(root, "/v2", 2) is None and read_limit(root, "/none", 2) is None


@pytest.mark.parametrize(
    ("rc", "e", "verdict"),
    [
        # the worker ran on 12.3 s after the group's only kill: its SIGKILL was a kill -9
        (-9, Evidence(1, 0, 1, 0, 1, 12.3), ("signal", "group")),
        # one kill while the worker was being killed, inside its tree: the OOM killer's
        (-9, Evidence(1, 0, 1, 1, 0, None), ("oom-kill", "worker")),
        # two kills: one the worker outlived, one at its end
        (-9, Evidence(2, 0, 2, 1, 1, 3.0), ("oom-kill", "worker")),
        # a kill at its end, but as many outsiders left then: cannot tell
        (-9, Evidence(1, 1, 0, 0, 0, None), ("signal", "group")),
        # a wrapper whose child was killed long before it exited 3: a descendant's OOM kill still
        (3, Evidence(1, 0, 1, 0, 1, 8.0), ("oom-kill", "descendant")),
    ],
)
def test_when_the_kills_came_decides(rc: int, e: Evidence, verdict: tuple[str, str]) -> None:
    got = classify(rc, e)
    assert (got.reason, got.victim) == verdict
    if e.spared == e.kills and rc == -9:
        assert got.note == (
            "not killed by the kernel's OOM killer: the group's OOM kill (oom_kill +1, 12.3s before the worker "
            "ended) was not the worker's, which ran on after it; its SIGKILL came from elsewhere (a kill -9)"
        )


def test_the_exit_says_the_oom_killer_at_the_limit_and_a_budget_over_it() -> None:
    story = peak_story(int(3.98 * GiB), int(3.6 * GiB), 4 * GiB, "cgroup-v2", source="vmhwm", oom="worker", kills=1)
    assert story == (
        "peak 3.98 GiB (VmHWM), over its 3.6 GiB budget; "
        "killed by the kernel's OOM killer at the 4 GiB limit (cgroup-v2, oom_kill +1)"
    )
    assert "within" not in story
    story = peak_story(int(1.79 * GiB), 20 * GiB, 4 * GiB, "cgroup-v2", source="memory.peak")
    assert story == (
        "peak 1.79 GiB (memory.peak), its 20 GiB budget is over the 4 GiB limit, "
        "within the 4 GiB limit (cgroup-v2, 44%)"
    )
    assert "within its 20 GiB budget" not in story
    descendant = peak_story(None, GiB, 2 * GiB, "cgroup-v1", oom="descendant", kills=2, unknown="peak unknown: x")
    assert descendant == (
        "peak unknown: x; a descendant of the worker was killed by the kernel's OOM killer at the 2 GiB limit "
        "(cgroup-v1, oom_kill +2)"
    )


def test_a_lower_bound_over_the_budget_says_over_it_and_one_within_says_nothing() -> None:
    """The OOM reaper can empty the victim before it exits (supervisor/peak.py): its peak is unknown, but a
    last sample over the budget proves the peak was over it; a sample within it proves nothing."""
    why = "peak unknown: the OOM reaper emptied the worker"
    over = peak_story(None, 128 * MiB, 512 * MiB, "cgroup-v1", oom="worker", kills=1, unknown=why, at_least=469 * MiB)
    assert over == (
        f"{why}, over its 128 MiB budget (at least); "
        "killed by the kernel's OOM killer at the 512 MiB limit (cgroup-v1, oom_kill +1)"
    )
    within = peak_story(None, 128 * MiB, 512 * MiB, "cgroup-v1", oom="worker", kills=1, unknown=why, at_least=64 * MiB)
    assert within is not None and "budget" not in within and "within" not in within
    known = peak_story(500 * MiB, 128 * MiB, 512 * MiB, "cgroup-v1", source="vmhwm", at_least=64 * MiB)
    assert known is not None and "over its 128 MiB budget, within the 512 MiB limit" in known


def test_a_neighbours_share_is_said_and_excuses_the_worker() -> None:
    neighbour = Outside(400 * MiB, (4242,))
    ws = 3920 * MiB  # the stop line of a 4 GiB ceiling with a 2% margin
    assert neighbour_share(neighbour, ws) is neighbour
    assert neighbour_share(Outside(100 * MiB, (1,)), ws) is None  # 2.5%: not a meaningful share
    assert neighbour_note(neighbour, ws, "working set") == (
        "400 MiB (10%) of the 3.83 GiB working set was outside the worker's tree (anonymous memory of pid 4242)"
    )
    assert own_share(neighbour, ws, int(3.6 * GiB)) == (
        "the worker's own 3.44 GiB is within its 3.6 GiB budget: nothing lowered"
    )
    assert own_share(neighbour, ws, 3 * GiB) is None  # its own share is over its budget: it steps down


def test_the_tree_peak_leaves_out_the_fork(tmp_path: Path) -> None:
    root = DirRoot(str(tmp_path))
    (tmp_path / "proc/77").mkdir(parents=True)
    (tmp_path / "proc/77/status").write_text("Name:\tw\nVmHWM:\t    1484 kB\n")
    t = [0.0]
    peak = TreePeak(root, 77, 20 * MiB, clock=lambda: t[0])
    assert peak.interval() == pytest.approx(0.01)  # not at once: the loader has not run yet
    none, why = peak.result(11 * MiB)  # nothing sampled yet, ru_maxrss under the fork's floor
    assert none is None and "at most 11 MiB, its ru_maxrss, which counts the supervisor's fork" in str(why)
    t[0] = 0.01
    peak.tick()
    assert peak.result(11 * MiB) == (1484 * 1024, None)  # ru_maxrss under the fork's floor: the sample
    assert peak.result(300 * MiB) == (300 * MiB, None)  # above it: a peak after the exec
    # the OOM killer chose the worker (the largest), yet its ru_maxrss is under the supervisor's: the OOM
    # reaper emptied it before it exited (seen in the VM: 7.9 MiB for a worker killed at 64 MiB)
    stale, why = peak.result(7 * MiB, oom_victim=True)
    assert stale is None
    assert why == (
        "peak unknown: the OOM reaper emptied the worker before it exited, so its high-water mark (7 MiB) "
        "is stale (at least 1.45 MiB, its last sample)"
    )
    assert peak.result(300 * MiB, oom_victim=True) == (300 * MiB, None)  # a fresh one is the peak
    assert run_peak(1484 * 1024, 900 * 1024, 2) == (900 * 1024, "memory.peak")  # the worker's own group wins
    assert run_peak(1484 * 1024, None, None) == (1484 * 1024, "vmhwm")


# -- the OOM watch over a fake tree (the clock and the kernel played by the test) -------------------


def _tree(tmp: Path, worker: int, outsider: int | None = None) -> tuple[DirRoot, Path]:
    tree = cgroup_tree(tmp / "tree", 2, GiB)
    pids = f"{os.getpid()}\n{worker}\n" + (f"{outsider}\n" if outsider else "")
    (tree / "sys/fs/cgroup/cgroup.procs").write_text(pids)
    for pid, ppid in ((os.getpid(), 1), (worker, os.getpid()), (outsider, 1)):
        if pid is not None:
            _stat(tree, pid, ppid)
    return DirRoot(str(tree)), tree


def _stat(tree: Path, pid: int, ppid: int, state: str = "S", pending: str = "0000000000000000") -> None:
    (tree / f"proc/{pid}").mkdir(parents=True, exist_ok=True)
    stat = f"{pid} (p) {state} {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 100 0 0"
    (tree / f"proc/{pid}/stat").write_text(stat)
    (tree / f"proc/{pid}/status").write_text(f"Name:\tp\nSigPnd:\t{pending}\nShdPnd:\t0000000000000000\n")


def _kill(tree: Path, n: int) -> None:
    (tree / "sys/fs/cgroup/memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {n}\n")


def test_a_neighbours_oom_kill_the_worker_outlived_is_not_its_own(tmp_path: Path) -> None:
    root, tree = _tree(tmp_path, worker=4000)
    t = [100.0]
    watch = OomWatch(root, None, "/sys/fs/cgroup/memory.events", 2, clock=lambda: t[0])
    assert watch.how == "polled"  # no CgroupFS: the counter is read on every tick
    watch.started(4000)
    _kill(tree, 1)  # a neighbour that joined after the start is OOM-killed; the worker runs on
    t[0] += POLL_EVERY
    watch.tick()
    assert [(r.kills, r.worker_hit) for r in watch.rises] == [(1, False)]
    e = watch.finish(ended_at=t[0] + 30)  # the worker is kill -9'd half a minute later
    assert (e.kills, e.spared, e.at_end) == (1, 1, 0) and e.outlived_s == pytest.approx(30)
    assert (classify(-9, e).reason, classify(-9, e).victim) == ("signal", "group")


def test_the_workers_own_oom_kill_after_a_neighbour_left(tmp_path: Path) -> None:
    root, tree = _tree(tmp_path, worker=4000, outsider=5000)
    t = [100.0]
    watch = OomWatch(root, None, "/sys/fs/cgroup/memory.events", 2, clock=lambda: t[0])
    watch.started(4000)
    (tree / "sys/fs/cgroup/cgroup.procs").write_text(f"{os.getpid()}\n4000\n")  # the neighbour is kill -9'd
    t[0] += MARK_EVERY
    watch.tick()  # a snapshot without it
    _kill(tree, 1)
    _stat(tree, 4000, os.getpid(), pending="0000000000000100")  # the OOM killer's SIGKILL, pending
    t[0] += POLL_EVERY
    watch.tick()
    assert [(r.kills, r.worker_hit, r.others_gone) for r in watch.rises] == [(1, True, 0)]
    e = watch.finish(ended_at=t[0] + 0.01)
    assert (e.kills, e.inside, e.at_end, e.spared) == (1, 1, 1, 0)
    assert (classify(-9, e).reason, classify(-9, e).victim) == ("oom-kill", "worker")
    # Read only before and after, the same run cannot be told: one kill, one outsider gone.
    assert classify(-9, Evidence(1, 1)).reason == "signal"


def test_a_kill_seen_only_at_the_end_counts_there_and_an_unreadable_worker_falls_back_on_time(
    tmp_path: Path,
) -> None:
    root, tree = _tree(tmp_path, worker=4000)
    t = [100.0]
    watch = OomWatch(root, None, "/sys/fs/cgroup/memory.events", 2, clock=lambda: t[0])
    watch.started(4000)
    _kill(tree, 1)
    e = watch.finish(ended_at=t[0])  # the worker died before any tick saw the rise
    assert (e.at_end, e.spared) == (1, 0) and classify(-9, e).reason == "oom-kill"
    root, tree = _tree(tmp_path / "b", worker=4001)
    (tree / "proc/4001/stat").write_text("garbage")  # its state cannot be told
    watch = OomWatch(root, None, "/sys/fs/cgroup/memory.events", 2, clock=lambda: t[0])
    watch.started(4001)
    _kill(tree, 1)
    t[0] += POLL_EVERY
    watch.tick()
    assert watch.rises[0].worker_hit is None
    assert watch.finish(ended_at=t[0] + GRACE + 1).spared == 1  # long before the end: not the worker's


# -- real cgroup v1 groups on this machine -----------------------------------------------------------

VERSION, PARENT = writable_parent()
needs_v1 = pytest.mark.skipif(VERSION != 1, reason=f"real cgroup v1 unavailable: {PARENT} (v2: the VM)")


@pytest.fixture
def group() -> Iterator[Group]:
    with limited_group(512 * MiB, no_swap=True) as g:
        yield g


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def in_group(g: Group, *cmd: str) -> list[str]:
    return ["/bin/sh", "-c", f'echo $$ > "{g.dir}/cgroup.procs" && exec "$@"', "sh", *cmd]


def run_in(g: Group, tmp: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    ev = tmp / "ev.jsonl"
    proc = g.run(PY, "-m", "oomguard", "run", "--events", str(ev), *args, env=ENV)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, events(ev), proc.stderr


def start_run(g: Group, tmp: Path, *args: str) -> subprocess.Popen[str]:
    cmd = in_group(g, PY, "-m", "oomguard", "run", "--events", str(tmp / "ev.jsonl"), *args)
    return subprocess.Popen(cmd, env=ENV, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path) -> str:
    return wait_until(lambda: path.read_text().strip() if path.exists() else "", what=f"{path} to be written")


def vmhwm_of(cmd: list[str]) -> int:
    """The VmHWM of *cmd* started directly, read once it sleeps (loaded: the measurement to compare with)."""
    p = subprocess.Popen(cmd)
    try:
        status = Path(f"/proc/{p.pid}/status")
        wait_until(lambda: "State:\tS" in status.read_text(), interval=0.005, what=f"{cmd} to sleep")
        line = next(x for x in status.read_text().splitlines() if x.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024
    finally:
        p.wait()


@needs_v1
@pytest.mark.slow
def test_the_peak_of_a_small_worker_is_its_own_vmhwm(group: Group, tmp_path: Path) -> None:
    """Before: ``run -- sleep 1`` said peak 11.2 MiB, the supervisor's pre-exec fork (ru_maxrss)."""
    own = vmhwm_of(["sleep", "1"])
    rc, ev, err = run_in(group, tmp_path, "--restart", "never", "--", "sleep", "1")
    end = ev[1]
    assert rc == 0 and end["peak_source"] == "vmhwm", err
    assert 0.75 * own <= end["peak_bytes"] <= 1.25 * own, (end["peak_bytes"], own)  # 1.79 MiB against 1.62 MiB
    assert end["peak_bytes"] < 4 * MiB and end["message"].startswith(f"peak {format_size(end['peak_bytes'])} (VmHWM)")
    rc, ev, _ = run_in(group, tmp_path, "--restart", "never", "--", "/bin/true")  # gone within 10 ms
    assert ev[-1]["peak_bytes"] is None or ev[-1]["peak_bytes"] < 4 * MiB
    if ev[-1]["peak_bytes"] is None:
        assert ev[-1]["message"].startswith("peak unknown: the worker ended before its VmHWM was sampled (at most ")


@needs_v1
def test_isolated_the_limit_is_the_kernels_and_the_peak_the_groups(group: Group, tmp_path: Path) -> None:
    """Before: "with a limit of 3300000001 bytes" where the kernel held 3299999744."""
    group.write("memory.memsw.limit_in_bytes", str(4 * GiB))  # memory+swap first: never below the limit
    group.set_limit(4 * GiB)
    seen = tmp_path / "seen"
    code = (
        "import sys\n"
        "cg = [l.split(':', 2)[2] for l in open('/proc/self/cgroup').read().split('\\n') if ':memory:' in l][0]\n"
        "m = '/sys/fs/cgroup/memory' + cg\n"
        "b = bytearray(100 << 20); b[::4096] = b'x' * (len(b) // 4096)\n"
        "open(sys.argv[1], 'w').write(open(m + '/memory.limit_in_bytes').read().strip() + ' ' +"
        " open(m + '/memory.max_usage_in_bytes').read().strip())\n"
    )
    rc, ev, err = run_in(group, tmp_path, "--isolate", "--budget", "3000000001", "--restart", "never", "--",
                         PY, "-c", code, str(seen))  # fmt: skip
    held, usage = map(int, seen.read_text().split())
    assert rc == 0 and held == 3300000001 // 4096 * 4096  # budget + 300000000 (10%), in whole pages
    assert f"with a limit of {held} bytes (3300000001 written; the kernel keeps whole pages)" in err
    end = ev[1]
    assert end["peak_source"] == "memory.max_usage_in_bytes" and usage <= end["peak_bytes"] < usage + 16 * MiB
    assert "within the 3.07 GiB limit (isolated, " in end["message"]


@needs_v1
def test_an_oom_kill_is_the_kernels_at_the_limit(group: Group, tmp_path: Path) -> None:
    """Before: "within the 512 MiB limit (cgroup-v1, 99%)" for a worker the kernel killed at it."""
    hog = "b = []\nwhile True: c = bytearray(16 << 20); c[::4096] = b'x' * (len(c) // 4096); b.append(c)\n"
    rc, ev, _ = run_in(group, tmp_path, "--restart", "never", "--budget", "128MiB", "--", PY, "-c", hog)
    end = ev[1]
    assert rc == 137 and (end["reason"], end["oom_victim"]) == ("oom-kill", "worker")
    assert end["message"].endswith("; killed by the kernel's OOM killer at the 512 MiB limit (cgroup-v1, oom_kill +1)")
    assert "within the 512 MiB limit" not in end["message"] and "over its 128 MiB budget" in end["message"]
    if end["peak_bytes"] is None:  # the OOM reaper emptied it first (a loaded host): the last sample bounds it
        assert end["peak_source"] is None and "peak unknown: the OOM reaper emptied the worker" in end["message"]
        assert "over its 128 MiB budget (at least)" in end["message"]
    else:
        assert end["peak_source"] == "vmhwm" and 384 * MiB < end["peak_bytes"] < 512 * MiB  # its own, near the limit


@needs_v1
def test_a_budget_over_the_limit_is_named_so(group: Group, tmp_path: Path) -> None:
    """Before: "within its 20 GiB budget (0%)" in a 512 MiB group."""
    rc, ev, err = run_in(group, tmp_path, "--restart", "never", "--budget", "20GiB", "--allow-over-limit", "--",
                         "sleep", "0.2")  # fmt: skip
    assert rc == 0, err
    assert "its 20 GiB budget is over the 512 MiB limit" in ev[1]["message"]
    assert "within its 20 GiB budget" not in ev[1]["message"]


SHAPE = ("--per-job", "64MiB", "--max-jobs", "3")  # 3 jobs of a 256 or 300 MiB budget
ONE_RESTART = ("--max-restarts", "1", "--backoff-initial", "10ms")
PLAN = (*SHAPE, "--budget", "256MiB", *ONE_RESTART)


@needs_v1
@pytest.mark.slow
@pytest.mark.timing
def test_a_neighbours_oom_kill_then_a_kill_9_is_not_the_workers(group: Group, tmp_path: Path) -> None:
    """The order of issue 19: a process that joined the group after the start is OOM-killed; 3 s later the
    worker is killed -9 from outside. Before: an oom-kill of the worker, and concurrency 3 -> 2."""
    pidfile, go, ready = tmp_path / "pid", tmp_path / "go", tmp_path / "ready"
    go.write_text("now")
    sup = start_run(group, tmp_path, *PLAN, "--", PY, "-c", FIRST_RUN, str(pidfile), str(go), "sleep")
    worker = int(wait_for(pidfile))
    (tmp_path / "go2").write_text("now")
    began = time.monotonic()
    neighbour = subprocess.run(in_group(group, PY, "-c", OUTSIDER, str(ready), str(tmp_path / "go2")))
    assert neighbour.returncode == -signal.SIGKILL  # the OOM killer's victim
    killed = time.monotonic()  # the OOM kill came between began and now
    time.sleep(3)  # the scenario: the worker runs on for 3 s after the kill
    gap = time.monotonic() - killed  # at least this between the OOM kill and the kill -9
    os.kill(worker, signal.SIGKILL)  # an operator's kill -9
    _, err = sup.communicate(timeout=60)
    enclosing = time.monotonic() - began  # at most this
    ev = events(tmp_path / "ev.jsonl")
    exits = [e for e in ev if e["event"] == "exit"]
    assert (exits[0]["reason"], exits[0]["signal"], exits[0]["oom_kills"], exits[0]["oom_victim"]) == (
        "signal", 9, 1, "group",
    ), err  # fmt: skip
    assert "was not the worker's, which ran on after it" in exits[0]["message"]
    seconds = float(exits[0]["message"].split("oom_kill +1, ")[1].split("s before")[0])
    # The kernel's notification dated the kill, not the worker's end: nearer the gap the test made (the
    # reference, measured here) than 0, and within the span that holds both; rounding aside.
    assert gap / 2 < seconds <= enclosing + 0.1, f"{seconds}s before; the test saw {gap:.2f}-{enclosing:.2f}s"
    assert [e["concurrency"] for e in ev if e["event"] == "start"] == [3, 3]  # no step-down


@needs_v1
@pytest.mark.slow
def test_a_neighbours_kill_9_then_the_workers_oom_kill_is_the_workers(group: Group, tmp_path: Path) -> None:
    """The other order: a neighbour of the group is killed -9 from outside; 3 s later the worker is
    OOM-killed. Before: "cannot tell" (one kill, one outsider gone), no step-down of a real OOM kill."""
    pidfile, go, held = tmp_path / "pid", tmp_path / "go", tmp_path / "held"
    neighbour = subprocess.Popen(in_group(group, PY, "-c", HOLDER, "16", str(held)))
    try:
        wait_for(held)
        sup = start_run(group, tmp_path, *PLAN, "--", PY, "-c", FIRST_RUN, str(pidfile), str(go), "hog")
        wait_for(pidfile)
        started = lambda: any(e["event"] == "start" for e in events(tmp_path / "ev.jsonl"))  # noqa: E731
        wait_until(started, what="the supervisor's start event (past watching the group)")
        neighbour.kill()  # kill -9, no OOM kill
        neighbour.wait()
        time.sleep(3)  # the scenario: 3 s later (past MARK_EVERY: the supervisor saw the neighbour gone)
        go.write_text("now")  # the worker now allocates until the kernel kills it
        _, err = sup.communicate(timeout=60)
    finally:
        neighbour.kill()
        neighbour.wait()
    ev = events(tmp_path / "ev.jsonl")
    exits = [e for e in ev if e["event"] == "exit"]
    assert (exits[0]["reason"], exits[0]["oom_victim"], exits[0]["oom_kills"]) == ("oom-kill", "worker", 1), err
    assert "killed by the kernel's OOM killer at the 512 MiB limit (cgroup-v1, oom_kill +1)" in exits[0]["message"]
    assert [e["concurrency"] for e in ev if e["event"] == "start"] == [3, 2]  # stepped down


@needs_v1
@pytest.mark.slow
def test_a_pressure_stop_for_a_neighbours_memory_does_not_step_the_worker_down(group: Group, tmp_path: Path) -> None:
    """A neighbour holds 200 MiB of the 512 MiB group; the worker grows to the stop line (448 MiB) with
    250 MiB of its own, within its 300 MiB budget. Before: "within its 300 MiB budget", and stepped down."""
    pidfile, go, held = tmp_path / "pid", tmp_path / "go", tmp_path / "held"
    go.write_text("now")
    neighbour = subprocess.Popen(in_group(group, PY, "-c", HOLDER, "200", str(held)))
    try:
        wait_for(held)
        worker = (PY, "-c", FIRST_RUN, str(pidfile), str(go), "grow")
        _, ev, err = run_in(group, tmp_path, "--guard", *SHAPE, "--budget", "300MiB", *ONE_RESTART, "--", *worker)
    finally:
        neighbour.kill()
        neighbour.wait()
    exits = [e for e in ev if e["event"] == "exit"]
    stop = exits[0]
    assert stop["reason"] == "pressure-stop", err
    assert 195 * MiB <= stop["outside_bytes"] <= 215 * MiB  # the neighbour's RssAnon
    assert "MiB working set was outside the worker's tree (anonymous memory of pid " in stop["message"]
    assert "budget: nothing lowered" in stop["message"]
    restart = next(e for e in ev if e["event"] == "restart")
    assert restart["message"].startswith("after a pressure stop: the worker's own ")
    assert [e["concurrency"] for e in ev if e["event"] == "start"] == [3, 3]


@needs_v1
def test_an_oom_kill_at_a_neighbours_memory_does_not_step_the_worker_down(group: Group, tmp_path: Path) -> None:
    """The neighbour holds 300 MiB; the worker (first in line: oom_score_adj 1000) is OOM-killed with
    about 200 MiB of its own, within its 300 MiB budget.

    On a loaded host the kernel can kill the neighbour too: CI's dmesg showed it 12 ms after the
    worker, the second OOM invoked by a process of oom_score_adj 0 (the supervisor) with the worker
    gone from the task list. The likely window, read in mm/mmap.c, not traced: exit_mmap() sets
    MMF_OOM_SKIP on the victim's mm once its pages are unmapped, before the last batch of them is
    freed and uncharged; a fault then finds the group still full and the victim skipped, and the
    OOM killer takes the largest process left.
    Lowering the bystanders' oom_score_adj would close it, but needs CAP_SYS_RESOURCE, which this
    machine's root lacks. That attempt did not set up the case under test, so it is said and run
    again, three attempts at most; every assertion holds on the attempt that counts."""
    for attempt in range(1, 4):
        run_dir = tmp_path / f"attempt-{attempt}"
        run_dir.mkdir()
        pidfile, go, held = run_dir / "pid", run_dir / "go", run_dir / "held"
        go.write_text("now")
        neighbour = subprocess.Popen(in_group(group, PY, "-c", HOLDER, "300", str(held)))
        try:
            wait_for(held)
            worker = (PY, "-c", FIRST_RUN, str(pidfile), str(go), "hog")
            _, ev, err = run_in(group, run_dir, *SHAPE, "--budget", "300MiB", *ONE_RESTART, "--", *worker)
            survived = neighbour.poll() is None
        finally:
            neighbour.kill()
            neighbour.wait()
        if survived:
            break
        assert neighbour.returncode == -signal.SIGKILL, neighbour.returncode  # only the OOM killer's second kill
        print(f"attempt {attempt}: the kernel OOM-killed the neighbour as well (the MMF_OOM_SKIP window); again")
    assert survived, "the neighbour was OOM-killed beside the worker in 3 attempts of 3"
    exits = [e for e in ev if e["event"] == "exit"]
    assert (exits[0]["reason"], exits[0]["oom_victim"]) == ("oom-kill", "worker"), err
    assert 295 * MiB <= exits[0]["outside_bytes"] <= 315 * MiB
    assert "of the 512 MiB limit was outside the worker's tree" in exits[0]["message"]
    assert [e["concurrency"] for e in ev if e["event"] == "start"] == [3, 3]


def verify_in(g: Group, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = g.run(PY, "-m", "oomguard", "verify", "--json", "--hold", "0.5", *args, env=ENV)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@needs_v1
@pytest.mark.slow
def test_verify_says_the_groups_peak_and_one_touched_figure(group: Group) -> None:
    """Before: "peak RSS 1.85 GiB" (summed VmHWM) where the group peaked at 1.79 GiB; "touched 1.11 GiB"
    on stderr and "768 MiB of 1.5 GiB touched" on stdout for one run."""
    group.write("memory.memsw.limit_in_bytes", str(GiB))
    group.set_limit(GiB)
    rc, out, err = verify_in(group, "--budget", "768MiB")
    assert rc == 0 and out["group_peak_source"] == "memory.max_usage_in_bytes"
    assert out["group_peak_bytes"] == int((group.dir / "memory.max_usage_in_bytes").read_text())  # a fresh group
    assert out["touched_bytes"] <= out["group_peak_bytes"] < out["touched_bytes"] + 96 * MiB
    assert out["children_vmhwm_sum_bytes"] >= out["touched_bytes"] and "peak_rss_bytes" not in out
    rc, out, err = verify_in(group, "--budget", "1536MiB")
    assert rc == 4 and out["touched_bytes"] < out["target_bytes"]
    touched = f"touched {format_size(out['touched_bytes'])} of {format_size(out['target_bytes'])} in "
    assert f" of {len(out['children'])} children {touched}" in err, err  # the same figure as the result's
    assert out["group_peak_bytes"] == GiB  # the group reached its limit, as the kernel recorded


@needs_v1
def test_check_shows_a_v1_soft_limit_as_a_reclaim_target(group: Group) -> None:
    """Before: "soft limit -" for memory.soft_limit_in_bytes 2.5 GiB."""
    group.write("memory.memsw.limit_in_bytes", str(4 * GiB))
    group.set_limit(4 * GiB)
    group.write("memory.soft_limit_in_bytes", str(2560 * MiB))
    proc = group.run(PY, "-m", "oomguard", "check", "--json", env=ENV)
    report = json.loads(proc.stdout)
    assert report["memory"]["protection"]["v1_soft_limit_bytes"] == 2560 * MiB
    assert report["memory"]["soft_limit_bytes"] is None and report["budget"]["basis_bytes"] == 4 * GiB  # not a cap
    assert (
        "  soft limit       2.5 GiB        memory.soft_limit_in_bytes: a reclaim target under contention, not a cap"
        in format_human(report)
    )
    human = group.run(PY, "-m", "oomguard", "check", env=ENV).stdout
    assert "soft limit       2.5 GiB        memory.soft_limit_in_bytes: a reclaim target" in human


def test_check_shows_v2_protections_as_such() -> None:
    root = DirRoot(str(REPO / "tests/fixtures/v2_memory_low_min_protection_only/root"))
    text = format_human(probe(root=root))
    assert "  protection       256 MiB        memory.min: kept from reclaim, not a cap\n" in text
    assert "  protection       1 GiB          memory.low: kept from reclaim where it can, not a cap\n" in text
