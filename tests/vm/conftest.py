"""The real cgroup v2 kernel: one VM boot per pytest session, shared by every guest test.

tests/vm/guest/ holds the tests that run inside the VM; this host run never collects them
itself (collect_ignore), it boots the VM once, runs them there and reports each one
(tests/vm/test_v2_kernel.py).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.vm import harness

collect_ignore = ["guest"]

REPO = Path(__file__).resolve().parents[2]
# What runs inside: the guest tests and the seed story (tests/test_seed_story.py, also run here on v1).
GUEST_ARGS = ["tests/vm/guest", "tests/test_seed_story.py"]
GUEST_TIMEOUT_S = 600  # pytest inside: about 4 minutes under TCG with the run-numbers and runtime checks
VM_TIMEOUT_S = GUEST_TIMEOUT_S + 60

_summary: list[str] = []


class VMRun:
    def __init__(self, boot: harness.Boot | None, skip: str | None) -> None:
        self.boot = boot
        self.skip = skip
        self.results: dict[str, dict[str, Any]] = {}
        self.exitstatus: int | None = None
        if boot is not None:
            path = boot.out / "results.json"
            if path.exists():
                data = json.loads(path.read_text())
                self.results, self.exitstatus = data["tests"], data["exitstatus"]

    def diagnostics(self) -> str:
        """Why a guest test has no result: the end of the console and of pytest's output."""
        assert self.boot is not None
        b = self.boot
        log = b.out / "pytest.log"
        parts = [
            f"qemu exit {b.returncode}{' (timed out)' if b.timed_out else ''}, guest rc {b.guest_rc}, "
            f"after {b.wall_seconds:.1f}s; files in {b.out}",
            "--- console (end) ---",
            b.console[-3000:],
        ]
        if log.exists():
            parts += ["--- pytest.log (end) ---", log.read_text(errors="replace")[-3000:]]
        return "\n".join(parts + b.notes)


def _selection(session: pytest.Session) -> list[str]:
    """The guest tests this session selected (-k, node ids): all of GUEST_ARGS, or those ids."""
    params = [getattr(item, "callspec", None) for item in session.items]
    wanted = [p.params["nodeid"] for p in params if p is not None and "nodeid" in p.params]
    from tests.vm.test_v2_kernel import GUEST_IDS

    return GUEST_ARGS if set(wanted) >= set(GUEST_IDS) else [shlex.quote(w) for w in wanted]


@pytest.fixture(scope="session")
def v2_vm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> VMRun:
    """Boot the kernel once and run the selected guest tests in it; skip only where it cannot start."""
    out = tmp_path_factory.mktemp("vm-v2")
    script = harness.pytest_script(REPO, sys.executable, _selection(request.session), GUEST_TIMEOUT_S)
    start = time.monotonic()
    try:
        boot = harness.boot(script, out, timeout=VM_TIMEOUT_S, keep=(str(REPO), sys.prefix))
    except harness.Unavailable as exc:
        print(f"\nSKIP cgroup v2 VM tests: {exc}", file=sys.stderr)
        _summary.append(f"cgroup v2 VM: skipped: {exc}")
        return VMRun(None, str(exc))
    run = VMRun(boot, None)
    boot_s = f"{boot.boot_seconds:.1f}s" if boot.boot_seconds is not None else "?"
    _summary.append(
        f"cgroup v2 VM: kernel {boot.kernel}, boot {boot_s}, boot + guest suite {time.monotonic() - start:.1f}s, "
        f"{len(run.results)} results, guest pytest exit {run.exitstatus}; logs in {out}"
    )
    return run


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _summary:
        terminalreporter.write_line(line)
