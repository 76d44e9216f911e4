"""Real OCI runtimes (runc, crun, podman) on this host: oomguard inside, the kernel outside.

Each test starts a real container whose memory settings the runtime makes, runs
``oomguard check --json`` (or ``oomguard run``) inside it from the checkout, and grades the answer
against the container's cgroup files read from outside (``tests/helpers/runtimes.py`` has the bundle, the
runtimes' traps and the grading). This machine kind's memory hierarchy is v1; the same cases run on
cgroup v2 in the VM (``tests/integration/vm/guest/check_runtimes.py``). A runtime is skipped, with the reason,
only where it cannot start a container here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.realcgroup import writable_parent
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
    case_run_kill_9_beside_oom,
    case_run_oom_descendant,
    case_run_oom_worker,
    lab_or_skip,
    runs_in,
    usable_or_skip,
)

VERSION, PARENT = writable_parent()
# The runtimes' own default: the host's cgroup namespace on v1 (Docker, podman), a private one on v2.
DEFAULT_CGROUPNS = VERSION == 2
NAMESPACES = [pytest.param(False, id="host-cgroupns"), pytest.param(True, id="private-cgroupns")]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One rootfs and state directory for the module; every container and group removed afterwards."""
    yield from lab_or_skip(tmp_path_factory.mktemp("runtimes"))


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest, lab: Lab) -> str:
    return usable_or_skip(lab, request.param)


# -- oomguard check --------------------------------------------------------------------------


def test_limit(lab: Lab, runtime: str) -> None:
    case_limits(lab, runtime, Limits(limit=300 * MiB), cgroupns=DEFAULT_CGROUPNS)


def test_limit_and_swap(lab: Lab, runtime: str) -> None:
    case_limits(lab, runtime, Limits(limit=300 * MiB, swap=500 * MiB), cgroupns=DEFAULT_CGROUPNS)


def test_limit_and_reservation(lab: Lab, runtime: str) -> None:
    case_limits(lab, runtime, Limits(limit=300 * MiB, reservation=100 * MiB), cgroupns=DEFAULT_CGROUPNS)


@pytest.mark.parametrize("cgroupns", NAMESPACES)
def test_parent_limit_below_the_containers(lab: Lab, runtime: str, cgroupns: bool) -> None:
    case_parent_below(lab, runtime, cgroupns=cgroupns)


@pytest.mark.parametrize("cgroupns", NAMESPACES)
def test_parent_limit_and_no_container_limit(lab: Lab, runtime: str, cgroupns: bool) -> None:
    case_parent_only(lab, runtime, cgroupns=cgroupns)


# -- oomguard run ----------------------------------------------------------------------------


@pytest.fixture(scope="module", params=RUNTIMES)
def runs(request: pytest.FixtureRequest, lab: Lab) -> Runs:
    """One container per runtime: an OOM-killed worker, an OOM-killed descendant, a kill -9 from
    outside, a kill -9 beside an OOM kill."""
    return runs_in(lab, usable_or_skip(lab, request.param), cgroupns=DEFAULT_CGROUPNS, beside_oom=True)


def test_run_oom_kill_of_the_worker(runs: Runs) -> None:
    case_run_oom_worker(runs, VERSION or 0)


def test_run_oom_kill_of_a_descendant(runs: Runs) -> None:
    case_run_oom_descendant(runs)


def test_run_kill_9_from_outside_is_a_signal(runs: Runs) -> None:
    case_run_kill_9(runs)


def test_run_kill_9_beside_an_oom_kill_is_a_signal(runs: Runs) -> None:
    case_run_kill_9_beside_oom(runs)
