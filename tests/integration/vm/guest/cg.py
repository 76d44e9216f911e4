"""Real cgroup v2 groups inside the VM, made with plain file writes (no oomguard code).

The guest's /sys/fs/cgroup is a cgroup2 mount with ``memory`` enabled at the root
(tests/integration/vm/harness.py); the test process sits in the root group, which the no-internal-process
rule exempts, so groups made here are free to hold processes or children.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
CGROOT = Path("/sys/fs/cgroup")
REPO = Path(__file__).resolve().parents[4]
PYTHON = sys.executable


class Group:
    """A cgroup v2 directory; ``remove`` kills what is left in it and removes it with its children."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.children: list[Group] = []

    @property
    def rel(self) -> str:
        """The path as /proc/self/cgroup shows it from the root namespace."""
        return "/" + str(self.path.relative_to(CGROOT))

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def write(self, name: str, value: str | int) -> None:
        (self.path / name).write_text(str(value))

    def read(self, name: str) -> str:
        return (self.path / name).read_text()

    def keyed(self, name: str) -> dict[str, int]:
        """A flat keyed file (memory.events): ``oom_kill 1`` per line."""
        return {k: int(v) for k, v in (line.split() for line in self.read(name).splitlines())}

    def child(self, name: str, max_bytes: int | None = None) -> Group:
        """A child group; +memory goes into this group's subtree_control first."""
        if "memory" not in self.read("cgroup.subtree_control").split():
            self.write("cgroup.subtree_control", "+memory")
        g = Group(self.path / name)
        g.path.mkdir()
        self.children.append(g)
        if max_bytes is not None:
            g.write("memory.max", max_bytes)
        return g

    def popen(self, *cmd: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen[str]:
        """Start *cmd* with its process placed in this group before it execs."""
        script = f'echo $$ > "{self.path}/cgroup.procs" && exec "$@"'
        return subprocess.Popen(["/bin/sh", "-c", script, "sh", *cmd], env=env or oomguard_env(), text=True, **kw)

    def run(
        self, *cmd: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run *cmd* inside this group to completion."""
        script = f'echo $$ > "{self.path}/cgroup.procs" && exec "$@"'
        return subprocess.run(
            ["/bin/sh", "-c", script, "sh", *cmd],
            env=env or oomguard_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def remove(self) -> None:
        for c in reversed(self.children):
            c.remove()
        if not self.path.exists():
            return
        if (self.path / "cgroup.kill").exists():  # Linux >= 5.14
            self.write("cgroup.kill", 1)
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError:  # processes just killed may take a moment to leave
                time.sleep(0.05)
        self.path.rmdir()


def new_group(max_bytes: int | None = None) -> Group:
    g = Group(CGROOT / f"og-{uuid.uuid4().hex[:6]}")
    g.path.mkdir()
    if max_bytes is not None:
        g.write("memory.max", max_bytes)
    return g


def oomguard_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")}
    env["PYTHONPATH"] = str(REPO / "src")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def parse_report(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.strip(), f"no JSON on stdout (rc {proc.returncode}); stderr: {proc.stderr}"
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def check(group: Group, *args: str) -> dict[str, Any]:
    """``python -m oomguard check --json`` inside *group*; the report (exit status 0 asserted)."""
    proc = group.run(PYTHON, "-m", "oomguard", "check", "--json", *args)
    report = parse_report(proc)
    assert proc.returncode == 0, proc.stderr
    return report


def warning_codes(report: dict[str, Any]) -> list[str]:
    return [w["code"] for w in report["warnings"]]


def meminfo_bytes(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name == key:
            return int(rest.split()[0]) * 1024
    raise KeyError(key)


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# A worker that allocates and touches N bytes (argv[1]) then exits 0.
HOG = (
    "import sys; n = int(sys.argv[1]); b = bytearray(n); b[::4096] = b'x' * len(range(0, n, 4096)); print('touched', n)"
)
