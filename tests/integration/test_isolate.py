"""``run --isolate``: v2 delegation, clean-up and leftovers of dead supervisors; the limit it sets.

Decision logic over fake trees: a DirRoot reads them, ``FakeKernel`` (a CgroupFS) writes them and
refuses what the v2 kernel refuses (cgroup-v2.rst, "No Internal Process Constraint", "Enabling and
Disabling"). Kills are real: the processes in fake groups are ``sleep``s this test started. Then
real cgroup v1 groups on this machine (tests/helpers/realcgroup.py); v2 on a real kernel is
tests/integration/vm/guest/check_isolate.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oomguard.policy.budget import probe
from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import DirRoot, LiveRoot
from oomguard.supervisor.isolate import Isolation, isolation_limit
from tests.conftest import REPO
from tests.helpers.realcgroup import Group, limited_group, writable_parent
from tests.helpers.wait import wait_until

MiB, GiB = 1024**2, 1024**3
CG = "/sys/fs/cgroup"
ME = os.getpid()
RUN = f"oomguard-run-{ME}"  # the name supervise.py gives: this process is the supervisor


class FakeKernel(CgroupFS):
    """Writes to a fake v2 tree as the kernel answers them; *fail* maps (op, path) to an errno."""

    def __init__(self, base: Path, *, kill_file: bool = True, fail: dict[tuple[str, str], int] | None = None) -> None:
        super().__init__(str(base))
        self.kill_file, self.fail = kill_file, fail or {}
        self.log: list[tuple[str, ...]] = []

    def _read(self, path: str) -> str:
        return Path(self._path(path)).read_text() if os.path.exists(self._path(path)) else ""

    def _check(self, op: str, path: str, code: int | None = None) -> None:
        code = self.fail.get((op, path), code)
        if code:
            raise OSError(code, os.strerror(code), path)

    def _procs(self, under: str) -> Iterator[Path]:
        return Path(self._path(under)).rglob("cgroup.procs")

    def mkdir(self, path: str) -> None:
        self._check("mkdir", path)
        self.log.append(("mkdir", path))
        super().mkdir(path)
        files = {"cgroup.procs": "", "cgroup.type": "domain\n", "cgroup.subtree_control": "", "memory.max": "max\n"}
        files["cgroup.controllers"] = self._read(os.path.dirname(path) + "/cgroup.subtree_control")
        files |= {"cgroup.kill": ""} if self.kill_file else {}
        for name, text in files.items():
            super().write_text(f"{path}/{name}", text)

    def rmdir(self, path: str) -> None:
        real = Path(self._path(path))
        self._check("rmdir", path, errno.EBUSY if self._read(path + "/cgroup.procs").split() else None)
        self._check("rmdir", path, errno.EBUSY if any(p.is_dir() for p in real.iterdir()) else None)
        self.log.append(("rmdir", path))
        shutil.rmtree(real)

    def write_text(self, path: str, value: str) -> None:
        self._check("write", path)
        self.log.append(("write", path, value))
        group, name = os.path.split(path)
        if name == "cgroup.procs":
            internal = group != CG and self._read(group + "/cgroup.subtree_control").split()
            self._check("write", path, errno.EBUSY if internal else None)
            self._forget([int(value)])
            super().write_text(path, self._read(path) + f"{value}\n")
        elif name == "cgroup.subtree_control":
            assert value == "+memory"
            self._check("write", path, None if "memory" in self._read(group + "/cgroup.controllers") else errno.ENOENT)
            self._check("write", path, errno.EBUSY if group != CG and self._read(group + "/cgroup.procs") else None)
            super().write_text(path, "memory\n")
        elif name == "cgroup.kill":
            pids = [int(p) for f in self._procs(group) for p in f.read_text().split()]
            assert ME not in pids, "cgroup.kill on a group holding the test runner"
            super().kill_pids(pids)
            self._forget(pids)
        else:
            super().write_text(path, value)

    def kill_pids(self, pids: Iterable[int]) -> int:
        pids = list(pids)
        self.log.append(("kill", *map(str, pids)))
        sent = super().kill_pids(pids)
        self._forget(pids)  # a killed process leaves its group (as a zombie it is listed nowhere)
        return sent

    def _forget(self, pids: list[int]) -> None:
        for f in self._procs(CG):
            f.write_text("".join(f"{p}\n" for p in map(int, f.read_text().split()) if p not in pids))


def v2_tree(tmp: Path, group: str = "/job", procs: Iterable[int] = (ME,), controllers: str = "cpu memory") -> Path:
    """A v2 tree whose process sits in *group* (its cgroup.procs: *procs*), limited to 1 GiB."""
    files = {
        "proc/meminfo": "MemTotal:       4194304 kB\nMemAvailable:   2097152 kB\n",
        "proc/self/environ": "",
        "proc/self/status": "Name:\tpython3\nCapEff:\t0000000000000000\n",
        "proc/self/cgroup": f"0::{group}\n",
        "proc/self/mountinfo": "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
        "sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
        "sys/fs/cgroup/cgroup.subtree_control": f"{controllers}\n",
        "sys/fs/cgroup/cgroup.procs": "1\n",
    }
    if group != "/":
        g = f"sys/fs/cgroup{group}"
        files |= {f"{g}/cgroup.type": "domain\n", f"{g}/cgroup.controllers": f"{controllers}\n"}
        files |= {f"{g}/cgroup.subtree_control": "", f"{g}/cgroup.procs": "".join(f"{p}\n" for p in procs)}
        files |= {f"{g}/memory.max": f"{GiB}\n", f"{g}/memory.current": "1048576\n"}
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    return tmp


def report_of(tree: Path, budget: str | None = "64MiB") -> Any:
    return probe(root=DirRoot(str(tree)), budget=budget, gpu=False)


def create(tree: Path, fs: CgroupFS, name: str = RUN) -> tuple[Isolation | None, str]:
    return Isolation.create(report_of(tree), 128 * MiB, name, DirRoot(str(tree)), fs)


def procs(tree: Path, group: str) -> list[int]:
    return [int(p) for p in (tree / f"sys/fs/cgroup{group}/cgroup.procs").read_text().split()]


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes the test starts to be killed; any left are killed afterwards."""
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for p in made:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
        p.wait()


def sleeper(made: list[subprocess.Popen[bytes]], *argv: str) -> subprocess.Popen[bytes]:
    made.append(subprocess.Popen(list(argv) or ["sleep", "300"]))
    return made[-1]


# -- the limit ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "limit"),
    [
        ("64MiB", 128 * MiB),  # margin = default_margin(64 MiB): its 256 MiB floor capped at the budget
        ("300MiB", 556 * MiB),  # + the 256 MiB floor
        ("600MiB", 856 * MiB),
        ("900MiB", GiB),  # 900 + 256 MiB is above the 1 GiB ceiling: capped there
        ("2GiB", GiB),  # an explicit budget above the ceiling (warned by the budget): the ceiling
        (None, GiB),  # auto: budget + its own safety margin = the basis, the 1 GiB limit
    ],
)
def test_isolation_limit(tmp_path: Path, budget: str | None, limit: int) -> None:
    report = report_of(v2_tree(tmp_path), budget)
    assert isolation_limit(report, report["budget"]["bytes"]) == limit


def test_isolation_limit_without_a_known_ceiling_is_budget_plus_margin(tmp_path: Path) -> None:
    report = report_of(v2_tree(tmp_path), "200GiB")
    report["memory"]["effective_bytes"] = None
    assert isolation_limit(report, 200 * GiB) == 210 * GiB  # the margin's 10 GiB cap


# -- v2 delegation (fake kernel) -----------------------------------------------------------------


def test_the_supervisor_alone_in_its_group_moves_into_a_leaf_and_delegates(tmp_path: Path) -> None:
    tree = v2_tree(tmp_path)
    fs = FakeKernel(tree)
    iso, why = create(tree, fs)
    assert iso is not None and why == f"worker isolated in {CG}/job/{RUN} with a limit of {128 * MiB} bytes"
    assert procs(tree, "/job") == [] and procs(tree, "/job/oomguard-supervisor") == [ME]
    assert (tree / "sys/fs/cgroup/job/cgroup.subtree_control").read_text() == "memory\n"
    assert (tree / f"sys/fs/cgroup/job/{RUN}/memory.max").read_text() == str(128 * MiB)
    order = [e[:2] for e in fs.log]
    assert order.index(("write", f"{CG}/job/oomguard-supervisor/cgroup.procs")) < order.index(
        ("write", f"{CG}/job/cgroup.subtree_control")
    )  # out first, then +memory: the other order is refused (EBUSY)
    assert iso.remove() and not (tree / f"sys/fs/cgroup/job/{RUN}").exists()
    # The next start probes from the leaf: isolation works in the group above it, without moving again.
    (tree / "proc/self/cgroup").write_text("0::/job/oomguard-supervisor\n")
    fs.log.clear()
    again, why = create(tree, fs)
    assert again is not None and why.startswith(f"worker isolated in {CG}/job/{RUN} ")
    assert fs.log[0] == ("mkdir", f"{CG}/job/{RUN}")


def test_other_processes_in_the_group_are_not_moved(tmp_path: Path) -> None:
    tree = v2_tree(tmp_path, procs=(1, 55, ME))
    fs = FakeKernel(tree)
    assert create(tree, fs) == (
        None,
        f"2 other process(es) share {CG}/job (pid 1 55); memory can be enabled for its children only "
        "when no process sits in it, and oomguard moves only itself",
    )
    assert fs.log == [] and procs(tree, "/job") == [1, 55, ME]


def test_a_process_joining_meanwhile_sends_the_supervisor_back(tmp_path: Path) -> None:
    tree = v2_tree(tmp_path)
    fs = FakeKernel(tree, fail={("write", f"{CG}/job/cgroup.subtree_control"): errno.EBUSY})
    iso, why = create(tree, fs)
    assert iso is None and why == (
        f"cannot enable memory in {CG}/job/cgroup.subtree_control: Device or resource busy "
        "(another process joined the group)"
    )
    assert procs(tree, "/job") == [ME] and not (tree / "sys/fs/cgroup/job/oomguard-supervisor").exists()


@pytest.mark.parametrize(
    ("fail", "why"),
    [
        (("mkdir", "/job/oomguard-supervisor"), errno.EROFS),
        (("mkdir", "/job/oomguard-supervisor"), errno.EACCES),
        (("write", "/job/oomguard-supervisor/cgroup.procs"), errno.EACCES),
    ],
)
def test_a_group_that_is_not_writable_says_why_in_one_line(tmp_path: Path, fail: tuple[str, str], why: int) -> None:
    tree = v2_tree(tmp_path)
    iso, line = create(tree, FakeKernel(tree, fail={(fail[0], CG + fail[1]): why}))
    assert iso is None and "\n" not in line and os.strerror(why) in line
    hint = "read-only, as in a container" if why == errno.EROFS else "root, or a group delegated to this user"
    assert hint in line and procs(tree, "/job") == [ME]


def test_memory_not_available_to_the_group(tmp_path: Path) -> None:
    tree = v2_tree(tmp_path, controllers="cpu")
    fs = FakeKernel(tree)
    assert create(tree, fs) == (
        None,
        f"the memory controller is not available in {CG}/job (not in its cgroup.controllers)",
    )
    assert fs.log == []


def test_the_root_groups_subtree_control_is_left_alone(tmp_path: Path) -> None:
    tree = v2_tree(tmp_path, group="/", controllers="cpu")
    fs = FakeKernel(tree)
    iso, why = create(tree, fs)
    assert (iso, why) == (None, f"the memory controller is not delegated below {CG} (not in cgroup.subtree_control)")
    assert fs.log == [] and (tree / "sys/fs/cgroup/cgroup.subtree_control").read_text() == "cpu\n"


# -- clean-up (fake kernel, real processes) --------------------------------------------------------


@pytest.mark.parametrize("kill_file", [True, False])
def test_remove_kills_what_is_left(tmp_path: Path, sleepers: list[Any], kill_file: bool) -> None:
    tree = v2_tree(tmp_path)
    fs = FakeKernel(tree, kill_file=kill_file)
    iso, _ = create(tree, fs)
    assert iso is not None
    fs.mkdir(iso.path + "/sub")  # a group the worker made below its own
    a, b = sleeper(sleepers), sleeper(sleepers)
    fs.write_text(iso.path + "/cgroup.procs", str(a.pid))
    fs.write_text(iso.path + "/sub/cgroup.procs", str(b.pid))
    fs.log.clear()
    assert iso.remove() is True and not os.path.exists(fs._path(iso.path))
    assert a.wait(5) == b.wait(5) == -signal.SIGKILL
    kills = [e for e in fs.log if e[0] == "kill" or e[1].endswith("cgroup.kill")]
    assert kills == ([("write", iso.path + "/cgroup.kill", "1")] if kill_file else [("kill", str(b.pid), str(a.pid))])
    assert [e[1] for e in fs.log if e[0] == "rmdir"] == [iso.path + "/sub", iso.path]


def test_the_supervisor_itself_is_never_killed(tmp_path: Path, sleepers: list[Any]) -> None:
    tree = v2_tree(tmp_path, group="/")
    fs = FakeKernel(tree)
    iso, _ = create(tree, fs)
    assert iso is not None
    other = sleeper(sleepers)
    fs.write_text(iso.path + "/cgroup.procs", str(other.pid))
    iso.place_self()  # this test process in the group too: no cgroup.kill (it would kill us), PIDs one by one
    fs.log.clear()
    assert iso.kill() == 1 and other.wait(5) == -signal.SIGKILL
    assert iso.remove() is False and procs(tree, "/" + RUN) == [ME]
    assert [e for e in fs.log if e[0] == "kill" or e[1].endswith("cgroup.kill")] == [("kill", str(other.pid))]


# -- leftovers of dead supervisors (fake tree: /proc/PID/cmdline is the tree's) ----------------------


def test_leftovers_of_dead_supervisors_are_removed(tmp_path: Path, sleepers: list[Any]) -> None:
    tree = v2_tree(tmp_path)
    fs = FakeKernel(tree)
    cmdlines = {111: "python3\0-m\0oomguard\0run\0--isolate\0", 222: "sleep\x0060\0", 333: None, 444: ""}
    inside = {}
    for pid, cmdline in cmdlines.items():
        fs.mkdir(f"{CG}/job/oomguard-run-{pid}")
        inside[pid] = sleeper(sleepers)
        fs.write_text(f"{CG}/job/oomguard-run-{pid}/cgroup.procs", str(inside[pid].pid))
        if cmdline is not None:
            (tree / f"proc/{pid}").mkdir()
            (tree / f"proc/{pid}/cmdline").write_text(cmdline)
    (tree / "sys/fs/cgroup/job/oomguard-run-x").mkdir()  # not a supervisor's name: left alone
    iso, why = create(tree, fs)
    assert iso is not None
    assert why.split("; ")[1:] == [
        f"removed leftover {CG}/job/oomguard-run-{pid} (supervisor {pid} {how}, 1 process(es) in it killed)"
        for pid, how in [(222, "is no oomguard supervisor now"), (333, "is gone"), (444, "is gone")]  # 444: a zombie
    ]
    assert [inside[p].wait(5) for p in (222, 333, 444)] == [-signal.SIGKILL] * 3
    assert inside[111].poll() is None  # a live supervisor's worker is not touched
    left = sorted(p.name for p in (tree / "sys/fs/cgroup/job").iterdir() if p.name.startswith("oomguard-"))
    assert left == sorted(["oomguard-run-111", RUN, "oomguard-run-x", "oomguard-supervisor"])
    assert Isolation.reap_leftovers(report_of(tree), DirRoot(str(tree)), fs) == []  # nothing more to do


# -- real cgroup v1 on this machine --------------------------------------------------------------

VERSION, PARENT = writable_parent()
needs_v1 = pytest.mark.skipif(VERSION != 1, reason=f"real cgroup v1 unavailable: {PARENT}")
PY = sys.executable
ENV = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")} | {"PYTHONPATH": str(REPO / "src")}


@pytest.fixture
def group() -> Iterator[Group]:
    with limited_group(GiB) as g:
        try:
            yield g
        finally:
            for leftover in g.dir.glob("oomguard-run-*"):  # a failed test's: kill what is in it, remove it
                Isolation(str(leftover), 1, LiveRoot(), CgroupFS()).remove()


def v1_report(g: Group) -> Any:
    return {"memory": {"cgroup": {"dir": str(g.dir), "version": 1}, "effective_bytes": GiB}}


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@needs_v1
def test_v1_isolation_sets_the_limit_and_removal_kills_what_is_left(group: Group, sleepers: list[Any]) -> None:
    iso, why = Isolation.create(v1_report(group), 300 * MiB, "oomguard-run-1", LiveRoot(), CgroupFS())
    assert iso is not None, why
    assert int((group.dir / "oomguard-run-1/memory.limit_in_bytes").read_text()) == 300 * MiB
    s = sleeper(sleepers, "sh", "-c", "sleep 300 & sleep 300")
    (group.dir / "oomguard-run-1/cgroup.procs").write_text(str(s.pid))
    children = Path(f"/proc/{s.pid}/task/{s.pid}/children")
    forked = lambda: children.read_text().split()  # noqa: E731
    wait_until(forked, what="the sh to fork its first sleep (into the group)")
    assert iso.remove() is True and not (group.dir / "oomguard-run-1").exists()
    assert s.wait(5) == -signal.SIGKILL


@needs_v1
def test_v1_leftovers_are_reaped_and_a_live_supervisors_group_kept(group: Group, sleepers: list[Any]) -> None:
    live = sleeper(sleepers, PY, "-c", "import time; time.sleep(300)", "oomguard", "run")  # "an oomguard supervisor"
    reused = sleeper(sleepers)  # a PID some other program holds now
    dead = dead_pid()
    inside = {}
    for pid in (live.pid, reused.pid, dead):
        (group.dir / f"oomguard-run-{pid}").mkdir()
        inside[pid] = sleeper(sleepers)
        (group.dir / f"oomguard-run-{pid}/cgroup.procs").write_text(str(inside[pid].pid))
    notes = Isolation.reap_leftovers(v1_report(group), LiveRoot(), CgroupFS())
    assert notes == [
        f"removed leftover {group.dir}/oomguard-run-{pid} (supervisor {pid} {how}, 1 process(es) in it killed)"
        for pid, how in sorted(
            [(reused.pid, "is no oomguard supervisor now"), (dead, "is gone")], key=lambda x: str(x[0])
        )
    ]
    assert inside[reused.pid].wait(5) == inside[dead].wait(5) == -signal.SIGKILL
    assert inside[live.pid].poll() is None and (group.dir / f"oomguard-run-{live.pid}").is_dir()


@needs_v1
def test_v1_a_new_supervisor_reaps_what_a_sigkilled_one_left(group: Group, tmp_path: Path) -> None:
    """The worker dies with its supervisor (PR_SET_PDEATHSIG); its setsid'd child stays in the group until
    the next ``run --isolate`` there removes it (issue #12 item 5)."""
    spawn = "import subprocess as s, time; print(s.Popen(['setsid', 'sleep', '300']).pid, flush=True); time.sleep(300)"
    script = f'echo $$ > "{group.dir}/cgroup.procs" && exec "$@"'
    run = [PY, "-m", "oomguard", "run", "--isolate", "--budget", "64MiB", "--restart", "never"]
    first = subprocess.Popen(
        ["sh", "-c", script, "sh", *run, "--", PY, "-c", spawn], env=ENV, stdout=subprocess.PIPE, text=True
    )
    assert first.stdout is not None
    orphan = int(first.stdout.readline())
    first.kill()
    first.wait()
    left = group.dir / f"oomguard-run-{first.pid}"
    assert str(orphan) in (left / "cgroup.procs").read_text().split()  # what a SIGKILL leaves behind
    second = group.run(*run, "--events", str(tmp_path / "ev.jsonl"), "--", "true", env=ENV)
    assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr
    assert f"removed leftover {left} (supervisor {first.pid} is gone, 1 process(es) in it killed)" in second.stderr
    assert not left.exists() and not list(group.dir.glob("oomguard-run-*"))
    stat = Path(f"/proc/{orphan}/stat")  # the orphan is init's (or a subreaper's) to reap
    ended = lambda: not stat.exists() or stat.read_text().split(") ")[1][0] == "Z"  # noqa: E731
    wait_until(ended, what=f"pid {orphan} to end")
