"""Which cgroup this process is in, for a controller, and the directories to read.

Rules (docs/architecture.md, "Detection rules", has the sources):
- find the group through /proc/self/cgroup and /proc/self/mountinfo, never fixed paths;
- a controller comes from cgroup v1 only when /proc/self/cgroup lists it in a v1
  hierarchy that is also mounted (hybrid hosts keep memory in v1 while a cgroup2
  sits at /sys/fs/cgroup/unified); otherwise from the cgroup2 mount, if any;
- the group's directory is mount point + (path relative to the mount's root);
  a v1 Docker mount has root == path, so the limit sits at the mount point;
- a path outside the mount root (``0::/../x``, or a v1 path not under the root,
  JDK-8343191) falls back to the mount root with warning ``outside-mount-root``;
- the walk goes from the group up to the mount point: ancestors' limits apply too.
"""

from __future__ import annotations

from oomguard.probes.mounts import CgroupEntry, Mount
from oomguard.report import add_warning

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import WarningEntry

CGROUP_FS_ROOT = "/sys/fs/cgroup"


class Hierarchy:
    """A resolved cgroup for one controller: version, mount, path and the directories to read."""

    __slots__ = ("dirs", "mount", "path", "version")

    def __init__(self, version: int, mount: Mount, path: str, dirs: list[str]) -> None:
        self.version = version
        self.mount = mount
        self.path = path  # as in /proc/self/cgroup
        self.dirs = dirs  # leaf first, mount point last

    @property
    def leaf(self) -> str:
        return self.dirs[0]


def _rank_mount(m: Mount, path: str) -> tuple[int, int]:
    """Prefer mounts under /sys/fs/cgroup, then ones whose root contains *path*."""
    under_sys = m.mount_point == CGROUP_FS_ROOT or m.mount_point.startswith(CGROUP_FS_ROOT + "/")
    root_matches = m.root in ("/", path) or path.startswith(m.root.rstrip("/") + "/")
    return (1 if under_sys else 0, 1 if root_matches else 0)


def _pick(mounts: list[Mount], path: str) -> Mount | None:
    best: Mount | None = None
    best_rank = (-1, -1)
    for m in mounts:
        rank = _rank_mount(m, path)
        if rank > best_rank:  # first of equals wins
            best, best_rank = m, rank
    return best


def _relative(path: str, mount_root: str) -> str | None:
    """*path* relative to *mount_root* ("" for the root itself); None when outside it."""
    parts = path.split("/")
    if ".." in parts:
        return None
    if mount_root == "/":
        return path.rstrip("/")
    root = mount_root.rstrip("/")
    if path == root:
        return ""
    if path.startswith(root + "/"):
        return path[len(root) :].rstrip("/")
    return None


def _dirs(mount_point: str, rel: str) -> list[str]:
    dirs = []
    parts = [p for p in rel.split("/") if p]
    for i in range(len(parts), -1, -1):
        dirs.append("/".join([mount_point.rstrip("/") or "", *parts[:i]]) or "/")
    return dirs


def find_hierarchy(
    entries: list[CgroupEntry],
    mounts: list[Mount],
    controller: str,
    warnings: list[WarningEntry],
) -> Hierarchy | None:
    """Resolve *controller* ("memory", "cpu", "cpuset") to a v1 or v2 hierarchy, or None."""
    for e in entries:
        if e.hierarchy_id != "0" and controller in e.controllers:
            v1 = [m for m in mounts if m.fstype == "cgroup" and controller in m.options()]
            m = _pick(v1, e.path)
            if m is not None:
                return _resolve(1, m, e.path, controller, warnings)
    for e in entries:
        if e.hierarchy_id == "0" and not e.controllers:
            m = _pick([m for m in mounts if m.fstype == "cgroup2"], e.path)
            if m is not None:
                return _resolve(2, m, e.path, controller, warnings)
    return None


def _resolve(version: int, m: Mount, path: str, controller: str, warnings: list[WarningEntry]) -> Hierarchy:
    rel = _relative(path, m.root)
    if rel is None:
        add_warning(
            warnings,
            "outside-mount-root",
            f"cgroup {path!r} ({controller}) is not below the mount root {m.root!r} of "
            f"{m.mount_point}; using the mount root's limits",
        )
        rel = ""
    return Hierarchy(version, m, path, _dirs(m.mount_point, rel))
