"""The CPU section: how many CPUs this process may use.

effective = min(online CPUs, affinity (``Cpus_allowed_list``), cpuset, quota),
where the quota is the smallest ``cpu.max`` (v2) or ``cfs_quota_us / cfs_period_us``
(v1) over the group and its ancestors. A fractional quota stays fractional.

Failures warn as in the memory section: the cgroup is resolved with the same rules and
warnings (``outside-mount-root``, ``cgroup-not-found``: then no quota or cpuset is read), a
file that exists but cannot be read is ``unreadable``, and one without the documented shape
is ``malformed``. A missing file is no warning (cpu and cpuset need not be enabled).
"""

from __future__ import annotations

from oomguard.probes.cgroup import Hierarchy
from oomguard.probes.parsers import MALFORMED, VALUE, parse_cfs, parse_cpu_list, parse_cpu_max
from oomguard.report import add_warning
from oomguard.sources.root import Root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import CpuLimitedBy, CpuSection, WarningEntry


def _quota(root: Root, h: Hierarchy, warnings: list[WarningEntry]) -> float | None:
    best: float | None = None
    for d in h.dirs:
        if h.version == 2:
            t = root.text(d + "/cpu.max", warnings)
            if t is None:
                continue
            status, q = parse_cpu_max(t)
            what = d + "/cpu.max"
        else:
            qt = root.text(d + "/cpu.cfs_quota_us", warnings)
            pt = root.text(d + "/cpu.cfs_period_us", warnings)
            if qt is None or pt is None:
                continue
            status, q = parse_cfs(qt, pt)
            what = d + "/cpu.cfs_quota_us"
        if status == MALFORMED:
            add_warning(warnings, "malformed", f"{what} does not hold a CPU quota; ignored")
        elif status == VALUE and q is not None and (best is None or q < best):
            best = q
    return best


def _cpuset(root: Root, h: Hierarchy, warnings: list[WarningEntry]) -> int | None:
    names = ("cpuset.cpus.effective",) if h.version == 2 else ("cpuset.effective_cpus", "cpuset.cpus")
    for name in names:
        path = h.leaf + "/" + name
        t = root.text(path, warnings)
        if t is None:
            continue
        n = parse_cpu_list(t)
        if n is None and t.strip():  # empty means "inherit" in v2 (cgroup-v2.rst, "cpuset.cpus")
            add_warning(warnings, "malformed", f"{path} holds {t.strip()[:40]!r}, not a CPU list; ignored")
        return n
    return None


def probe_cpu(
    root: Root,
    status: dict[str, str],
    cpu_h: Hierarchy | None,
    cpuset_h: Hierarchy | None,
    warnings: list[WarningEntry],
) -> CpuSection:
    online_text = root.text("/sys/devices/system/cpu/online", warnings)
    online = parse_cpu_list(online_text) if online_text is not None else None
    affinity = parse_cpu_list(status["Cpus_allowed_list"]) if "Cpus_allowed_list" in status else None
    quota = _quota(root, cpu_h, warnings) if cpu_h is not None and cpu_h.found else None
    cpuset = _cpuset(root, cpuset_h, warnings) if cpuset_h is not None and cpuset_h.found else None
    sources: tuple[tuple[float | None, CpuLimitedBy], ...] = (
        (online, "online"),
        (affinity, "affinity"),
        (cpuset, "cpuset"),
        (quota, "quota"),
    )
    candidates = [(float(v), name) for v, name in sources if v is not None]
    effective, limited_by = min(candidates, key=lambda c: c[0]) if candidates else (None, None)
    return {
        "effective_cpus": effective,
        "limited_by": limited_by,
        "online_cpus": online,
        "affinity_cpus": affinity,
        "cpuset_cpus": cpuset,
        "quota_cpus": quota,
    }
