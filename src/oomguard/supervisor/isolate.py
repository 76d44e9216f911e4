"""``oomguard run --isolate``: the worker in its own memory cgroup, limited to budget + margin.

An overrun then kills only the worker (the supervisor stays outside the sub-group) and the
sub-group's own ``oom_kill`` counter attributes the kill exactly. Possible where the
process's memory cgroup is writable: v1 as root; v2 with delegation (``memory`` in the
parent's ``cgroup.subtree_control``). Elsewhere ``create`` says why and the caller goes on.

Reads go through a ``Root``, writes through a ``CgroupFS``: both over "/" when live, over one
fake tree in tests.
"""

from __future__ import annotations

import os

from oomguard.probes.counters import read_peak
from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import Failure, Root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Report


def _delegated(root: Root, parent: str) -> bool:
    """Whether the v2 memory controller is enabled for the children of *parent*.

    Documentation/admin-guide/cgroup-v2.rst, "Enabling and Disabling": a controller listed in
    a group's ``cgroup.subtree_control`` (space-separated names) is enabled in its children.
    """
    control = root.read(parent + "/cgroup.subtree_control")
    return not isinstance(control, Failure) and "memory" in control.split()


class Isolation:
    def __init__(self, path: str, version: int, root: Root, fs: CgroupFS) -> None:
        self.path = path
        self.version = version
        self.root = root
        self.fs = fs

    @classmethod
    def create(
        cls, report: Report, limit_bytes: int, name: str, root: Root, fs: CgroupFS
    ) -> tuple[Isolation | None, str]:
        """A new sub-group of the process's memory cgroup, or (None, why not)."""
        cg = report["memory"]["cgroup"]
        parent, version = cg["dir"], cg["version"]
        if parent is None or version is None:
            return None, "no memory cgroup is mounted"
        if version == 2 and not _delegated(root, parent):
            return None, f"the memory controller is not delegated below {parent} (not in cgroup.subtree_control)"
        path = os.path.join(parent, name)
        try:
            fs.mkdir(path)
        except OSError as exc:
            return None, f"cannot create {path}: {exc.strerror}"
        iso = cls(path, version, root, fs)
        # v2 memory.max / v1 memory.limit_in_bytes: the hard limit (cgroup-v2.rst, cgroup-v1/memory.rst).
        try:
            fs.write_text(iso._file("memory.limit_in_bytes" if version == 1 else "memory.max"), str(limit_bytes))
        except OSError as exc:
            iso.remove()
            return None, f"cannot set the limit of {path}: {exc.strerror}"
        return iso, f"worker isolated in {path} with a limit of {limit_bytes} bytes"

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def place_self(self) -> None:
        """Move the calling process into the group (from the child, before exec): its PID to ``cgroup.procs``."""
        self.fs.write_text(self._file("cgroup.procs"), str(os.getpid()))

    @property
    def oom_source(self) -> str:
        """The group's own OOM-kill counter file (see ``probes/counters.read_oom_kills``)."""
        return self._file("memory.oom_control" if self.version == 1 else "memory.events")

    def peak(self) -> int | None:
        return read_peak(self.root, self.path, self.version)

    def remove(self) -> bool:
        """Remove the (empty) group; False when the kernel refuses (processes still in it)."""
        try:
            self.fs.rmdir(self.path)
        except OSError:
            return False
        return True
