"""The memory section: the hard ceiling, where it comes from, and the numbers around it.

effective = min(MemTotal, every memory limit on the group and its ancestors up to
the mount point, and on v1 ``hierarchical_memory_limit``). A limit at or above
MemTotal does not bind. ``memory.high`` is the soft limit (the practical ceiling
for a budget); ``memory.low``/``memory.min`` are protections, reported, never caps.

available = min over every level of the walk that has a limit of (limit - working set
at that level), and never above MemAvailable. A charge fails at any ancestor that
reaches its limit (cgroup-v2.rst, "memory.max": "If a cgroup's memory usage reaches
this limit and can't be reduced, the OOM killer is invoked in the cgroup"), and an
ancestor's ``memory.current`` counts "the cgroup and its descendants": its other
children too (a Kubernetes pod's other containers, a Slurm job's other steps).
"""

from __future__ import annotations

from oomguard.probes.memcg import Reader, pressure, read_v1, read_v2
from oomguard.probes.mounts import Mount, mount_for
from oomguard.probes.parsers import parse_meminfo, working_set
from oomguard.report import add_warning
from oomguard.sources.root import Root
from oomguard.units import format_size_precise

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import MemorySection, WarningEntry
    from oomguard.probes.cgroup import Hierarchy
    from oomguard.probes.memcg import Charge


def read_meminfo(root: Root, warnings: list[WarningEntry]) -> dict[str, int]:
    text = root.text("/proc/meminfo", warnings, lost="the host's RAM is unknown", missing=True)
    if text is None:
        return {}
    info = parse_meminfo(text)
    if not info.get("MemTotal"):
        add_warning(warnings, "malformed", "/proc/meminfo has no usable MemTotal (lxcfs#389 shows 0); ignored")
        info.pop("MemTotal", None)
        info.pop("MemAvailable", None)  # from the same broken file
    return info


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
        "protection": {"low_bytes": None, "min_bytes": None, "v1_soft_limit_bytes": None},
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
    mem["host_total_bytes"] = info.get("MemTotal")
    mem["host_available_bytes"] = info.get("MemAvailable")
    mem["swap"]["host_total_bytes"] = info.get("SwapTotal")
    if lxcfs_meminfo(mounts):
        mem["meminfo_virtualized"] = True
        add_warning(
            warnings,
            "meminfo-virtualized",
            "/proc/meminfo is an lxcfs mount: MemTotal is the container's limit, not the host's RAM",
        )
    r = Reader(root, warnings)
    charges: list[Charge] = []
    if hierarchy is not None:
        cg = mem["cgroup"]
        cg["version"] = hierarchy.version
        cg["path"] = hierarchy.path
        cg["mount"] = hierarchy.mount.mount_point
        cg["mount_root"] = hierarchy.mount.root
        if hierarchy.found:
            cg["dir"] = hierarchy.leaf
            charges = (read_v2 if hierarchy.version == 2 else read_v1)(r, hierarchy, mem)
    if mem["pressure"] is None:
        psi = r.text("/proc/pressure/memory")
        if psi is not None:
            mem["pressure"] = pressure(psi, "host", "/proc/pressure/memory")
    if hierarchy is not None and not hierarchy.found:
        return mem  # the group's limits are unknown (warning cgroup-not-found): so is the ceiling
    _decide(mem, warnings)
    mem["available_bytes"] = _headroom(mem, charges)
    return mem


def _decide(mem: MemorySection, warnings: list[WarningEntry]) -> None:
    """Pick the binding limit, then derive the working set."""
    host = mem["host_total_bytes"]
    limit = mem["cgroup"]["limit_bytes"]
    version = mem["cgroup"]["version"]
    if limit is not None and host is not None and limit >= host and not mem["meminfo_virtualized"]:
        add_warning(
            warnings,
            "limit-above-host-memory",
            f"the cgroup limit ({format_size_precise(limit)}, {mem['cgroup']['limit_file']}) is not below "
            f"MemTotal ({format_size_precise(host)}); MemTotal binds",
        )
    if limit is not None and (host is None or limit < host):
        mem["effective_bytes"] = limit
        mem["limited_by"] = "cgroup-v2" if version == 2 else "cgroup-v1"
        mem["limit_file"] = mem["cgroup"]["limit_file"]
    elif host is not None:
        mem["effective_bytes"] = host
        mem["limited_by"] = "meminfo"
        mem["limit_file"] = "/proc/meminfo:MemTotal"
    usage = mem["usage_bytes"]
    mem["working_set_bytes"] = working_set(usage, mem["inactive_file_bytes"])
    limit = mem["effective_bytes"]
    if usage is not None and limit is not None and usage > limit and mem["limited_by"] != "meminfo":
        add_warning(
            warnings,
            "usage-above-limit",
            f"usage ({format_size_precise(usage)}) is above the limit ({format_size_precise(limit)})",
        )


def _headroom(mem: MemorySection, charges: list[Charge]) -> int | None:
    """min(effective - working set, limit - working set at every limited level, MemAvailable).

    A level whose usage cannot be read still counts through the first term: its usage is at
    least the group's own (hierarchical), and its limit at least the effective one.
    """
    ws = mem["working_set_bytes"]
    if mem["limited_by"] not in (None, "meminfo") and ws is None:
        return None  # headroom under a cgroup limit needs the group's usage
    candidates = [max(0, limit - level_ws) for _, limit, level_ws in charges if level_ws is not None]
    if mem["effective_bytes"] is not None and ws is not None:
        candidates.append(max(0, mem["effective_bytes"] - ws))
    if mem["host_available_bytes"] is not None:
        candidates.append(mem["host_available_bytes"])
    return min(candidates) if candidates else None
