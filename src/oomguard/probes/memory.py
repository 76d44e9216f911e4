"""The memory section: the hard ceiling, where it comes from, and the numbers around it.

effective = min(MemTotal, every memory limit on the group and its ancestors up to
the mount point, and on v1 ``hierarchical_memory_limit``). A limit at or above
MemTotal does not bind. ``memory.high`` is the soft limit (the practical ceiling
for a budget); ``memory.low``/``memory.min`` are protections, reported, never caps.
"""

from __future__ import annotations

from oomguard.probes.cgroup import Hierarchy
from oomguard.probes.mounts import Mount, mount_for
from oomguard.probes.parsers import (
    MALFORMED,
    UNLIMITED,
    VALUE,
    parse_flat_keyed,
    parse_int_file,
    parse_limit,
    parse_meminfo,
    parse_pressure,
)
from oomguard.report import add_warning, warn_failure
from oomguard.sources.root import Failure, Root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import CgroupLevel, MemorySection, WarningEntry


class _Reader:
    """Reads cgroup files of one hierarchy, turning failures into warnings."""

    def __init__(self, root: Root, warnings: list[WarningEntry]) -> None:
        self.root = root
        self.warnings = warnings
        self._cache: dict[str, str | None] = {}  # each file is read once per probe

    def text(self, path: str) -> str | None:
        if path in self._cache:
            return self._cache[path]
        t = self.root.read(path)
        if isinstance(t, Failure):
            if t.kind != "missing":
                warn_failure(self.warnings, t, "its value is ignored")
            self._cache[path] = None
            return None
        self._cache[path] = t
        return t

    def limit(self, path: str) -> tuple[str, int | None]:
        """("value", n), ("unlimited", None), ("absent", None) or ("malformed", None)."""
        t = self.text(path)
        if t is None:
            return "absent", None
        status, n = parse_limit(t)
        if status == MALFORMED:
            add_warning(self.warnings, "malformed", f"{path} holds {t.strip()[:40]!r}, not a size or 'max'; ignored")
        return status, n

    def min_limit(self, paths: list[str]) -> tuple[int | None, str | None, bool]:
        """Smallest value over *paths*: (value, its file, whether any file was seen)."""
        best: int | None = None
        where: str | None = None
        seen = False
        for p in paths:
            status, n = self.limit(p)
            seen = seen or status in (VALUE, UNLIMITED)
            if n is not None and (best is None or n < best):
                best, where = n, p
        return best, where, seen


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def read_meminfo(root: Root, warnings: list[WarningEntry]) -> dict[str, int]:
    text = root.read("/proc/meminfo")
    if isinstance(text, Failure):
        warn_failure(warnings, text, "the host's RAM is unknown")
        return {}
    info = parse_meminfo(text)
    if not info.get("MemTotal"):
        add_warning(warnings, "malformed", "/proc/meminfo has no usable MemTotal (lxcfs#389 shows 0); ignored")
        info.pop("MemTotal", None)
        info.pop("MemAvailable", None)  # from the same broken file
    return info


def _levels_v2(r: _Reader, h: Hierarchy) -> list[CgroupLevel]:
    levels: list[CgroupLevel] = []
    for d in h.dirs:
        levels.append(
            {
                "dir": d,
                "max_bytes": r.limit(d + "/memory.max")[1],
                "high_bytes": r.limit(d + "/memory.high")[1],
            }
        )
    return levels


def _v2(r: _Reader, h: Hierarchy, mem: MemorySection) -> None:
    leaf = h.leaf
    controllers = r.text(leaf + "/cgroup.controllers")
    max_paths = [d + "/memory.max" for d in h.dirs]
    limit, where, _ = r.min_limit(max_paths)
    if controllers is not None and "memory" not in controllers.split():
        add_warning(
            r.warnings,
            "controller-not-enabled",
            f"{leaf}/cgroup.controllers does not list memory: this group's usage, events and pressure "
            "cannot be read (limits of its ancestors still apply)",
        )
    # The top of the walk is the host's root cgroup only if it has no memory.max and lists
    # the memory controller; otherwise it is a namespace root with ancestors we cannot see.
    top = h.dirs[-1]
    top_controllers = r.text(top + "/cgroup.controllers")
    below_root = r.limit(top + "/memory.max")[0] != "absent" or (
        top_controllers is not None and "memory" not in top_controllers.split()
    )
    mem["cgroup"]["ancestors_visible"] = not below_root
    mem["cgroup"]["levels"] = _levels_v2(r, h)
    mem["cgroup"]["limit_bytes"] = limit
    mem["cgroup"]["limit_file"] = where
    high, high_where, _ = r.min_limit([d + "/memory.high" for d in h.dirs])
    mem["soft_limit_bytes"] = high
    mem["soft_limit_file"] = high_where
    swap, _, swap_seen = r.min_limit([d + "/memory.swap.max" for d in h.dirs])
    mem["swap"]["limit_bytes"] = swap
    mem["swap"]["known"] = swap_seen
    _v2_usage(r, leaf, mem)


def _v2_usage(r: _Reader, leaf: str, mem: MemorySection) -> None:
    """The leaf's usage, page cache, protections, OOM events and pressure (cgroup-v2.rst, "Memory")."""
    cur = r.text(leaf + "/memory.current")
    mem["usage_bytes"] = parse_int_file(cur) if cur is not None else None
    swap_cur = r.text(leaf + "/memory.swap.current")
    mem["swap"]["usage_bytes"] = parse_int_file(swap_cur) if swap_cur is not None else None
    stat = parse_flat_keyed(r.text(leaf + "/memory.stat") or "")
    mem["inactive_file_bytes"] = stat.get("inactive_file")
    mem["shmem_bytes"] = stat.get("shmem")
    mem["protection"] = {
        "low_bytes": r.limit(leaf + "/memory.low")[1],
        "min_bytes": r.limit(leaf + "/memory.min")[1],
    }
    events = r.text(leaf + "/memory.events")
    if events is not None:
        ev = parse_flat_keyed(events)
        mem["oom"] = {
            "source": leaf + "/memory.events",
            "oom": ev.get("oom"),
            "oom_kill": ev.get("oom_kill"),
            "oom_group_kill": ev.get("oom_group_kill"),
        }
    psi = r.text(leaf + "/memory.pressure")
    if psi is not None:
        mem["pressure"] = _pressure(psi, "cgroup", leaf + "/memory.pressure")


def _v1(r: _Reader, h: Hierarchy, mem: MemorySection) -> None:
    leaf = h.leaf
    levels: list[CgroupLevel] = []
    for d in h.dirs:
        levels.append({"dir": d, "max_bytes": r.limit(d + "/memory.limit_in_bytes")[1], "high_bytes": None})
    mem["cgroup"]["levels"] = levels
    limit, where, _ = r.min_limit([d + "/memory.limit_in_bytes" for d in h.dirs])
    stat_text = r.text(leaf + "/memory.stat")
    stat = parse_flat_keyed(stat_text or "")
    # hierarchical_memory_limit folds in ancestors above the mount root too.
    hier = stat.get("hierarchical_memory_limit")
    status, hier_value = parse_limit(str(hier)) if hier is not None else ("absent", None)
    if status == VALUE and hier_value is not None and (limit is None or hier_value < limit):
        limit, where = hier_value, leaf + "/memory.stat:hierarchical_memory_limit"
    mem["cgroup"]["limit_bytes"] = limit
    mem["cgroup"]["limit_file"] = where
    mem["cgroup"]["ancestors_visible"] = hier is not None or h.mount.root == "/"
    mem["soft_limit_bytes"] = None
    memsw, _, memsw_seen = r.min_limit([d + "/memory.memsw.limit_in_bytes" for d in h.dirs])
    hier_sw = stat.get("hierarchical_memsw_limit")
    if hier_sw is not None:
        s, v = parse_limit(str(hier_sw))
        memsw = _min(memsw, v if s == VALUE else None)
    mem["swap"]["memsw_limit_bytes"] = memsw
    mem["swap"]["known"] = memsw_seen
    if memsw is not None and limit is not None:
        mem["swap"]["limit_bytes"] = max(0, memsw - limit)
    usage = r.text(leaf + "/memory.usage_in_bytes")
    mem["usage_bytes"] = parse_int_file(usage) if usage is not None else None
    mem["inactive_file_bytes"] = stat.get("total_inactive_file", stat.get("inactive_file"))
    mem["shmem_bytes"] = stat.get("total_shmem", stat.get("shmem"))
    oom = r.text(leaf + "/memory.oom_control")
    if oom is not None:
        ev = parse_flat_keyed(oom)
        mem["oom"] = {
            "source": leaf + "/memory.oom_control",
            "oom": None,
            "oom_kill": ev.get("oom_kill"),
            "oom_group_kill": None,
        }


def _pressure(text: str, source: str, path: str) -> dict[str, object] | None:
    psi = parse_pressure(text)
    if not psi:
        return None
    return {"source": source, "file": path, "some": psi.get("some"), "full": psi.get("full")}


def lxcfs_meminfo(mounts: list[Mount]) -> bool:
    m = mount_for(mounts, "/proc/meminfo")
    return m is not None and "lxcfs" in m.fstype


def empty_memory_section() -> MemorySection:
    return {
        "effective_bytes": None,
        "limited_by": None,
        "limit_file": None,
        "host_total_bytes": None,
        "host_available_bytes": None,
        "meminfo_virtualized": False,
        "soft_limit_bytes": None,
        "soft_limit_file": None,
        "usage_bytes": None,
        "working_set_bytes": None,
        "inactive_file_bytes": None,
        "shmem_bytes": None,
        "available_bytes": None,
        "swap": {
            "limit_bytes": None,
            "memsw_limit_bytes": None,
            "known": False,
            "usage_bytes": None,
            "host_total_bytes": None,
        },
        "protection": {"low_bytes": None, "min_bytes": None},
        "pressure": None,
        "oom": None,
        "cgroup": {
            "version": None,
            "path": None,
            "mount": None,
            "mount_root": None,
            "dir": None,
            "limit_bytes": None,
            "limit_file": None,
            "ancestors_visible": None,
            "levels": [],
        },
    }


def probe_memory(
    root: Root,
    hierarchy: Hierarchy | None,
    mounts: list[Mount],
    warnings: list[WarningEntry],
) -> MemorySection:
    mem = empty_memory_section()
    info = read_meminfo(root, warnings)
    host_total = info.get("MemTotal")
    mem["host_total_bytes"] = host_total
    mem["host_available_bytes"] = info.get("MemAvailable")
    mem["swap"]["host_total_bytes"] = info.get("SwapTotal")
    if lxcfs_meminfo(mounts):
        mem["meminfo_virtualized"] = True
        add_warning(
            warnings,
            "meminfo-virtualized",
            "/proc/meminfo is an lxcfs mount: MemTotal is the container's limit, not the host's RAM",
        )
    r = _Reader(root, warnings)
    if hierarchy is not None:
        cg = mem["cgroup"]
        cg["version"] = hierarchy.version
        cg["path"] = hierarchy.path
        cg["mount"] = hierarchy.mount.mount_point
        cg["mount_root"] = hierarchy.mount.root
        cg["dir"] = hierarchy.leaf
        (_v2 if hierarchy.version == 2 else _v1)(r, hierarchy, mem)
    if mem["pressure"] is None:
        psi = r.text("/proc/pressure/memory")
        if psi is not None:
            mem["pressure"] = _pressure(psi, "host", "/proc/pressure/memory")
    _decide(mem, warnings)
    return mem


def _decide(mem: MemorySection, warnings: list[WarningEntry]) -> None:
    """Pick the binding limit, then derive working set and headroom."""
    host = mem["host_total_bytes"]
    limit = mem["cgroup"]["limit_bytes"]
    version = mem["cgroup"]["version"]
    if limit is not None and host is not None and limit >= host and not mem["meminfo_virtualized"]:
        add_warning(
            warnings,
            "limit-above-host-memory",
            f"the cgroup limit ({limit} bytes, {mem['cgroup']['limit_file']}) is not below "
            f"MemTotal ({host} bytes); MemTotal binds",
        )
    if limit is not None and (host is None or limit < host):
        mem["effective_bytes"] = limit
        mem["limited_by"] = f"cgroup-v{version}"
        mem["limit_file"] = mem["cgroup"]["limit_file"]
    elif host is not None:
        mem["effective_bytes"] = host
        mem["limited_by"] = "meminfo"
        mem["limit_file"] = "/proc/meminfo:MemTotal"
    usage = mem["usage_bytes"]
    if usage is not None:
        mem["working_set_bytes"] = max(0, usage - (mem["inactive_file_bytes"] or 0))
        if mem["effective_bytes"] is not None and usage > mem["effective_bytes"] and mem["limited_by"] != "meminfo":
            add_warning(
                warnings,
                "usage-above-limit",
                f"usage ({usage} bytes) is above the limit ({mem['effective_bytes']} bytes)",
            )
    # Headroom under a cgroup limit needs the group's usage: unknown usage, unknown headroom.
    cgroup_binds = mem["limited_by"] not in (None, "meminfo")
    if cgroup_binds and mem["working_set_bytes"] is None:
        mem["available_bytes"] = None
        return
    candidates = []
    if mem["effective_bytes"] is not None and mem["working_set_bytes"] is not None:
        candidates.append(max(0, mem["effective_bytes"] - mem["working_set_bytes"]))
    if mem["host_available_bytes"] is not None:
        candidates.append(mem["host_available_bytes"])
    mem["available_bytes"] = min(candidates) if candidates else None
