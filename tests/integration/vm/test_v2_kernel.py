"""Each test of tests/integration/vm/guest (and the seed story) on a real cgroup v2 kernel, as its own test here.

The guest test ids are collected here first (pytest --collect-only with the guest's
configuration), so every guest test passes, fails (with its message), skips or xfails on its own.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.vm.conftest import GUEST_ARGS, REPO, VMRun


def _guest_ids() -> list[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("VMTEST_GUEST", None)
    env.pop("VMTEST_RESULTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", "tests/integration/vm/guest/guest.ini", "--rootdir", str(REPO),
         "--confcutdir", str(REPO / "tests/integration/vm/guest"), "--collect-only", "-q", *GUEST_ARGS],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    ids = [line for line in proc.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    return ids or [f"<collection failed: exit {proc.returncode}>"]


GUEST_IDS = _guest_ids()


@pytest.mark.parametrize("nodeid", GUEST_IDS)
def test_on_cgroup_v2(v2_vm: VMRun, nodeid: str) -> None:
    if v2_vm.skip is not None:
        pytest.skip(f"cgroup v2 VM unavailable: {v2_vm.skip}")
    result = v2_vm.results.get(nodeid)
    if result is None:
        pytest.fail(f"no result from the VM for {nodeid}\n{v2_vm.diagnostics()}", pytrace=False)
    outcome, message = result["outcome"], result["message"]
    if outcome in ("failed", "error"):
        pytest.fail(f"in the VM ({outcome}):\n{message}", pytrace=False)
    if outcome == "skipped":
        pytest.skip(f"in the VM: {message}")
    if outcome == "xfailed":
        pytest.xfail(f"in the VM: {message}")
    assert outcome in ("passed", "xpassed"), result
