"""bench/guard.py's packing side: the bounds it measures against (the FIFO floor, the reordering
oracle, the area bound) and its coordinator's admission order (FIFO, and MemoryBudget's backfill),
on a real process tree (no cgroup needed: the static budget)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import REPO
from tests.helpers.realcgroup import writable_parent

MiB = 1 << 20


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_guard", REPO / "bench" / "guard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


guard = _bench()


def job(i: int, real: int, seconds: float) -> dict[str, Any]:
    """A job of *real* bytes that lives *seconds* (its ramp plus the bench's hold)."""
    return {"id": i, "declared": real, "real": real, "ramp": seconds - guard.HOLD}


def test_a_blocked_head_costs_the_in_order_schedule_what_reordering_saves() -> None:
    # 100 bytes of room: A (60, 2 s) runs; B (60) cannot start beside it. In order, C and D
    # wait behind B; reordering starts C beside A at once and D when C ends.
    jobs = [job(0, 60, 2.0), job(1, 60, 1.0), job(2, 40, 1.0), job(3, 40, 1.0)]
    assert guard.greedy(jobs, 100, skip=False) == pytest.approx(4.0)  # A 0-2, B and C 2-3, D 3-4
    assert guard.greedy(jobs, 100, skip=True) == pytest.approx(3.0)  # A and C 0, D 1, B 2-3
    assert guard.fifo_floor(jobs, 100) == pytest.approx(4.0)
    best, _ = guard.oracle(jobs, 100)
    assert best == pytest.approx(3.0)


def test_a_job_that_never_fits_is_an_error_not_a_hang() -> None:
    with pytest.raises(ValueError, match="never fits"):
        guard.greedy([job(0, 200, 1.0)], 100, skip=True)


@given(
    st.lists(
        st.tuples(st.integers(1, 100), st.floats(1.0, 3.0, allow_nan=False)),
        min_size=1,
        max_size=12,
    )
)
def test_the_bounds_are_in_order(spec: list[tuple[int, float]]) -> None:
    """area bound <= oracle <= FIFO floor <= the jobs one after another."""
    jobs = [job(i, real, seconds) for i, (real, seconds) in enumerate(spec)]
    limit = 100 * 100 // 98 + 1  # the bench's line is limit - 2 %: about 100 bytes
    b = guard.bounds(jobs, limit, {"--guard-margin": "2%"})
    assert b["area"] <= b["oracle"] + 1e-9
    assert b["oracle"] <= b["fifo"] + 1e-9
    assert b["fifo"] <= sum(seconds for _, seconds in spec) + 1e-9
    assert b["oracle_slack"] < 1


def coordinate(tmp_path: Path, jobs: list[dict[str, Any]], budget: int, backfill: int) -> dict[str, Any]:
    """The bench's coordinator (``--inner``) on *jobs* with a static budget, outside any cgroup."""
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    progress = tmp_path / f"progress-{backfill}"
    args = ["--admit", "static", "--budget", str(budget), "--jobs", str(tmp_path / "jobs.json")]
    args += ["--progress", str(progress), "--backfill", str(backfill)]
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "guard.py"), "--inner", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    counts: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert sorted(progress.read_text().split()) == sorted(str(j["id"]) for j in jobs)
    return counts


@pytest.mark.slow
def test_the_coordinator_asks_in_order_and_backfill_starts_past_a_blocked_head(tmp_path: Path) -> None:
    # Declared 60, 60, 30, 30 MiB of a 100 MiB budget; each job really holds 8 MiB for about 1 s.
    # In order, the second 60 blocks both 30s; with backfill the first 30 starts beside the first 60.
    jobs = [{"id": i, "declared": d * MiB, "real": 8 * MiB, "ramp": 0.0} for i, d in enumerate((60, 60, 30, 30))]
    fifo = coordinate(tmp_path, jobs, 100 * MiB, 0)
    assert fifo["completed"] == 4 and fifo["killed"] == 0 and fifo["out_of_order"] == 0
    passed = coordinate(tmp_path, jobs, 100 * MiB, 8)
    assert passed["completed"] == 4 and passed["killed"] == 0 and passed["out_of_order"] >= 1


VERSION, PARENT = writable_parent()
SMALL = ("--limit", "768MiB", "--margin", "128MiB")


@pytest.mark.slow
@pytest.mark.skipif(VERSION is None, reason=f"real cgroups unavailable: {PARENT}")
def test_the_latency_bench_measures_every_trial_and_says_a_missed_one() -> None:
    """bench/guard_latency.py in small: every trial's crossing and signal seen, the signal from the
    guard's stop (well before its 2 s SIGKILL), the guard's CPU measured; 20 trials cover the grid
    once. The 50 ms goal and its 0 OOM kills are the bench's, at its 16 MiB default (BENCHMARKS.md);
    here a 128 MiB margin (31 ms at 4 GiB/s) leaves room for a loaded test machine, and one trial
    of 20 may still be missed: make test once missed one at 2 GiB/s with a 64 MiB margin (32 ms)
    while two other processes held both CPUs. A missed trial must be said as one (its line names
    the kernel's SIGKILL); a guard that does not act misses them all."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "guard_latency.py"), "--trials", "20", "--seconds", "1", *SMALL],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    missed = re.search(r"kernel OOM kills: (\d+); trials not signalled: (\d+)", out)
    assert "20 trials;" in out and missed is not None, out
    assert int(missed[1]) <= 1 and int(missed[2]) <= 1, out
    if int(missed[2]):
        assert re.findall(r"^  missed: .* rc=(-?\d+):", out, re.M) == ["137"], out  # the kernel's SIGKILL
        print(f"one trial of 20 missed on this machine, as said:\n{out}")
    worst = float(out.split("max", 1)[1].split("ms", 1)[0])
    assert worst < 1000, out
    assert out.count("| 4 GiB/s |") == 4 and out.count("| 0.25 GiB/s |") == 4, out
    assert "near the ceiling (20 ms sampling):" in out, out
