"""Boundaries, one value below, at and above each threshold: the 64 MiB memlock warning, the CPU
rounding epsilon of the planner, and the margin step ``run`` takes after each OOM kill."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from oomguard._types import WarningEntry
from oomguard.policy.plan import CPU_EPSILON, cpu_capacity
from oomguard.probes.memlock import probe_memlock
from oomguard.probes.parsers import parse_cpu_max, parse_status
from oomguard.report import MEMLOCK_LOW_BYTES
from oomguard.sources.root import DirRoot
from oomguard.supervisor.supervise import OOM_STEP_MIN, oom_margin_step
from tests.helpers.supervise import OOM_WORKER, V2_EVENTS, cgroup_tree, supervise_in_tree

MiB = 1024**2
GiB = 1024**3
NO_CAPS = "CapEff:\t0000000000000000\n"
CAP_IPC_LOCK = "CapEff:\t0000000000004000\n"  # bit 14


def memlock_warnings(tmp_path: Path, soft: int, status: str = NO_CAPS) -> list[WarningEntry]:
    limits = tmp_path / "proc" / "self" / "limits"
    limits.parent.mkdir(parents=True, exist_ok=True)
    limits.write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        f"Max locked memory         {soft}             {soft}             bytes\n"
    )
    warnings: list[WarningEntry] = []
    section = probe_memlock(DirRoot(str(tmp_path)), parse_status(status), warnings)
    assert section["soft_bytes"] == soft
    return warnings


def test_the_threshold_is_64_mib() -> None:
    assert MEMLOCK_LOW_BYTES == 64 * MiB == 67108864


@pytest.mark.parametrize(("soft", "warned"), [(64 * MiB - 1, True), (64 * MiB, False), (64 * MiB + 1, False)])
def test_memlock_low_below_64_mib_only(tmp_path: Path, soft: int, warned: bool) -> None:
    warnings = memlock_warnings(tmp_path, soft)
    if warned:
        assert [w["code"] for w in warnings] == ["memlock-low"]
        assert "RLIMIT_MEMLOCK soft limit is 64 MiB (67108863 bytes) and" in warnings[0]["message"]
        assert "CAP_IPC_LOCK is not held" in warnings[0]["message"]
    else:
        assert warnings == []


def test_cap_ipc_lock_silences_the_warning_just_below(tmp_path: Path) -> None:
    assert memlock_warnings(tmp_path, 64 * MiB - 1, CAP_IPC_LOCK) == []


# -- CPU: floor(cpus / cpus_per_job + 1e-9) ------------------------------------------------------


def test_a_real_quota_lands_just_below_a_whole_number() -> None:
    status, cpus = parse_cpu_max("70000 100000")  # cpu.max for 0.7 CPUs
    assert status == "value" and cpus == 0.7
    assert 0.7 / 0.1 < 7  # 6.999999999999999: floor alone would say 6
    assert cpu_capacity(cpus, 0.1) == 7


@pytest.mark.parametrize(
    ("quotient", "jobs"),
    [
        (7 - 10 * CPU_EPSILON, 6),  # well below: a real shortfall, not rounding
        (7 - CPU_EPSILON / 2, 7),  # within the epsilon: rounding, counts as 7
        (7.0, 7),  # exactly
        (7 + CPU_EPSILON, 7),  # just above: still 7, never 8
        (8 - 10 * CPU_EPSILON, 7),
    ],
)
def test_cpu_epsilon_boundary(quotient: float, jobs: int) -> None:
    assert cpu_capacity(quotient, 1.0) == jobs


def test_cpu_capacity_needs_both() -> None:
    assert cpu_capacity(None, 1.0) is None and cpu_capacity(8.0, None) is None


# -- the margin step after an OOM kill: max(256 MiB, 5% of the basis) ---------------------------


@pytest.mark.parametrize(
    ("basis", "step"),
    [
        (5 * GiB - 20, OOM_STEP_MIN),  # 5% = 268435455: the 256 MiB floor
        (5 * GiB, OOM_STEP_MIN),  # 5% of 5 GiB is exactly 256 MiB
        (5 * GiB + 20, OOM_STEP_MIN + 1),  # 5% = 268435457
        (64 * GiB, 3435973836),  # int(68719476736 x 0.05)
        (None, OOM_STEP_MIN),  # unknown basis: the floor
    ],
)
def test_oom_margin_step(basis: int | None, step: int) -> None:
    assert oom_margin_step(basis) == step


@pytest.mark.parametrize(
    ("limit", "budgets"),
    [
        # basis 64 GiB: margin 6871947673 (10%), step 3435973836 (5%); budget floored to whole MiB
        (64 * GiB, [58982 * MiB, 55705 * MiB, 52428 * MiB, 49152 * MiB]),
        # basis 4 GiB: margin 429496729 (10%), step 256 MiB (5% would be 204.8 MiB)
        (4 * GiB, [3686 * MiB, 3430 * MiB, 3174 * MiB, 2918 * MiB]),
    ],
)
def test_run_raises_the_margin_one_step_per_oom_kill(tmp_path: Path, limit: int, budgets: list[int]) -> None:
    tree = cgroup_tree(tmp_path / "tree", 2, limit)
    worker = [sys.executable, "-c", OOM_WORKER, str(tree / V2_EVENTS), "3"]  # three OOM kills, then a clean exit
    rc, ev, _, _ = supervise_in_tree(tree, command=worker)
    assert rc == 0
    assert [e["budget_bytes"] for e in ev if e["event"] == "start"] == budgets
    assert [e["reason"] for e in ev if e["event"] == "exit"] == ["oom-kill"] * 3 + ["clean"]
    steps = [e["message"] for e in ev if e["event"] == "restart"]
    assert len(steps) == 3 and all(m.startswith("after an OOM kill: safety margin raised by ") for m in steps)
