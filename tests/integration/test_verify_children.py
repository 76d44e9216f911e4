"""``verify`` is bounded: at most ``--children`` processes, whatever the plan (issue #37, item 3).

Before, ``verify --budget 32MiB --per-job 1KiB`` (a plan of 32,768 jobs) started one child per
job: 1,364 children and +5.3 GB in 12 s; under a pids limit of 400 it reached the limit with
1.7 GiB charged in 13 s and died with a traceback. Here the children are counted for real: by
a cgroup pids limit the run must stay under (and its ``pids.peak``), and, where no pids cgroup
can be made, by watching the verify process's children in /proc while it runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from oomguard.errors import EXIT_USAGE, EXIT_VERIFY_FAILED
from oomguard.verify._alloc import EXIT_ALLOC_FAILED
from oomguard.verify.launch import start_child
from oomguard.verify.shares import DEFAULT_CHILDREN, MAX_CHILDREN, Load, spread
from tests.conftest import REPO, run_oomguard
from tests.helpers.realcgroup import Group, limited_group
from tests.helpers.wait import wait_until

MiB = 1 << 20
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}
THOUSANDS = ("--budget", "32MiB", "--per-job", "1KiB")  # the command: 32,768 jobs
JOBS = 32 * 1024


# -- a real pids cgroup --------------------------------------------------------------------------


def _own_pids_dir() -> Path | str:
    """This process's pids cgroup directory (v1 ``pids`` hierarchy, or v2 with pids delegated), or why not."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    mounts = [line.split(" - ") for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        v1 = hid != "0" and "pids" in controllers.split(",")
        if not v1 and not (hid == "0" and controllers == ""):
            continue
        for pre, post in mounts:
            fstype, _, opts = post.split(" ", 2)
            if (v1 and fstype == "cgroup" and "pids" in opts.split(",")) or (not v1 and fstype == "cgroup2"):
                root, mount_point = pre.split(" ")[3:5]
                where = Path(mount_point + (path[len(root) :] if root != "/" else path))
                if v1 or "pids" in (where / "cgroup.subtree_control").read_text().split():
                    return where
    return "no pids controller is mounted (v1) or delegated (v2) for this process"


class PidsGroup:
    """A child pids cgroup with ``pids.max`` set; removed on close."""

    def __init__(self, parent: Path, limit: int) -> None:
        self.dir = parent / f"oomguard-pids-{uuid.uuid4().hex[:8]}"
        self.dir.mkdir()
        (self.dir / "pids.max").write_text(str(limit))

    def read(self, name: str) -> str:
        return (self.dir / name).read_text()

    def current(self) -> int:
        return int(self.read("pids.current"))

    def peak(self) -> int | None:
        """``pids.peak`` where the kernel has it (Linux 6.1+ on v1, 6.13+ on v2), else None."""
        return int(self.read("pids.peak")) if (self.dir / "pids.peak").exists() else None

    def times_at_max(self) -> int:
        """``pids.events``' ``max``: how often a fork failed at ``pids.max``."""
        return int(self.read("pids.events").split()[1])

    def close(self) -> None:
        wait_until(self._removed, interval=0.05, what=f"{self.dir} to be removable")

    def _removed(self) -> bool:
        try:
            self.dir.rmdir()
        except FileNotFoundError:
            return True
        except OSError:  # the last task is exiting
            return False
        return True


@contextmanager
def pids_limited(limit: int) -> Iterator[PidsGroup]:
    """A fresh pids group with ``pids.max`` = *limit*, or pytest.skip with the reason."""
    where = _own_pids_dir()
    if isinstance(where, str):
        pytest.skip(f"no real pids cgroup: {where}")
    try:
        g = PidsGroup(where, limit)
    except OSError as exc:
        pytest.skip(f"no real pids cgroup: cannot create one under {where}: {exc.strerror}")
    try:
        yield g
    finally:
        g.close()


def verify_in(memory: Group, pids: PidsGroup, *args: str) -> subprocess.CompletedProcess[str]:
    """``oomguard verify ARGS`` placed in both groups before it starts."""
    script = 'echo $$ > "$1/cgroup.procs" && echo $$ > "$2/cgroup.procs" && shift 2 && exec "$@"'
    cmd = [sys.executable, "-m", "oomguard", "verify", "--no-gpu", "--hold", "0.2", *args]
    return subprocess.run(
        ["/bin/sh", "-c", script, "sh", str(memory.dir), str(pids.dir), *cmd],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )


def _delivered_all_jobs(out: dict[str, Any], children: int) -> None:
    assert out["delivered"] is True, out
    assert (out["jobs"], out["jobs_touched"]) == (JOBS, JOBS)  # every planned job's memory
    assert out["plan"]["concurrency"] == JOBS
    assert out["target_bytes"] == out["touched_bytes"] == 32 * MiB
    assert (len(out["children"]), out["children_limit"]) == (children, children)
    assert sum(c["jobs"] for c in out["children"]) == JOBS
    assert {c["outcome"] for c in out["children"]} == {"ok"}


def test_a_plan_of_thousands_of_jobs_verifies_under_a_pids_limit() -> None:
    """32,768 jobs over 3 children, in a group where 5 tasks may exist: verify and its 3 children."""
    n = 3
    with limited_group(512 * MiB, no_swap=True) as memory, pids_limited(n + 2) as pids:
        proc = verify_in(memory, pids, *THOUSANDS, "--children", str(n), "--json")
        assert proc.returncode == 0, proc.stderr
        _delivered_all_jobs(json.loads(proc.stdout), n)
        assert pids.times_at_max() == 0  # no fork was refused
        peak = pids.peak()
        print(f"pids.max {n + 2}, pids.peak {peak}")
        if peak is not None:
            assert peak <= n + 1, peak  # verify itself and its n children, never more


def test_more_children_than_the_pids_limit_allows_fail_in_one_line() -> None:
    """The limit is real: 8 children under pids.max 4 stop at the fourth task (as one child per job
    did, with a traceback), say so in one line, exit 4 and leave no child behind."""
    with limited_group(512 * MiB, no_swap=True) as memory, pids_limited(4) as pids:
        proc = verify_in(memory, pids, *THOUSANDS, "--children", "8")
        assert proc.returncode == EXIT_VERIFY_FAILED, proc.stderr
        assert proc.stderr == (
            "oomguard: error: verify: cannot start child 4 of 8: Resource temporarily unavailable "
            "(a pids limit? try --children 3)\n"
        )
        assert pids.times_at_max() >= 1  # the kernel refused the fork
        wait_until(lambda: pids.current() == 0, what="every task of the group to be gone")
        assert pids.peak() in (None, 4)


def test_the_default_is_counted_in_proc_while_verify_runs() -> None:
    """No cgroup needed: the verify process's children, seen in /proc, never exceed the default."""
    cmd = [sys.executable, "-m", "oomguard", "verify", "--no-gpu", "--hold", "2", "--json", *THOUSANDS]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    seen: set[int] = set()
    most = 0

    def sample() -> bool:
        nonlocal most
        kids = _children_of(proc.pid)
        seen.update(kids)
        most = max(most, len(kids))
        return proc.poll() is not None

    wait_until(sample, timeout=300, interval=0.005, what="verify to finish")
    out = json.loads(proc.stdout.read())  # type: ignore[union-attr]
    assert proc.returncode == 0, proc.stderr.read()  # type: ignore[union-attr]
    limit = out["children_limit"]
    assert 1 <= limit <= DEFAULT_CHILDREN
    _delivered_all_jobs(out, limit)
    assert {c["pid"] for c in out["children"]} <= seen  # we watched the real children
    print(f"children seen in /proc: {len(seen)} (at most {most} at once), limit {limit}")
    assert len(seen) == most == limit


def _children_of(pid: int) -> set[int]:
    """The live children of *pid*: /proc/PID/task/*/children (CONFIG_PROC_CHILDREN), else every
    /proc/*/stat whose parent is *pid*."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        return {int(c) for t in tasks for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()}
    except FileNotFoundError:
        if not os.path.exists(f"/proc/{pid}"):
            return set()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry))
    return found


# -- the flag ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", f"--children: must be from 1 to {MAX_CHILDREN}, got '0'"),
        (str(MAX_CHILDREN + 1), f"--children: must be from 1 to {MAX_CHILDREN}, got '{MAX_CHILDREN + 1}'"),
        ("-1", "--children: must not be negative, got '-1'"),
        ("two", "--children: expected a whole number, got 'two'"),
        ("1.5", "--children: expected a whole number, got '1.5'"),
        ("", "--children: expected a whole number, got ''"),
    ],
)
def test_children_out_of_range_is_one_line_and_exit_2(value: str, message: str) -> None:
    proc = run_oomguard("verify", "--budget", "1MiB", "--hold", "0", "--children", value)
    assert (proc.returncode, proc.stderr) == (EXIT_USAGE, f"oomguard: error: {message}\n")
    assert proc.stdout == ""  # refused before any child started


@pytest.mark.parametrize(("value", "children"), [("1", 1), (str(MAX_CHILDREN), 2)])
def test_children_bounds_are_accepted(value: str, children: int) -> None:
    """1 and the cap pass; never more children than shares (2 jobs here)."""
    args = ("--budget", "1MiB", "--per-job", "64KiB", "--max-jobs", "2", "--hold", "0", "--no-gpu", "--json")
    proc = run_oomguard("verify", *args, "--children", value)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (len(out["children"]), out["children_limit"]) == (children, int(value))
    assert (out["jobs"], out["jobs_touched"], out["touched_bytes"]) == (2, 2, 128 * 1024)


def test_a_bare_budget_is_sliced_over_the_children_and_says_so_in_text() -> None:
    proc = run_oomguard("verify", "--budget", "6MiB", "--hold", "0", "--no-gpu", "--json", "--children", "3")
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["delivered"] is True, proc.stderr
    assert [c["bytes"] for c in out["children"]] == [2 * MiB] * 3
    assert (out["jobs"], out["jobs_touched"]) == (None, None)  # no plan, no jobs
    text = run_oomguard("verify", *THOUSANDS, "--hold", "0", "--no-gpu", "--children", "2")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(
        "oomguard verify: DELIVERED: 32 MiB of 32 MiB touched in 2 child processes (at most 2)\n"
        "  jobs        32768 of 32768 jobs' memory touched\n"
    ), text.stdout


def test_help_says_the_flag_and_its_default() -> None:
    out = " ".join(run_oomguard("verify", "--help").stdout.split())
    assert f"--children N allocate in at most N child processes, 1..{MAX_CHILDREN}" in out
    assert f"(default: the CPUs verify may use, at most {DEFAULT_CHILDREN})" in out


# -- how the shares are spread (pure) and the child's protocol -----------------------------------


def test_spread_balances_bytes_and_keeps_every_job() -> None:
    loads = spread(0, JOBS, 1024, 3)
    assert [ld.jobs for ld in loads] == [10923, 10923, 10922]
    assert loads[0].argv() == ["10923x1024"]
    # the baseline's child takes fewer jobs: 64 + 5 x 128 MiB over 2 -> 320 and 384 MiB
    first, second = spread(64 * MiB, 5, 128 * MiB, 2)
    assert (first.baseline_bytes, first.jobs, first.bytes) == (64 * MiB, 2, 320 * MiB)
    assert (second.baseline_bytes, second.jobs, second.bytes) == (0, 3, 384 * MiB)
    assert spread(64 * MiB, 5, 128 * MiB, 1) == [Load(((1, 64 * MiB), (5, 128 * MiB)), 5, 64 * MiB)]
    assert len(spread(MiB, 2, 1, 8)) <= 3 and spread(0, 0, 1, 8) == []  # never more children than shares
    for baseline, jobs, per_job, n in [(0, 7, 5, 3), (100, 7, 5, 3), (1000, 3, 5, 4), (1, 1, 1, 8), (5, 0, 1, 2)]:
        loads = spread(baseline, jobs, per_job, n)
        assert 1 <= len(loads) <= n and all(ld.shares for ld in loads)
        assert sum(ld.jobs for ld in loads) == jobs and sum(ld.baseline_bytes for ld in loads) == baseline
        assert sum(ld.bytes for ld in loads) == baseline + jobs * per_job


def test_the_alloc_child_takes_runs_of_shares() -> None:
    child = start_child("_alloc", "3x4096", "100", stdin=subprocess.PIPE)
    assert child.stdout is not None and child.stdin is not None
    final = json.loads(child.stdout.readline())
    assert (final["touched"], final["shares"]) == (3 * 4096 + 100, 4)
    child.stdin.close()
    assert child.wait(30) == 0
    bad = start_child("_alloc", "2xlots")
    out, _ = bad.communicate(timeout=30)
    assert "error" in json.loads(out) and bad.returncode == EXIT_ALLOC_FAILED
