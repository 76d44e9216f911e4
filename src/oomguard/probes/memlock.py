"""The memlock section: how much memory this process may page-lock (pin).

RLIMIT_MEMLOCK from ``/proc/self/limits`` (``Max locked memory``; the live system
falls back to getrlimit when /proc is hidden). CAP_IPC_LOCK (CapEff bit 14) lifts
the limit for mlock. ``VmLck``/``VmPin`` say what is locked now. Locked pages are
still charged to the memory cgroup.
"""

from __future__ import annotations

from oomguard.probes.parsers import CAP_IPC_LOCK, has_capability, parse_proc_limits, status_kb
from oomguard.report import MEMLOCK_LOW_BYTES, add_warning
from oomguard.sources.root import Failure, Root
from oomguard.units import format_size_precise

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import MemlockSection, WarningEntry


def _getrlimit() -> tuple[int | None, int | None] | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - Linux always has it
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY
    return (None if soft == inf else soft, None if hard == inf else hard)


def probe_memlock(root: Root, status: dict[str, str], warnings: list[WarningEntry]) -> MemlockSection:
    text = root.read("/proc/self/limits")
    limits = parse_proc_limits(text) if not isinstance(text, Failure) else {}
    values = limits.get("Max locked memory")
    source = "/proc/self/limits"
    if values is None and root.live:
        values, source = _getrlimit(), "getrlimit"
    cap = has_capability(status, CAP_IPC_LOCK)
    section: MemlockSection = {
        "known": values is not None,
        "source": source if values is not None else None,
        "soft_bytes": values[0] if values else None,
        "hard_bytes": values[1] if values else None,
        "cap_ipc_lock": cap,
        "locked_bytes": status_kb(status, "VmLck"),
        "pinned_bytes": status_kb(status, "VmPin"),
        "probe": None,
        "pinned_probe": None,
    }
    if values is None:
        why = text.kind if isinstance(text, Failure) else "no 'Max locked memory' line"
        add_warning(warnings, "memlock-unknown", f"cannot read RLIMIT_MEMLOCK from /proc/self/limits ({why})")
    elif values[0] is not None and values[0] < MEMLOCK_LOW_BYTES and not cap:
        add_warning(
            warnings,
            "memlock-low",
            f"RLIMIT_MEMLOCK soft limit is {format_size_precise(values[0])} and CAP_IPC_LOCK is not held: "
            "mlock(2) and RDMA registration (ibv_reg_mr) above it fail (CUDA's cudaHostAlloc is not charged to it)",
        )
    return section
