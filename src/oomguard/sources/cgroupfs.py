"""Writes to a cgroup file system: the only place oomguard changes files under /sys/fs/cgroup.

Reads go through a ``Root`` (``sources/root.py``); the few writes ``run --isolate`` needs
(make a sub-group, set its limit, move a process into it, remove it) go through a ``CgroupFS``.
Paths are absolute as on the system ("/sys/fs/cgroup/a/b"); *base* "/" is the live system, a
directory is a fake tree for tests (the same tree a ``DirRoot`` reads). Errors are ``OSError``:
the caller decides what a refused write means.

Kernel interface (Documentation/admin-guide/cgroup-v2.rst, "Basic Operations"; cgroup-v1/cgroups.rst):
a sub-group is created with mkdir(2) and removed with rmdir(2) once it has no processes; a
process is moved by writing its PID to the destination's ``cgroup.procs``; a limit is set by
writing a number to ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1).
"""

from __future__ import annotations

import os


class CgroupFS:
    """Write access to the cgroup files under *base* ("/" for the live system)."""

    def __init__(self, base: str = "/") -> None:
        self.base = os.path.abspath(base)

    def _path(self, path: str) -> str:
        return os.path.join(self.base, path.lstrip("/"))

    def write_text(self, path: str, value: str) -> None:
        """Write *value* to the control file *path* in one write(2), as the kernel expects.

        Opened as ``open(path, "w")`` would (O_CREAT|O_TRUNC): cgroupfs ignores both for an
        existing control file, and a fake tree gets the file made.
        """
        fd = os.open(self._path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def mkdir(self, path: str) -> None:
        os.mkdir(self._path(path))

    def rmdir(self, path: str) -> None:
        os.rmdir(self._path(path))
