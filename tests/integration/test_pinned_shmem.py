"""Pinned memory counts where the kernel counts it: in the memory cgroup, as shmem.

CUDA's cudaHostAlloc is charged to the memory cgroup as shmem, not to RLIMIT_MEMLOCK
(MakazhanAlpamys/Soup#655: 4 GiB of pin_memory added 4 GiB to RssShmem and to memory.stat shmem,
VmLck flat). With no GPU here, memfd pages stand in for it (tests/helpers/workers.py PINNER): shmem is
swap-backed, sits on the anon LRU lists and is never in inactive_file (cgroup-v2.rst, memory.stat:
"file ... including tmpfs and shared memory"; "shmem pages are on anon memory management lists"),
so usage - inactive_file keeps it. Each test holds such pages in a real memory cgroup and shows
that the probe, verify, run --guard and MemoryBudget(watch=True) count them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers.realcgroup import Group, limited_group
from tests.helpers.workers import PINNER

MiB = 1 << 20
PY = sys.executable
ENV = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")}
ENV["PYTHONPATH"] = str(REPO / "src")


@pytest.fixture
def group() -> Iterator[Group]:
    with limited_group(512 * MiB, no_swap=True) as g:
        yield g


def holding(mib: int, marker: Path, command: str) -> list[str]:
    """PINNER holding *mib* MiB of shmem while it runs *command* (in the same group)."""
    return [PY, "-c", PINNER, str(mib), str(marker), "0", command]


def test_the_probe_counts_pinned_pages_in_usage_working_set_and_shmem(group: Group, tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    check = f"{PY} -m oomguard check --json --no-gpu"
    proc = group.run("/bin/sh", "-c", f'"$@" > {out}', "sh", *holding(128, tmp_path / "m", check), env=ENV)
    assert proc.returncode == 0, proc.stderr
    mem = json.loads(out.read_text())["memory"]
    assert mem["shmem_bytes"] >= 128 * MiB, mem
    assert mem["usage_bytes"] >= 128 * MiB
    assert mem["inactive_file_bytes"] < 16 * MiB  # shmem is never inactive_file
    assert mem["usage_bytes"] - mem["inactive_file_bytes"] >= 128 * MiB  # the working set keeps it
    assert mem["effective_bytes"] == 512 * MiB


@pytest.mark.slow
def test_verify_cannot_deliver_what_pinned_pages_already_hold(group: Group, tmp_path: Path) -> None:
    verify = f"{PY} -m oomguard verify --no-gpu --budget 300MiB --hold 0.2"
    control = group.run(*verify.split(), env=ENV)  # 300 MiB fits in 512 MiB
    assert control.returncode == 0, control.stderr
    before = group.oom_kills()
    proc = group.run(*holding(256, tmp_path / "m", verify), env=ENV)  # 256 + 300 MiB do not
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "NOT DELIVERED" in proc.stdout, proc.stdout
    assert group.oom_kills() > before  # the kernel killed a child: the pinned pages held the room


@pytest.mark.slow
def test_the_guard_stops_the_worker_earlier_by_what_is_pinned(group: Group, tmp_path: Path) -> None:
    ev, marker = tmp_path / "ev.jsonl", tmp_path / "m"
    worker = [PY, "-c", PINNER, "192", str(marker), "2048"]
    proc = group.run(
        PY, "-m", "oomguard", "run", "--events", str(ev), "--restart", "never", "--guard", "--", *worker, env=ENV
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    end = [json.loads(line) for line in ev.read_text().splitlines()][1]
    assert proc.returncode == 0 and (end["reason"], end["oom_kills"]) == ("pressure-stop", 0), end
    assert group.oom_kills() == 0  # the guard acted before the kernel
    assert 448 * MiB <= end["working_set_peak_bytes"] < 512 * MiB  # the stop line: 512 MiB - 64 MiB margin
    grown = int(marker.read_text().split("TERM ")[1])
    # The private memory it grew by stops short of the line by the 192 MiB held as shmem: without
    # counting those pages the guard would have let it grow to about 448 MiB and the kernel kill it.
    assert grown <= 448 - 192, marker.read_text()


WATCHED = r"""
import json, mmap, os
from oomguard import MemoryBudget
from tests.helpers.wait import wait_until
MiB = 1 << 20
fd = os.memfd_create("pinned-standin"); os.ftruncate(fd, 150 * MiB)
pinned = mmap.mmap(fd, 150 * MiB)
out = {}
with MemoryBudget.from_system(budget="200MiB", watch=True, guard_margin="16MiB", interval=0.02, gpu=False) as b:
    out["static_would"] = b.used + 100 * MiB <= b.total
    for i in range(0, 150 * MiB, 4096): pinned[i] = 1
    out["ws_held"] = wait_until(lambda: (b.working_set or 0) >= 150 * MiB and b.working_set, what="the pages sampled")
    out["refused"] = b.try_reserve(100 * MiB) is None
print(json.dumps(out))
"""


def test_memory_budget_watch_admits_by_the_pinned_pages_too(group: Group) -> None:
    group.set_limit(256 * MiB)
    env = {**ENV, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}  # the child waits with tests.helpers.wait
    proc = group.run(PY, "-c", WATCHED, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["static_would"]  # the reservations alone would admit it
    assert 150 * MiB <= out["ws_held"] < 230 * MiB  # the interpreter plus the 150 MiB of shmem
    assert out["refused"]  # working set + 100 MiB > 256 - 16 MiB
