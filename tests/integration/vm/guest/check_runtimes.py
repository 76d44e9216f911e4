"""Real OCI runtimes (runc, crun, podman) on the cgroup v2 kernel: oomguard inside, the kernel outside.

The host's suite (tests/integration/test_runtimes.py, v1 there) runs every case on every runtime; here the
same cases (tests/helpers/runtimes.py) meet v2, where a private cgroup namespace (the runtimes' default)
hides a parent's limit and the report must carry ``limit-may-be-hidden``, and the host's shows it.
Under TCG each container start costs seconds (podman's most) and each Python start one or two, so
a limit, swap and a reservation share one container, the parent-limit cases are spread over the
runtimes and namespaces rather than crossed, and ``oomguard run`` runs in runc only. No systemd in
the guest: podman uses cgroupfs, as on the host. A runtime is skipped, with the reason, only
where it cannot start a container.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.runtimes import (
    RUNTIMES,
    Lab,
    Limits,
    MiB,
    Runs,
    case_limits,
    case_parent_below,
    case_parent_only,
    case_run_kill_9,
    case_run_oom_descendant,
    case_run_oom_worker,
    lab_or_skip,
    runs_in,
    usable_or_skip,
)


def spread(*pairs: tuple[str, bool]) -> list[object]:
    """(runtime, private cgroup namespace) pairs as parameters named like the host's suite's."""
    return [pytest.param(rt, ns, id=f"{rt}-{'private' if ns else 'host'}-cgroupns") for rt, ns in pairs]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One rootfs and state directory for the module; every container and group removed afterwards."""
    for lab in lab_or_skip(tmp_path_factory.mktemp("runtimes")):
        assert lab.hier.version == 2, lab.hier
        yield lab


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_limit_swap_and_reservation(lab: Lab, runtime: str) -> None:
    """memory.max, memory.swap.max (swap - limit) and memory.low, in the default private namespace."""
    limits = Limits(limit=300 * MiB, swap=500 * MiB, reservation=100 * MiB)
    case_limits(lab, usable_or_skip(lab, runtime), limits, cgroupns=True)


@pytest.mark.parametrize(("runtime", "cgroupns"), spread(("runc", False), ("runc", True)))
def test_parent_limit_below_the_containers(lab: Lab, runtime: str, cgroupns: bool) -> None:
    case_parent_below(lab, usable_or_skip(lab, runtime), cgroupns=cgroupns)


@pytest.mark.parametrize(("runtime", "cgroupns"), spread(("runc", True), ("crun", False), ("podman", True)))
def test_parent_limit_and_no_container_limit(lab: Lab, runtime: str, cgroupns: bool) -> None:
    case_parent_only(lab, usable_or_skip(lab, runtime), cgroupns=cgroupns)


@pytest.fixture(scope="module")
def runs(lab: Lab) -> Runs:
    return runs_in(lab, usable_or_skip(lab, "runc"), cgroupns=True, beside_oom=False)


def test_run_oom_kill_of_the_worker(runs: Runs) -> None:
    case_run_oom_worker(runs, 2)


def test_run_oom_kill_of_a_descendant(runs: Runs) -> None:
    case_run_oom_descendant(runs)


def test_run_kill_9_from_outside_is_a_signal(runs: Runs) -> None:
    case_run_kill_9(runs)
