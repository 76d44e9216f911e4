"""How many jobs fit: the planner (pure arithmetic over a report and a job shape).

capacity per constraint (null when the constraint does not apply):
- memory:   floor((budget - baseline) / per_job), 0 when the baseline alone does not fit
- memlock:  only for pinned memory whose pin method RLIMIT_MEMLOCK charges (``mlock``, ``rdma``;
            see PIN_METHODS): 0 when the pinned baseline alone is above the memlock soft limit;
            else floor((memlock soft limit - pinned baseline) / pinned_per_job) with
            --pinned-per-job (null without it); null when CAP_IPC_LOCK is held, the limit is
            unlimited, or the memory is pinned through CUDA (``cuda``).
- gpu:      device memory per job on each visible GPU (applies once the GPU probe exists)
- max_jobs: the cap given
- cpu:      floor(effective CPUs / cpus_per_job + 1e-9), only with --cpus-per-job (the
            epsilon absorbs binary rounding: a 0.7-CPU quota / 0.1 per job is 6.999..., 7 jobs)
concurrency = the smallest capacity; binding = the constraint that gives it (on a tie,
the first in the order above).
"""

from __future__ import annotations

from oomguard.errors import BadParameter
from oomguard.policy import cuzk
from oomguard.report import add_warning
from oomguard.units import format_size

# A shape's cpus_per_job (--cpus-per-job, a profile's): a millicore (Kubernetes' smallest CPU unit)
# at least, so that CPUs / cpus_per_job stays a finite number of jobs, and at most a million CPUs.
CPUS_MIN = 0.001
CPUS_MAX = 1e6

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import PinMethod, Plan, PlanCapacity, PlanCuzk, PlanShape, Report, WarningEntry

CONSTRAINTS = ("memory", "memlock", "gpu", "max_jobs", "cpu")
# CPU quotas are fractions (cgroup-v2.rst "cpu.max": "$MAX $PERIOD", so "70000 100000" is 0.7):
# a float quotient that should be a whole number may fall just below it (0.7 / 0.1 ==
# 6.999999999999999). Any quotient within CPU_EPSILON below a whole number counts as that
# number: 1e-9 is far above the error of one float division at these magnitudes (~1e-15) and
# far below a quota's own resolution (microseconds per period: 1e-5 CPU at the default 100 ms).
CPU_EPSILON = 1e-9
SHAPE_FIELDS = (
    "per_job",
    "baseline",
    "pinned_per_job",
    "pinned_baseline",
    "pin_method",
    "gpu_per_job",
    "max_jobs",
    "cpus_per_job",
)
# How a shape's pinned memory is pinned decides which limit can refuse it:
# - "mlock": mlock(2)/mlockall(2). mm/mlock.c: do_mlock() and do_mlockall() fail with ENOMEM
#   when the locked pages would pass RLIMIT_MEMLOCK "&& !capable(CAP_IPC_LOCK)"; setrlimit(2):
#   RLIMIT_MEMLOCK is "the maximum number of bytes of memory that may be locked into RAM".
# - "rdma": ibv_reg_mr(3). drivers/infiniband/core/umem.c: ib_umem_get() adds the pages to
#   mm->pinned_vm and fails with ENOMEM past RLIMIT_MEMLOCK unless capable(CAP_IPC_LOCK); the
#   pages are pinned with pin_user_pages_fast(FOLL_LONGTERM) (mm/gup.c), which itself charges no
#   rlimit: the caller does (openucx/ucx#7930 is the same limit seen from UCX).
# - "cuda": cudaHostAlloc / cudaHostRegister. Not charged to RLIMIT_MEMLOCK: 4 GiB of PyTorch
#   pin_memory (cudaHostAlloc) on an L4 with driver 570.195.03 added 4 GiB to RssShmem and to the
#   memory cgroup's shmem while VmLck stayed flat (MakazhanAlpamys/Soup#655); NVIDIA's open kernel
#   modules pin cudaHostRegister memory with get_user_pages in os_lock_user_pages()
#   (kernel-open/nvidia/os-mlock.c) without an rlimit check. That measurement is not repeated
#   here (no GPU on this project's machines): ``check --probe-pinned`` and bench/gpu_check.sh
#   record VmLck, RssShmem and the cgroup's shmem around a real cudaHostAlloc where one exists.
#   The memory is charged to the memory cgroup, so it is part of the budget, never of memlock.
PIN_METHODS: tuple[PinMethod, ...] = ("cuda", "mlock", "rdma")
MEMLOCK_METHODS = frozenset({"mlock", "rdma"})
DEFAULT_PIN_METHOD = "mlock"  # hand-given --pinned-* flags keep their old meaning


CONSUMERS = (cuzk.CONSUMER,)  # whose own budget arithmetic a profile may name (``consumer``)


class Shape:
    """A job shape: sizes in bytes; None where not given.

    Pinned memory is part of the memory it pins: the baseline used is max(baseline,
    pinned_baseline), and the per-job size max(per_job, pinned_per_job). ``raised`` says, in
    words, which of the two was raised (empty when neither). ``consumer`` names a program whose
    own budget arithmetic the plan also shows (``"cuzk"``: policy/cuzk.py), or None.
    """

    __slots__ = (*SHAPE_FIELDS, "profile", "consumer", "raised")

    def __init__(
        self,
        per_job: int,
        baseline: int = 0,
        *,
        pinned_per_job: int | None = None,
        pinned_baseline: int = 0,
        pin_method: str = DEFAULT_PIN_METHOD,
        gpu_per_job: int | None = None,
        max_jobs: int | None = None,
        cpus_per_job: float | None = None,
        profile: str | None = None,
        consumer: str | None = None,
    ) -> None:
        if per_job <= 0:
            raise BadParameter("per_job", "must be above 0")
        if baseline < 0:
            raise BadParameter("baseline", "must not be negative")
        if pinned_baseline < 0:
            raise BadParameter("pinned_baseline", "must not be negative")
        if consumer is not None and consumer not in CONSUMERS:
            raise BadParameter("consumer", f"must be one of {', '.join(CONSUMERS)}, got {consumer!r}")
        if max_jobs is not None and max_jobs < 0:
            raise BadParameter("max_jobs", "must not be negative")
        if cpus_per_job is not None and not CPUS_MIN <= cpus_per_job <= CPUS_MAX:  # NaN fails too
            raise BadParameter("cpus_per_job", f"must be from {CPUS_MIN:g} to {CPUS_MAX:g}")
        if pinned_per_job is not None and pinned_per_job <= 0:
            raise BadParameter("pinned_per_job", "must be above 0")
        if gpu_per_job is not None and gpu_per_job <= 0:
            raise BadParameter("gpu_per_job", "must be above 0")
        if pin_method not in PIN_METHODS:
            raise BadParameter("pin_method", f"must be one of {', '.join(PIN_METHODS)}, got {pin_method!r}")
        self.raised: tuple[str, ...] = _raised(per_job, baseline, pinned_per_job, pinned_baseline)
        self.per_job = max(per_job, pinned_per_job or 0)
        self.baseline = max(baseline, pinned_baseline)
        self.pinned_per_job = pinned_per_job
        self.pinned_baseline = pinned_baseline
        self.pin_method: PinMethod = next(m for m in PIN_METHODS if m == pin_method)
        self.gpu_per_job = gpu_per_job
        self.max_jobs = max_jobs
        self.cpus_per_job = cpus_per_job
        self.profile = profile
        self.consumer = consumer

    def to_dict(self) -> PlanShape:
        return {
            "profile": self.profile,
            "per_job_bytes": self.per_job,
            "baseline_bytes": self.baseline,
            "pinned_per_job_bytes": self.pinned_per_job,
            "pinned_baseline_bytes": self.pinned_baseline,
            "pin_method": self.pin_method,
            "gpu_per_job_bytes": self.gpu_per_job,
            "max_jobs": self.max_jobs,
            "cpus_per_job": self.cpus_per_job,
        }


def _raised(per_job: int, baseline: int, pinned_per_job: int | None, pinned_baseline: int) -> tuple[str, ...]:
    """What Shape raises, in words: a pinned size above the size it is part of becomes that size."""
    out = []
    if pinned_baseline > baseline:
        out.append(
            f"baseline raised from {format_size(baseline)} to the {format_size(pinned_baseline)} pinned baseline"
        )
    if pinned_per_job is not None and pinned_per_job > per_job:
        out.append(f"per job raised from {format_size(per_job)} to the {format_size(pinned_per_job)} pinned per job")
    return tuple(out)


def _memlock_capacity(report: Report, shape: Shape, warnings: list[WarningEntry]) -> int | None:
    if shape.pinned_per_job is None and not shape.pinned_baseline:
        return None
    if shape.pin_method not in MEMLOCK_METHODS:
        return None  # cuda: charged to the memory cgroup (part of the budget), not to RLIMIT_MEMLOCK
    ml = report["memlock"]
    if ml["cap_ipc_lock"]:
        return None
    if not ml["known"]:
        add_warning(warnings, "memlock-unknown", "RLIMIT_MEMLOCK is unknown: the pinned-memory need was not checked")
        return None
    soft = ml["soft_bytes"]
    if soft is None:
        return None
    if shape.pinned_baseline > soft:
        return 0
    return None if shape.pinned_per_job is None else (soft - shape.pinned_baseline) // shape.pinned_per_job


_PIN_HOW = {"mlock": "pin method mlock", "rdma": "pin method rdma, ibv_reg_mr", "cuda": "pin method cuda"}


def _memlock_warning(report: Report, shape: Shape, capacity: PlanCapacity, warnings: list[WarningEntry]) -> None:
    """``memlock-too-low`` when RLIMIT_MEMLOCK binds: below the pinned baseline, or fewer jobs than fit otherwise."""
    mem_n = capacity["memlock"]
    others = [c for n, c in capacity.items() if isinstance(c, int) and n != "memlock"]
    soft = format_size(report["memlock"]["soft_bytes"])
    fix = "raise it (docker run --ulimit memlock=BYTES, systemd LimitMEMLOCK=) or grant CAP_IPC_LOCK"
    how = _PIN_HOW[shape.pin_method]
    if mem_n == 0 and shape.pinned_baseline:
        add_warning(
            warnings,
            "memlock-too-low",
            f"RLIMIT_MEMLOCK ({soft}) is below the {format_size(shape.pinned_baseline)} pinned baseline: "
            f"pinning it ({how}) fails, so no job can run; {fix}",
        )
    elif mem_n is not None and mem_n < min(others):
        add_warning(
            warnings,
            "memlock-too-low",
            f"RLIMIT_MEMLOCK ({soft}) lets only {mem_n} job(s) pin {format_size(shape.pinned_per_job)} each "
            f"where {min(others)} would fit otherwise ({how}); {fix}",
        )


def _budget_warning(budget: int | None, shape: Shape, warnings: list[WarningEntry]) -> None:
    """``budget-too-small`` when the budget holds not even the baseline and one job (0 B: said by the budget)."""
    need = shape.baseline + shape.per_job
    if budget is not None and 0 < budget < need:
        add_warning(
            warnings,
            "budget-too-small",
            f"the budget {format_size(budget)} is below the plan's baseline {format_size(shape.baseline)} "
            f"+ one job {format_size(shape.per_job)} = {format_size(need)}: no job fits",
        )


def _gpu_capacity(report: Report, shape: Shape, warnings: list[WarningEntry]) -> int | None:
    """Jobs that fit in device memory: the sum over visible GPUs of floor(free / gpu_per_job)."""
    if shape.gpu_per_job is None:
        return None
    status = report["gpu_driver"]["status"]
    if status in ("skipped", "failed"):
        why = "the GPU probe was skipped (--no-gpu)" if status == "skipped" else "the GPU probe failed"
        add_warning(warnings, "gpu-not-probed", f"--gpu-per-job is ignored: {why}")
        return None
    total = 0
    for gpu in report["gpus"]:
        free = gpu["memory_free_bytes"]
        total += (free if free is not None else gpu["memory_total_bytes"]) // shape.gpu_per_job
    return total  # 0 without a driver: jobs that need device memory cannot run here


def cpu_capacity(cpus: float | None, cpus_per_job: float | None) -> int | None:
    """floor(cpus / cpus_per_job), with ``CPU_EPSILON`` for binary rounding; None without both."""
    if cpus is None or cpus_per_job is None:
        return None
    return int(cpus / cpus_per_job + CPU_EPSILON)


def _capacity(report: Report, shape: Shape, warnings: list[WarningEntry]) -> PlanCapacity:
    budget = report["budget"]["bytes"]
    return {
        "memory": 0 if budget is None or budget < shape.baseline else (budget - shape.baseline) // shape.per_job,
        "memlock": _memlock_capacity(report, shape, warnings),
        "gpu": _gpu_capacity(report, shape, warnings),
        "max_jobs": shape.max_jobs,
        "cpu": cpu_capacity(report["cpu"]["effective_cpus"], shape.cpus_per_job),
    }


def make_plan(report: Report, shape: Shape) -> Plan:
    """The plan for *shape* under the report's budget; warnings go into the report."""
    warnings = report["warnings"]
    budget = report["budget"]["bytes"]
    capacity = _capacity(report, shape, warnings)
    concurrency, binding = _smallest(capacity)
    _budget_warning(budget, shape, warnings)
    _memlock_warning(report, shape, capacity, warnings)
    headroom = None if budget is None else budget - shape.baseline - concurrency * shape.per_job
    if shape.pinned_per_job is not None and concurrency:
        add_warning(
            warnings,
            "pinned-counts-against-limit",
            f"{concurrency} jobs pin {format_size(concurrency * shape.pinned_per_job)}: page-locked "
            "memory is charged to the memory cgroup like any other and is part of each job's size",
        )
    explanation = explain(report, shape, concurrency, binding, capacity)
    if shape.raised:
        explanation += f" ({'; '.join(shape.raised)}: pinned memory is part of the memory it pins)"
    return {
        "concurrency": concurrency,
        "binding": binding,
        "capacity": capacity,
        "headroom_bytes": headroom,
        "explanation": explanation,
        "shape": shape.to_dict(),
        "cuzk": _cuzk(budget, shape, warnings),
    }


def _cuzk(budget: int | None, shape: Shape, warnings: list[WarningEntry]) -> PlanCuzk | None:
    """CuZK's own count at ``total_budget`` = the whole budget (policy/cuzk.py); None for other consumers."""
    if shape.consumer != cuzk.CONSUMER:
        return None
    n = None if budget is None else cuzk.partitions(budget, shape)
    if n == 0 and budget:  # a budget of 0 is warned by the budget already
        add_warning(
            warnings,
            "cuzk-no-partition",
            f"CuZK's total_budget {format_size(budget)} holds not even its SRS + PCE {format_size(shape.baseline)} "
            f"+ one partition {format_size(shape.per_job)} = {format_size(shape.baseline + shape.per_job)}: "
            "its budget.acquire waits for ever and no proof starts",
        )
    return {
        "total_budget_bytes": budget,
        "resident_bytes": shape.baseline,
        "partition_bytes": shape.per_job,
        "workers": None if budget is None else cuzk.workers(budget),
        "partitions": n,
    }


def memory_arithmetic(budget: int | None, shape: Shape) -> str:
    """The memory constraint's numbers in one phrase: ``budget 21.19 GiB - 8 GiB baseline = 13.19 GiB
    / 1 GiB per job`` (for messages such as ``--require-jobs``)."""
    per_job = f"{format_size(shape.per_job)} per job"
    if budget is None:
        return f"budget unknown, {per_job}"
    if not shape.baseline:
        return f"budget {format_size(budget)} / {per_job}"
    left = format_size(budget - shape.baseline)
    return f"budget {format_size(budget)} - {format_size(shape.baseline)} baseline = {left} / {per_job}"


def _smallest(capacity: PlanCapacity) -> tuple[int, str]:
    best_n, best_name = capacity["memory"] or 0, "memory"
    for name in CONSTRAINTS[1:]:
        n = capacity.get(name)
        if isinstance(n, int) and n < best_n:
            best_n, best_name = n, name
    return best_n, best_name


def explain(report: Report, shape: Shape, n: int, binding: str, capacity: PlanCapacity) -> str:
    jobs = f"{n} job{'s' if n != 1 else ''}"
    b = report["budget"]["bytes"]
    if binding == "memory":
        if b is None:
            return f"{jobs}: the budget is unknown"
        base = f" - {format_size(shape.baseline)} baseline" if shape.baseline else ""
        inner = f"({format_size(b)} budget{base})" if base else f"{format_size(b)} budget"
        return f"{jobs}, memory binds: {inner} / {format_size(shape.per_job)} per job"
    if binding == "memlock":
        soft = report["memlock"]["soft_bytes"]
        if shape.pinned_per_job is None or (n == 0 and soft is not None and shape.pinned_baseline > soft):
            return (
                f"{jobs}, memlock binds: the {format_size(shape.pinned_baseline)} pinned baseline is above "
                f"RLIMIT_MEMLOCK ({format_size(soft)}) (no CAP_IPC_LOCK, pin method {shape.pin_method})"
            )
        pinned = f" - {format_size(shape.pinned_baseline)} pinned baseline" if shape.pinned_baseline else ""
        return (
            f"{jobs}, memlock binds: ({format_size(soft)} RLIMIT_MEMLOCK{pinned}) / "
            f"{format_size(shape.pinned_per_job)} pinned per job (no CAP_IPC_LOCK, pin method {shape.pin_method})"
        )
    if binding == "gpu":
        return f"{jobs}, gpu binds: {format_size(shape.gpu_per_job)} of device memory per job"
    if binding == "max_jobs":
        return f"{jobs}, max_jobs binds: capped at {shape.max_jobs} (memory would fit {capacity['memory']})"
    cpus = report["cpu"]["effective_cpus"]
    return f"{jobs}, cpu binds: {cpus:g} CPUs / {shape.cpus_per_job:g} per job"
