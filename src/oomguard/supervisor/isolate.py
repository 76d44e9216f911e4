"""``oomguard run --isolate``: the worker in its own memory cgroup, limited to budget + margin.

An overrun then kills only the worker (the supervisor stays outside the sub-group) and the
sub-group's own ``oom_kill`` counter attributes the kill exactly. Possible where the
process's memory cgroup is writable: v1 as root; v2 with delegation (``memory`` in the
parent's ``cgroup.subtree_control``). Elsewhere ``create`` says why and the caller goes on.
"""

from __future__ import annotations

import os

from oomguard.probes.memory import read_oom_kills
from oomguard.probes.parsers import parse_int_file
from oomguard.sources.root import Failure, LiveRoot

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Report


class Isolation:
    def __init__(self, path: str, version: int) -> None:
        self.path = path
        self.version = version

    @classmethod
    def create(cls, report: Report, limit_bytes: int, name: str) -> tuple[Isolation | None, str]:
        """A new sub-group of the process's memory cgroup, or (None, why not)."""
        cg = report["memory"]["cgroup"]
        parent, version = cg["dir"], cg["version"]
        if parent is None or version is None:
            return None, "no memory cgroup is mounted"
        if version == 2:
            control = LiveRoot().read(parent + "/cgroup.subtree_control")
            if isinstance(control, Failure) or "memory" not in control.split():
                return None, (f"the memory controller is not delegated below {parent} (not in cgroup.subtree_control)")
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except OSError as exc:
            return None, f"cannot create {path}: {exc.strerror}"
        iso = cls(path, version)
        try:
            iso._write("memory.limit_in_bytes" if version == 1 else "memory.max", str(limit_bytes))
        except OSError as exc:
            iso.remove()
            return None, f"cannot set the limit of {path}: {exc.strerror}"
        return iso, f"worker isolated in {path} with a limit of {limit_bytes} bytes"

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def place_self(self) -> None:
        """Move the calling process into the group (from the child, before exec)."""
        self._write("cgroup.procs", str(os.getpid()))

    @property
    def oom_source(self) -> str:
        return os.path.join(self.path, "memory.oom_control" if self.version == 1 else "memory.events")

    def oom_kills(self) -> int | None:
        return read_oom_kills(LiveRoot(), self.oom_source)

    def peak(self) -> int | None:
        text = LiveRoot().read(
            os.path.join(self.path, "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")
        )
        return None if isinstance(text, Failure) else parse_int_file(text)

    def remove(self) -> bool:
        try:
            os.rmdir(self.path)
        except OSError:
            return False
        return True
