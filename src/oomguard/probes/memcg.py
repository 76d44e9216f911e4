"""The memory cgroup files of one hierarchy: limits over the walk, usage, events, pressure.

Documentation/admin-guide/cgroup-v2.rst, "Memory Interface Files" (v2) and
Documentation/admin-guide/cgroup-v1/memory.rst (v1). Each reader fills the cgroup part of
the memory section and returns the *charges*: (directory, limit, working set there) for every
level of the walk that has a limit. "memory.current: the total amount of memory currently
being used by the cgroup and its descendants", and a charge fails at whichever ancestor
reaches its limit first, so the headroom is the smallest (limit - usage) over those levels.
"""

from __future__ import annotations

from oomguard.probes.cgroup import Hierarchy
from oomguard.probes.parsers import (
    MALFORMED,
    UNLIMITED,
    VALUE,
    inactive_file,
    parse_flat_keyed,
    parse_int_file,
    parse_limit,
    working_set,
)
from oomguard.probes.parsers import parse_pressure as _parse_pressure
from oomguard.report import add_warning
from oomguard.sources.root import Root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import CgroupLevel, MemorySection, WarningEntry

    Charge = tuple[str, int, int | None]  # (dir, limit, working set of that dir or None)


class Reader:
    """Reads cgroup files of one hierarchy, turning failures into warnings."""

    def __init__(self, root: Root, warnings: list[WarningEntry]) -> None:
        self.root = root
        self.warnings = warnings
        self._cache: dict[str, str | None] = {}  # each file is read once per probe

    def text(self, path: str) -> str | None:
        if path in self._cache:
            return self._cache[path]
        self._cache[path] = t = self.root.text(path, self.warnings)
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

    def inactive_file(self, d: str, version: int) -> int | None:
        """inactive_file of *d*'s memory.stat (``parsers.INACTIVE_FILE_KEYS``); None without one."""
        return inactive_file(parse_flat_keyed(self.text(f"{d}/memory.stat") or ""), version)


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _charges(r: Reader, levels: list[CgroupLevel], usage_file: str, version: int) -> list[Charge]:
    """(dir, limit, working set) of every limited level: usage - inactive_file there.

    memory.stat counts descendants (v2 always; v1 in its ``total_`` keys), so a level's
    inactive_file is at least the group's own: where a level has no memory.stat, the group's
    is used, which never makes the headroom larger than it is.
    """
    leaf_inactive = (r.inactive_file(levels[0]["dir"], version) or 0) if levels else 0
    out: list[Charge] = []
    for lv in levels:
        limit = lv["max_bytes"]
        if limit is None:
            continue
        cur = r.text(f"{lv['dir']}/{usage_file}")
        usage = parse_int_file(cur) if cur is not None else None
        inactive = r.inactive_file(lv["dir"], version)
        ws = working_set(usage, leaf_inactive if inactive is None else inactive)
        out.append((lv["dir"], limit, ws))
    return out


def read_v2(r: Reader, h: Hierarchy, mem: MemorySection) -> list[Charge]:
    leaf = h.leaf
    controllers = r.text(leaf + "/cgroup.controllers")
    levels: list[CgroupLevel] = [
        {"dir": d, "max_bytes": r.limit(d + "/memory.max")[1], "high_bytes": r.limit(d + "/memory.high")[1]}
        for d in h.dirs
    ]
    limit, where, _ = r.min_limit([d + "/memory.max" for d in h.dirs])
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
    cg = mem["cgroup"]
    cg["ancestors_visible"] = not below_root
    cg["levels"] = levels
    cg["limit_bytes"], cg["limit_file"] = limit, where
    mem["soft_limit_bytes"], mem["soft_limit_file"], _ = r.min_limit([d + "/memory.high" for d in h.dirs])
    swap, _, swap_seen = r.min_limit([d + "/memory.swap.max" for d in h.dirs])
    mem["swap"]["limit_bytes"] = swap
    mem["swap"]["known"] = swap_seen
    _v2_usage(r, leaf, mem)
    return _charges(r, levels, "memory.current", 2)


def _v2_usage(r: Reader, leaf: str, mem: MemorySection) -> None:
    """The leaf's usage, page cache, protections, OOM events and pressure (cgroup-v2.rst, "Memory")."""
    cur = r.text(leaf + "/memory.current")
    mem["usage_bytes"] = parse_int_file(cur) if cur is not None else None
    swap_cur = r.text(leaf + "/memory.swap.current")
    mem["swap"]["usage_bytes"] = parse_int_file(swap_cur) if swap_cur is not None else None
    stat = parse_flat_keyed(r.text(leaf + "/memory.stat") or "")
    mem["inactive_file_bytes"] = inactive_file(stat, 2)
    mem["shmem_bytes"] = stat.get("shmem")
    # Protections, never caps (cgroup-v2.rst 3-3 "Protections": "A cgroup is protected up to the
    # configured amount of the resource"; 5-2-1 "memory.low": "Best-effort memory protection"): what
    # reclaim leaves the group, not what it may use. v1's soft limit is not on this hierarchy.
    mem["protection"] = {
        "low_bytes": r.limit(leaf + "/memory.low")[1],
        "min_bytes": r.limit(leaf + "/memory.min")[1],
        "v1_soft_limit_bytes": None,
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
        mem["pressure"] = pressure(psi, "cgroup", leaf + "/memory.pressure")


def read_v1(r: Reader, h: Hierarchy, mem: MemorySection) -> list[Charge]:
    leaf = h.leaf
    levels: list[CgroupLevel] = [
        {"dir": d, "max_bytes": r.limit(d + "/memory.limit_in_bytes")[1], "high_bytes": None} for d in h.dirs
    ]
    mem["cgroup"]["levels"] = levels
    limit, where, _ = r.min_limit([d + "/memory.limit_in_bytes" for d in h.dirs])
    stat = parse_flat_keyed(r.text(leaf + "/memory.stat") or "")
    # hierarchical_memory_limit folds in ancestors above the mount root too.
    hier = stat.get("hierarchical_memory_limit")
    status, hier_value = parse_limit(str(hier)) if hier is not None else ("absent", None)
    if status == VALUE and hier_value is not None and (limit is None or hier_value < limit):
        limit, where = hier_value, leaf + "/memory.stat:hierarchical_memory_limit"
    mem["cgroup"]["limit_bytes"] = limit
    mem["cgroup"]["limit_file"] = where
    mem["cgroup"]["ancestors_visible"] = hier is not None or h.mount.root == "/"
    mem["soft_limit_bytes"] = None  # v2 memory.high, a throttle line: v1 has none
    # v1 memory.soft_limit_in_bytes is a reclaim target, not a cap (cgroup-v1/memory.rst §7 "Soft
    # limits": "When the system detects memory contention or low memory, control groups are pushed
    # back to their soft limits"; "A soft limit ... can be exceeded"), like v2's memory.low: reported
    # with the protections, never a basis of the budget. LONG_MAX (page-rounded) is unlimited: null.
    mem["protection"]["v1_soft_limit_bytes"] = r.limit(leaf + "/memory.soft_limit_in_bytes")[1]
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
    mem["inactive_file_bytes"] = inactive_file(stat, 1)
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
    return _charges(r, levels, "memory.usage_in_bytes", 1)


def pressure(text: str, source: str, path: str) -> dict[str, object] | None:
    psi = _parse_pressure(text)
    if not psi:
        return None
    return {"source": source, "file": path, "some": psi.get("some"), "full": psi.get("full")}
