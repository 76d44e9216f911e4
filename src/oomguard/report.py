"""The Report contract: schema version, warning codes, and helpers to add warnings.

A report is plain JSON data (dicts, lists, str, int, float, bool, None), described
field by field in ``schema.json`` beside this file and in docs/report.md; the
``Report`` TypedDict in ``oomguard._types`` gives it static types. Plain data keeps
``oomguard check`` free of heavy imports (see docs/architecture.md).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs more than the probe

if TYPE_CHECKING:
    from oomguard._types import WarningEntry
    from oomguard.sources.root import Failure

SCHEMA_VERSION = 1

# Stable warning codes. Add new ones at the end; never change a code's meaning.
WARNING_CODES: dict[str, str] = {
    "limit-may-be-hidden": "The walk up the cgroup tree stops at a cgroup namespace (or mount) root whose "
    "ancestors are out of view (memory.cgroup.ancestors_visible false): a lower limit set above it (pod level, "
    "host slice, a runtime's parent group) cannot be seen from inside, whether or not the group has a limit.",
    "unreadable": "A file the probe needs exists but could not be read (permissions, hidepid, I/O error).",
    "missing": "A file the probe needs does not exist (e.g. /proc/meminfo in a snapshot).",
    "malformed": "A file's contents do not have the documented shape; its value was ignored.",
    "outside-mount-root": "The process's cgroup is not below the root of the mounted cgroup tree; "
    "the limits of the mount root were used instead.",
    "no-cgroup": "No mounted cgroup hierarchy carries the memory controller; only /proc/meminfo was used.",
    "controller-not-enabled": "The process's v2 cgroup does not list the memory controller in cgroup.controllers.",
    "limit-above-host-memory": "A cgroup memory limit is set at or above the host's RAM (MemTotal), so it never binds.",
    "usage-above-limit": "Memory usage is above the limit (possible right after a limit was lowered).",
    "meminfo-virtualized": "/proc/meminfo is virtualised by lxcfs: MemTotal already is the container's limit.",
    "memlock-unknown": "The locked-memory limit (RLIMIT_MEMLOCK) could not be read.",
    "memlock-low": "RLIMIT_MEMLOCK soft limit is under 64 MiB and CAP_IPC_LOCK is not held: "
    "mlock(2) and RDMA registration (ibv_reg_mr) of larger buffers fail. CUDA's cudaHostAlloc is not charged "
    "to RLIMIT_MEMLOCK (it is charged to the memory cgroup), so this does not stop a prover that pins through CUDA.",
    "budget-exceeds-limit": "The explicit budget is above the hard ceiling (memory.effective_bytes).",
    "budget-exceeds-soft-limit": "The explicit budget is above the soft limit (memory.high), "
    "where the kernel throttles and reclaims.",
    "budget-unknown": "No budget could be computed because the memory ceiling is unknown.",
    "gpu-not-probed": "plan: --gpu-per-job was given but the GPU probe was skipped (--no-gpu) "
    "or failed; the GPU constraint is ignored.",
    "gpu-probe-failed": "An NVIDIA driver is present but neither NVML nor nvidia-smi answered usefully "
    "(missing, hanging, failing, or garbage output); gpus may be incomplete.",
    "memlock-too-low": "plan: the pinned memory the plan needs exceeds what RLIMIT_MEMLOCK lets this "
    "process lock (without CAP_IPC_LOCK): pinning will fail.",
    "pinned-counts-against-limit": "plan: the jobs pin host memory; page-locked memory is charged to the "
    "memory cgroup like any other, so it must be part of each job's --per-job size.",
    "gpu-order-ambiguous": "CUDA_VISIBLE_DEVICES picks GPUs by index while CUDA_DEVICE_ORDER is not PCI_BUS_ID, "
    "and the GPUs differ: CUDA's index may name another GPU than the driver's index in gpus.",
    "cgroup-not-found": "The process's cgroup lies below the mounted cgroup tree's root, in a cgroup namespace "
    "entered without mounting cgroupfs again, and no single group's cgroup.procs lists this process: "
    "its limits are unknown (memory.effective_bytes is null).",
    "budget-too-small": "The budget cannot work: it is 0, or (with a plan) below the baseline plus one job; "
    "oomguard run does not start a worker with it.",
    "oom-kills-seen": "The memory cgroup's oom_kill counter is above 0: processes in this group were "
    "OOM-killed since it was made.",
    "pin-probe-failed": "check --probe-mlock / --probe-pinned: the child could not page-lock the size asked "
    "for (mlock or cudaHostAlloc failed): pinning that much will fail for the worker too.",
    "cuzk-no-partition": "A CuZK profile's plan: the budget, given to CuZK as its total_budget, holds not "
    "even its SRS + PCE and one partition, so CuZK's budget.acquire waits for ever and no proof starts.",
}

MEMLOCK_LOW_BYTES = 64 * 1024 * 1024


def add_warning(warnings: list[WarningEntry], code: str, message: str) -> None:
    """Append ``{code, message}`` unless the same warning is already there."""
    assert code in WARNING_CODES, code
    entry: WarningEntry = {"code": code, "message": message}
    if entry not in warnings:
        warnings.append(entry)


def warn_failure(warnings: list[WarningEntry], failure: Failure, what: str) -> None:
    """Turn a failed read into an ``unreadable`` or ``missing`` warning."""
    if failure.kind == "missing":
        add_warning(warnings, "missing", f"{failure.path} does not exist; {what}")
    else:
        detail = f" ({failure.detail})" if failure.detail else ""
        add_warning(warnings, "unreadable", f"cannot read {failure.path}{detail}; {what}")
