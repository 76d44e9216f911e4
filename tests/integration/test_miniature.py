"""The fleet learns, end to end on real cgroups (issue 23, item 6; ``tests/helpers/miniature.py``):
after the under-declared class's first OOM kill, none again; the over-declared class runs more
jobs per node than its declared size allows. The kernel's own OOM-kill counters of the groups
are the judge, not oomguard's events."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.manager import ManagerProcess
from tests.helpers.miniature import BASELINE, BUDGET, DECLARED, NODES, run_miniature
from tests.helpers.realcgroup import Group, named_groups


@pytest.fixture
def groups() -> Iterator[dict[str, Group]]:
    with named_groups(tuple(NODES), "oomguard-mini") as made:
        yield made


@pytest.mark.slow
def test_three_real_nodes_learn_the_profile_s_real_size(groups: dict[str, Group], tmp_path: Path) -> None:
    server = ManagerProcess(f"sqlite:///{tmp_path / 'fleet.db'}").start()
    try:
        out = run_miniature(server.url, groups, tmp_path)
    finally:
        server.stop()
    declared_jobs = (BUDGET - BASELINE) // DECLARED
    print(f"\nminiature: concurrency {out.concurrency}; ends {out.reasons}; kernel OOM kills {out.kernel_oom_kills}")
    # Under-declared: the declared plan is OOM-killed once, by the kernel; then never again.
    assert out.concurrency["u1"][0] == declared_jobs and out.reasons["u1"][0] == "oom-kill"
    assert out.kernel_oom_kills["u1"] == 1, out.kernel_oom_kills
    assert out.reasons["u1"][1:] == ["clean"] * (len(out.reasons["u1"]) - 1)
    assert all(c is not None and 0 < c < declared_jobs for c in out.concurrency["u1"][1:]), out.concurrency
    learned = out.learned["u1"][1]
    assert learned is not None and learned["used"] == "learned" and learned["per_job_bytes"] > DECLARED
    # Over-declared: never killed, and by the last round more jobs per node than declared.
    for name in ("o1", "o2"):
        assert out.kernel_oom_kills[name] == 0 and set(out.reasons[name]) == {"clean"}, (name, out)
        assert out.concurrency[name][0] == declared_jobs
        final = out.learned[name][-1]
        assert final is not None and final["source"] == "class" and final["per_job_bytes"] < DECLARED, final
        assert (out.concurrency[name][-1] or 0) > declared_jobs, out.concurrency
