"""Real cgroups for tests: child groups under this process's own memory cgroup.

Found independently of oomguard's own resolution (a plain reading of /proc/self/cgroup
and mountinfo), so the tests do not grade the probe with its own logic.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.wait import wait_until


def own_memory_cgroup() -> tuple[int, Path] | tuple[None, str]:
    """(version, directory) of this process's memory cgroup, or (None, why not)."""
    cgroup = Path("/proc/self/cgroup").read_text().splitlines()
    mounts = [line.split(" - ") for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for line in cgroup:
        hid, controllers, path = line.split(":", 2)
        if hid != "0" and "memory" in controllers.split(","):
            for pre, post in mounts:
                fstype, _, opts = post.split(" ", 2)
                if fstype == "cgroup" and "memory" in opts.split(","):
                    root, mount_point = pre.split(" ")[3:5]
                    rel = path[len(root) :] if root != "/" else path
                    return 1, Path(mount_point + rel)
    for line in cgroup:
        if line.startswith("0::"):
            for pre, post in mounts:
                if post.startswith("cgroup2 "):
                    root, mount_point = pre.split(" ")[3:5]
                    path = line[3:]
                    rel = path[len(root) :] if root != "/" else path
                    return 2, Path(mount_point + rel)
    return None, "no memory cgroup is mounted"


class Group:
    """A child memory cgroup, removed (with its children) on close."""

    def __init__(self, version: int, parent: Path, name: str | None = None) -> None:
        self.version = version
        self.dir = parent / (name or f"oomguard-test-{uuid.uuid4().hex[:8]}")
        self.dir.mkdir()
        self.children: list[Group] = []

    def child(self, name: str = "child") -> Group:
        g = Group(self.version, self.dir, name)
        self.children.append(g)
        return g

    def set_limit(self, n: int) -> None:
        name = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
        (self.dir / name).write_text(str(n))

    def write(self, name: str, value: str) -> None:
        (self.dir / name).write_text(value)

    def oom_kills(self) -> int:
        """The kernel's ``oom_kill`` count of this group (v1 memory.oom_control, v2 memory.events)."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        line = next(x for x in (self.dir / name).read_text().splitlines() if x.startswith("oom_kill "))
        return int(line.split()[1])

    def run(
        self, *cmd: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run *cmd* with its process placed in this group before it starts (*timeout*: only bounds a hang)."""
        procs = self.dir / "cgroup.procs"
        script = f'echo $$ > "{procs}" && exec "$@"'
        return subprocess.run(
            ["/bin/sh", "-c", script, "sh", *cmd], capture_output=True, text=True, env=env, timeout=timeout
        )

    def close(self) -> None:
        for c in self.children:
            c.close()
        if self.dir.exists():
            wait_until(self._removed, interval=0.05, what=f"{self.dir} to be removable")

    def _removed(self) -> bool:
        try:
            self.dir.rmdir()
        except OSError:  # a process that just exited may still be charged for a moment
            return False
        return True


def writable_parent() -> tuple[int, Path] | tuple[None, str]:
    """Where tests may create groups, or (None, the reason they cannot)."""
    if not sys.platform.startswith("linux"):
        return None, "not Linux"
    version, where = own_memory_cgroup()
    if version is None:
        return None, str(where)
    parent = Path(where)
    probe = parent / f"oomguard-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as exc:
        return None, f"cannot create a child cgroup under {parent}: {exc.strerror}"
    probe.rmdir()
    if version == 2 and "memory" not in (parent / "cgroup.subtree_control").read_text().split():
        return None, f"cgroup v2 memory controller is not delegated to children of {parent}"
    return version, parent


def python_exe() -> str:
    return shutil.which("python3") or sys.executable


@contextmanager
def limited_group(limit: int | None = None, *, no_swap: bool = False) -> Iterator[Group]:
    """A fresh child group under ``writable_parent()`` (pytest.skip, with the reason, where there is
    none), limited to *limit* when given, and with *no_swap* on v1 its memory+swap too, so a test
    cannot escape into swap; removed afterwards."""
    version, parent = writable_parent()
    if version is None:
        import pytest

        pytest.skip(f"real cgroups unavailable: {parent}")
    g = Group(version, Path(parent))
    try:
        if limit is not None:
            g.set_limit(limit)
            if no_swap and version == 1 and (g.dir / "memory.memsw.limit_in_bytes").exists():
                g.write("memory.memsw.limit_in_bytes", str(limit))
        yield g
    finally:
        g.close()


@contextmanager
def named_groups(names: list[str] | tuple[str, ...], prefix: str) -> Iterator[dict[str, Group]]:
    """One fresh child group under ``writable_parent()`` per name (``PREFIX-NAME-TAG``: a node
    each), unlimited, removed afterwards; pytest.skip, with the reason, where there is none."""
    version, parent = writable_parent()
    if version is None:
        import pytest

        pytest.skip(f"real cgroups unavailable: {parent}")
    tag = uuid.uuid4().hex[:8]
    made = {name: Group(version, Path(parent), f"{prefix}-{name}-{tag}") for name in names}
    try:
        yield made
    finally:
        for g in made.values():
            g.close()
