"""The real cgroup v2 kernel: one VM boot per pytest session, shared by every guest test.

tests/integration/vm/guest/ holds the tests that run inside the VM; this host run never collects them
itself (collect_ignore), it boots the VM once, runs them there and reports each one
(tests/integration/vm/test_v2_kernel.py).
"""

from __future__ import annotations

import compileall
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.vm import harness

collect_ignore = ["guest"]

REPO = Path(__file__).resolve().parents[3]
# What runs inside: the guest tests and the seed story (tests/integration/test_seed_story.py, also run here on v1).
GUEST_ARGS = ["tests/integration/vm/guest", "tests/integration/test_seed_story.py"]
GUEST_TIMEOUT_S = 1200  # pytest inside: 10-13 min under TCG beside the host tests; CI's slower run passed 900
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
    from tests.integration.vm.test_v2_kernel import GUEST_IDS

    return GUEST_ARGS if set(wanted) >= set(GUEST_IDS) else [shlex.quote(w) for w in wanted]


def compile_for_the_guest() -> None:
    """Write the bytecode of src/ and tests/ (gitignored __pycache__/) before the guest starts.

    The guest sees the checkout read-only and writes no bytecode, so each ``python -m oomguard``
    it starts compiled every module it imported from source, under TCG: with the bytecode there,
    12 guest checks (namespaces, run contract) took 73.9 s against 105.5 s. compileall writes it
    whatever PYTHONDONTWRITEBYTECODE says; an up-to-date file is left alone."""
    for part in ("src", "tests"):
        compileall.compile_dir(REPO / part, quiet=2, workers=1)


def _boot_and_run(selection: list[str], out: Path) -> VMRun:
    """Boot the kernel and run *selection* in it; a VMRun that skips where the VM cannot start."""
    script = harness.pytest_script(REPO, sys.executable, selection, GUEST_TIMEOUT_S)
    start = time.monotonic()
    compile_for_the_guest()
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


class _Background:
    """The VM booted in a thread from the end of collection: the guest (one TCG vCPU) runs while the
    host tests use the other core, and the first VM test waits for it. OOMGUARD_VM_FOREGROUND=1 boots
    it only when that first test asks, as before (for timing a guest test on its own)."""

    def __init__(self, selection: list[str]) -> None:
        self.out = Path(tempfile.mkdtemp(prefix="oomguard-vm-v2-"))
        self.run: VMRun | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, args=(selection,), name="oomguard-vm", daemon=True)
        self.thread.start()

    def _main(self, selection: list[str]) -> None:
        try:
            self.run = _boot_and_run(selection, self.out)
        except BaseException as exc:  # handed to the test that waits for it
            self.error = exc

    def result(self) -> VMRun:
        self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.run is not None
        return self.run


_background: list[_Background] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    wanted = any("v2_vm" in getattr(item, "fixturenames", ()) for item in session.items)
    if wanted and not os.environ.get("OOMGUARD_VM_FOREGROUND") and not session.config.option.collectonly:
        _background.append(_Background(_selection(session)))


@pytest.fixture(scope="session")
def v2_vm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> VMRun:
    """Boot the kernel once and run the selected guest tests in it; skip only where it cannot start."""
    if _background:
        return _background[0].result()
    return _boot_and_run(_selection(request.session), tmp_path_factory.mktemp("vm-v2"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _summary:
        terminalreporter.write_line(line)
