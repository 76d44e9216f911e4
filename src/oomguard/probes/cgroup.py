"""Which cgroup this process is in, for a controller, and the directories to read.

Rules (docs/architecture.md, "Detection rules", has the sources):
- find the group through /proc/self/cgroup and /proc/self/mountinfo, never fixed paths;
- a controller comes from cgroup v1 only when /proc/self/cgroup lists it in a v1
  hierarchy that is also mounted (hybrid hosts keep memory in v1 while a cgroup2
  sits at /sys/fs/cgroup/unified); otherwise from the cgroup2 mount, if any;
- the group's directory is mount point + (path relative to the mount's root);
  a v1 Docker mount has root == path, so the limit sits at the mount point;
- both paths are relative to the reader's cgroup namespace root and are compared as
  they are, ``..`` included (``namespace.py``); a group really outside the mount root
  falls back to the mount root with warning ``outside-mount-root``; a group below the
  mount root whose names the namespace hides is found through ``cgroup.procs``, or its
  limits are unknown (warning ``cgroup-not-found``);
- the walk goes from the group up to the mount point: ancestors' limits apply too.
"""

from __future__ import annotations

from oomguard.probes.mounts import CgroupEntry, Mount
from oomguard.probes.namespace import HIDDEN, OUTSIDE, find_hidden_group, locate
from oomguard.report import add_warning

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import WarningEntry
    from oomguard.sources.root import Root

CGROUP_FS_ROOT = "/sys/fs/cgroup"


class Hierarchy:
    """A resolved cgroup for one controller: version, mount, path and the directories to read.

    ``dirs`` is empty when the group lies below the mount root but its directory could not
    be found (``found`` is False): its limits are unknown, not absent.
    """

    __slots__ = ("dirs", "mount", "path", "version")

    def __init__(self, version: int, mount: Mount, path: str, dirs: list[str]) -> None:
        self.version = version
        self.mount = mount
        self.path = path  # as in /proc/self/cgroup
        self.dirs = dirs  # leaf first, mount point last; [] when not found

    @property
    def found(self) -> bool:
        return bool(self.dirs)

    @property
    def leaf(self) -> str:
        return self.dirs[0]


def _rank_mount(m: Mount, path: str) -> tuple[int, int]:
    """Prefer mounts under /sys/fs/cgroup, then ones whose root contains *path*."""
    under_sys = m.mount_point == CGROUP_FS_ROOT or m.mount_point.startswith(CGROUP_FS_ROOT + "/")
    root_matches = locate(path, m.root)[0] != OUTSIDE
    return (1 if under_sys else 0, 1 if root_matches else 0)


def _pick(mounts: list[Mount], path: str) -> Mount | None:
    best: Mount | None = None
    best_rank = (-1, -1)
    for m in mounts:
        rank = _rank_mount(m, path)
        if rank > best_rank:  # first of equals wins
            best, best_rank = m, rank
    return best


def dirs_up(group_dir: str, mount_point: str) -> list[str]:
    """*group_dir* and each parent up to *mount_point* (which must be an ancestor or itself)."""
    top = mount_point.rstrip("/") or "/"
    rel = group_dir[len(top) :].strip("/") if group_dir != top else ""
    parts = [p for p in rel.split("/") if p]
    return [_join(top, parts[:i]) for i in range(len(parts), -1, -1)]


def _join(top: str, parts: list[str]) -> str:
    return "/".join([top.rstrip("/"), *parts]) or "/"


class Locator:
    """Resolves controllers to hierarchies for one probe: reads go through *root*.

    *pid* is this process's PID (``Pid:`` of /proc/self/status), used only to find a group
    whose names a cgroup namespace hides; None when unknown.
    """

    def __init__(
        self,
        root: Root | None,
        entries: list[CgroupEntry],
        mounts: list[Mount],
        pid: int | None,
        warnings: list[WarningEntry],
    ) -> None:
        self.root = root
        self.entries = entries
        self.mounts = mounts
        self.pid = pid
        self.warnings = warnings
        self._cache: dict[tuple[int, str, str], list[str]] = {}

    def find(self, controller: str) -> Hierarchy | None:
        """Resolve *controller* ("memory", "cpu", "cpuset") to a v1 or v2 hierarchy, or None."""
        for e in self.entries:
            if e.hierarchy_id != "0" and controller in e.controllers:
                v1 = [m for m in self.mounts if m.fstype == "cgroup" and controller in m.options()]
                m = _pick(v1, e.path)
                if m is not None:
                    return Hierarchy(1, m, e.path, self._dirs(m, e.path))
        for e in self.entries:
            if e.hierarchy_id == "0" and not e.controllers:
                m = _pick([m for m in self.mounts if m.fstype == "cgroup2"], e.path)
                if m is not None:
                    return Hierarchy(2, m, e.path, self._dirs(m, e.path))
        return None

    def _dirs(self, m: Mount, path: str) -> list[str]:
        key = (id(m), m.root, path)
        if key not in self._cache:
            self._cache[key] = self._resolve(m, path)
        return self._cache[key]

    def _resolve(self, m: Mount, path: str) -> list[str]:
        where, parts, depth = locate(path, m.root)
        if where == OUTSIDE:
            add_warning(
                self.warnings,
                "outside-mount-root",
                f"cgroup {path!r} is not below the mount root {m.root!r} of {m.mount_point}; "
                "using the mount root's limits",
            )
            return dirs_up(m.mount_point, m.mount_point)
        if where == HIDDEN:
            return self._hidden(m, path, parts, depth)
        return dirs_up(_join(m.mount_point, parts), m.mount_point)

    def _hidden(self, m: Mount, path: str, rest: list[str], depth: int) -> list[str]:
        found, why = find_hidden_group(self.root, m.mount_point, depth, rest, self.pid)
        if found is not None:
            return dirs_up(found, m.mount_point)
        add_warning(
            self.warnings,
            "cgroup-not-found",
            f"cgroup {path!r} is {depth} level(s) below the mount root {m.root!r} of {m.mount_point} "
            f"(a cgroup namespace entered without mounting cgroupfs again), but {why}; "
            "its limits are unknown",
        )
        return []
