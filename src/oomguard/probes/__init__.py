"""``probe()``: read a Root and build the report (without the budget, see ``oomguard.budget``)."""

from __future__ import annotations

from oomguard._version import __version__
from oomguard.probes.cgroup import Locator
from oomguard.probes.container import probe_container
from oomguard.probes.cpu import probe_cpu
from oomguard.probes.gpu import probe_gpus, skipped_driver
from oomguard.probes.memlock import probe_memlock
from oomguard.probes.memory import probe_memory
from oomguard.probes.mounts import CgroupEntry, Mount, parse_mountinfo, parse_proc_cgroup
from oomguard.probes.parsers import parse_int_file, parse_status
from oomguard.report import SCHEMA_VERSION, add_warning
from oomguard.sources.gpu import DEFAULT_TIMEOUT
from oomguard.sources.root import LiveRoot, Root
from oomguard.units import format_size_precise

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    from oomguard._types import Report, WarningEntry

    T = TypeVar("T")

__all__ = ["probe_system"]


def _read_lines(
    root: Root,
    path: str,
    parse: Callable[[str], tuple[list[T], int]],
    *,
    lost: str,
    shape: str,
    warnings: list[WarningEntry],
) -> list[T] | None:
    """Read and parse a line-oriented file (None when unreadable); failures and bad lines warn."""
    text = root.text(path, warnings, lost=lost, missing=True)
    if text is None:
        return None
    items, bad = parse(text)
    if bad:
        add_warning(warnings, "malformed", f"{path}: {bad} line(s) {shape}")
    return items


def _read_layout(root: Root, warnings: list[WarningEntry]) -> tuple[list[CgroupEntry] | None, list[Mount]]:
    """The /proc/self/cgroup entries (None when the file could not be read) and the mounts."""
    entries = _read_lines(
        root,
        "/proc/self/cgroup",
        parse_proc_cgroup,
        lost="cgroup limits cannot be found",
        shape="not of the form id:controllers:/path",
        warnings=warnings,
    )
    mounts = _read_lines(
        root,
        "/proc/self/mountinfo",
        parse_mountinfo,
        lost="cgroup mounts cannot be found",
        shape="could not be parsed",
        warnings=warnings,
    )
    return entries, mounts or []


def _no_cgroup_warning(entries: list[CgroupEntry] | None, warnings: list[WarningEntry]) -> None:
    """cgroups(7), "/proc/[pid]/cgroup": one line per hierarchy the process is a member of.

    With none listed (a kernel without cgroups, or none mounted: the v2 line shows only once
    cgroup2 has been mounted), no limit can be found: say so, as for no memory hierarchy.
    """
    if entries is None:
        return  # the read failure is warned already
    if not entries:
        add_warning(warnings, "no-cgroup", "/proc/self/cgroup lists no cgroup hierarchy; using /proc/meminfo")
    else:
        add_warning(warnings, "no-cgroup", "no mounted cgroup hierarchy for the memory controller; using /proc/meminfo")


def _read_status(root: Root, warnings: list[WarningEntry]) -> dict[str, str]:
    text = root.text("/proc/self/status", warnings, lost="capabilities and locked memory are unknown", missing=True)
    return {} if text is None else parse_status(text)


def _pid(status: dict[str, str]) -> int | None:
    """proc(5), /proc/[pid]/status: ``Pid:`` is the thread group ID, the process's PID."""
    pid = parse_int_file(status.get("Pid", ""))
    return pid if pid else None


def _hidden_limit_warning(report: Report, warnings: list[WarningEntry]) -> None:
    """systemd#19497: a limit above the cgroup namespace root is invisible from inside.

    ``ancestors_visible`` is false when the walk stops at a group that is not the host's root: on
    v2 a namespace root (it has memory.max, or does not list the memory controller), on v1 a
    mount root other than ``/`` without ``hierarchical_memory_limit``. A parent limited below
    what the walk saw (a pod, a slice, a runtime's parent group) then binds unseen: say so
    whether or not a container was detected and whether or not the leaf has a limit of its own.
    """
    mem = report["memory"]
    cg = mem["cgroup"]
    if cg["ancestors_visible"] is not False:
        return
    top = cg["levels"][-1]["dir"] if cg["levels"] else cg["mount"]
    if cg["limit_bytes"] is None:
        seen = "no group up to it has a memory limit"
    else:
        seen = f"the lowest limit up to it is {format_size_precise(cg['limit_bytes'])} ({cg['limit_file']})"
    add_warning(
        warnings,
        "limit-may-be-hidden",
        f"the walk up the v{cg['version']} cgroup tree stops at {top}, the root of this cgroup namespace or "
        f"mount, and {seen}: a lower limit set above it (a pod, a slice, a parent group) cannot be seen from "
        "inside; effective_bytes may be too high",
    )


def probe_system(
    root: Root | None = None,
    env: dict[str, str] | None = None,
    *,
    gpu: bool = True,
    gpu_timeout: float = DEFAULT_TIMEOUT,
) -> Report:
    """Probe *root* (default: the live system) into a report whose ``budget`` is still empty.

    *env* is the probed process's environment (default: ``root.environ()``); *gpu* False
    skips the GPU probe; *gpu_timeout* bounds NVML and nvidia-smi.
    """
    root = root or LiveRoot()
    env = root.environ() if env is None else env
    warnings: list[WarningEntry] = []
    read_entries, mounts = _read_layout(root, warnings)
    entries = read_entries or []
    status = _read_status(root, warnings)
    locator = Locator(root, entries, mounts, _pid(status), warnings)
    mem_h = locator.find("memory")
    if mem_h is None:
        _no_cgroup_warning(read_entries, warnings)
    report: Report = {
        "schema_version": SCHEMA_VERSION,
        "oomguard_version": __version__,
        "root": root.label,
        "memory": probe_memory(root, mem_h, mounts, warnings),
        "memlock": probe_memlock(root, status, warnings),
        "cpu": probe_cpu(root, status, locator.find("cpu"), locator.find("cpuset"), warnings),
        "container": probe_container(root, env, entries, mounts),
        "gpus": [],
        "gpu_driver": skipped_driver(),
        "budget": {"bytes": None, "source": None, "basis_bytes": None, "safety_margin_bytes": None, "requested": None},
        "warnings": warnings,
    }
    report["gpus"], report["gpu_driver"] = probe_gpus(root, env, warnings, enabled=gpu, timeout=gpu_timeout)
    _hidden_limit_warning(report, warnings)
    return report
