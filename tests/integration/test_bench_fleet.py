"""bench/fleet.py's fleet: a run plans with the baseline its policy gives (the manager's
recommended one, as ``plan --learned --learned-may-lower`` does) but is killed by the real one,
and the whole bench runs small against the real manager, with and without the size for a budget."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.conftest import REPO

pytest.importorskip("fastapi", reason="bench/fleet.py runs the manager: its extra is not installed")

GiB = 1 << 30


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_fleet", REPO / "bench" / "fleet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


fleet = _bench()


@dataclass
class Fixed:
    """A policy with one size and baseline for every run; it keeps what it is told."""

    per_job: int
    baseline: int
    runs: list[Any] = field(default_factory=list)

    def size(self, profile: Any, node: str, cls: str, now: int) -> tuple[int, int]:
        return self.per_job, self.baseline

    def learn(self, run: Any) -> None:
        self.runs.append(run)


class Exact:
    """Every job at its declared size: a run's sum is what its plan reserved."""

    def peak(self, rng: Any, pair: Any, declared: int) -> int:
        return declared


def test_a_run_plans_with_its_policys_baseline_and_is_killed_by_the_real_one() -> None:
    """One node of the 480 GiB class runs p0 (4 GiB jobs, a 2 GiB baseline). Planned with the real
    baseline, 119 jobs of 4 GiB fit in 478 GiB; planned with none, the run takes 120 jobs (480 GiB)
    and the kernel kills it; planned with one 10 GiB larger, 117 jobs."""
    profile = fleet.PROFILES[0]
    assert (profile.per_job, profile.baseline, fleet.CLASSES["h100-512g"]) == (4 * GiB, 2 * GiB, 480 * GiB)
    exact = Fixed(4 * GiB, profile.baseline)
    low, high = Fixed(4 * GiB, 0), Fixed(4 * GiB, profile.baseline + 10 * GiB)
    tallies = fleet.simulate({"exact": exact, "low": low, "high": high}, 1, 2, 1, Exact())
    assert [r.jobs for r in exact.runs] == [119, 119] and tallies["exact"].ooms == 0
    assert [(r.jobs, r.killed) for r in low.runs] == [(120, True), (120, True)] and tallies["low"].ooms == 2
    assert tallies["low"].later_ooms == 1  # the second is after the pair's first
    assert [r.jobs for r in high.runs] == [117, 117] and tallies["high"].completed == 234


def test_the_bench_runs_small_against_the_real_manager_with_and_without_the_budget() -> None:
    """Small (16 nodes, 20 runs) against the real manager, with and without the budget; and with
    ``--direct`` (the rule in process, no HTTP, no database) the same output, line for line: the
    API and the store answer what ``learning.recommend`` answers."""
    outs = {}
    for flag in ("", "--no-budget", "--direct", "--direct --no-budget"):
        outs[flag] = subprocess.run(
            [sys.executable, str(REPO / "bench" / "fleet.py"), "--nodes", "16", "--rounds", "20", *flag.split()],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout
    lines = {}
    for flag in ("", "--no-budget"):
        out = outs[flag]
        manager = [line for line in out.splitlines() if line.strip().startswith("oomguard manager")]
        assert len(manager) == 1, out
        assert "slack / idle room by class of node: h100-512g" in out and "a new node of a known class" in out, out
        assert "clairvoyant (sees peaks)" in out and "oracle, 1 in 10,000 runs" in out, out
        assert "a new node of each (profile, class) run, 3 runs: OOM kills " in out, out
        assert "first P95 forecast / true P95 per-job peak - 1" in out, out
        assert "the same runs sized by the oracle, 1 in 1,000 runs: slack" in out, out
        lines[flag] = manager[0]
        assert outs[f"--direct {flag}".strip()] == out
    assert lines[""] != lines["--no-budget"], lines  # the budget changed the manager's sizes


def test_the_clairvoyant_runs_the_most_jobs_that_fit_and_is_never_killed() -> None:
    """It sees the run's peaks: on p9 in the 64 GiB class (49 GiB of room), jobs of 20, 20 and 10
    GiB fit 2 (40 GiB: a third would pass the room); a first job of 50 GiB fits none, and the run
    is not started."""
    profile, cls = fleet.PROFILES[9], "cpu-64g"
    room = fleet.CLASSES[cls] - profile.baseline
    assert room == 49 * GiB
    seer = fleet.Clairvoyant()
    seer.peaks = [20 * GiB, 20 * GiB, 10 * GiB]
    assert fleet.plan(seer, profile, "n", cls, 0)[1] == 2
    seer.peaks = [50 * GiB, GiB]
    assert fleet.plan(seer, profile, "n", cls, 0)[1] == 0


def test_the_oracles_kill_chance_matches_the_jobs_it_models() -> None:
    """``Lognormal.kill_chance`` (a Fenton-Wilkinson sum over the count of 2x jobs) against 40,000
    runs drawn as the bench draws them, at rooms where it says 10 %, 1 % and 0.1 %: within the
    draws' own error (3 standard errors, and 20 % of the chance)."""
    import math
    import random

    world = fleet.Lognormal(random.Random(23))
    pair, declared, jobs = ("p0", "h100-512g"), 4 * GiB, 20
    rng = random.Random(5)
    runs = 40_000
    sums = sorted(sum(world.peak(rng, pair, declared) for _ in range(jobs)) for _ in range(runs))
    for chance in (0.1, 0.01, 0.001):
        lo, hi = sums[0], 4 * sums[-1]
        for _ in range(60):  # the room at which the model says *chance*
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if world.kill_chance(pair, declared, jobs, mid) > chance else (lo, mid)
        seen = sum(x > hi for x in sums) / runs
        error = 3 * math.sqrt(chance * (1 - chance) / runs) + 0.2 * chance
        assert abs(seen - chance) <= error, (chance, seen)
    oracle = fleet.Oracle(world, 1e-4)
    _, planned = fleet.plan(oracle, fleet.PROFILES[0], "n", "h100-512g", 0)
    room = 478 * GiB
    assert (
        world.kill_chance(pair, declared, planned, room) <= 1e-4 < world.kill_chance(pair, declared, planned + 1, room)
    )
