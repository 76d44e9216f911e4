"""Static types of the report (``TypedDict``s). Imported only for type checking and by
``oomguard.Report``; at run time a report is plain JSON data. Field meanings: docs/report.md.
At the end, the closed sets of the other wire messages (events, observations, the recommendation:
the ``*.schema.json`` beside schema.json), whose value tuples the run side and the manager import.
"""

from __future__ import annotations

from typing import Literal, TypedDict, get_args

# The closed sets of the report (schema.json's enums), so mypy catches a value outside them.
MemoryLimitedBy = Literal["cgroup-v2", "cgroup-v1", "meminfo"]
CpuLimitedBy = Literal["online", "affinity", "cpuset", "quota"]
Runtime = Literal["docker", "podman", "kubernetes", "lxc", "wsl", "container-other"]
GpuDriverStatus = Literal["ok", "no-driver", "skipped", "failed"]
BudgetSource = Literal["auto", "explicit", "env"]
PinMethod = Literal["cuda", "mlock", "rdma"]
PlanBinding = Literal["memory", "memlock", "gpu", "max_jobs", "cpu"]


class WarningEntry(TypedDict):
    code: str
    message: str


class CgroupLevel(TypedDict):
    dir: str
    max_bytes: int | None
    high_bytes: int | None


class CgroupSection(TypedDict):
    version: int | None
    path: str | None
    mount: str | None
    mount_root: str | None
    dir: str | None
    limit_bytes: int | None
    limit_file: str | None
    ancestors_visible: bool | None
    levels: list[CgroupLevel]


class SwapSection(TypedDict):
    limit_bytes: int | None
    memsw_limit_bytes: int | None
    known: bool
    usage_bytes: int | None
    host_total_bytes: int | None


class ProtectionSection(TypedDict):
    low_bytes: int | None
    min_bytes: int | None
    v1_soft_limit_bytes: int | None


class OomSection(TypedDict):
    source: str
    oom: int | None
    oom_kill: int | None
    oom_group_kill: int | None


class MemorySection(TypedDict):
    effective_bytes: int | None
    limited_by: MemoryLimitedBy | None
    limit_file: str | None
    host_total_bytes: int | None
    host_available_bytes: int | None
    meminfo_virtualized: bool
    soft_limit_bytes: int | None
    soft_limit_file: str | None
    usage_bytes: int | None
    working_set_bytes: int | None
    inactive_file_bytes: int | None
    shmem_bytes: int | None
    available_bytes: int | None
    swap: SwapSection
    protection: ProtectionSection
    pressure: dict[str, object] | None
    oom: OomSection | None
    cgroup: CgroupSection


class MemlockSection(TypedDict):
    known: bool
    source: str | None
    soft_bytes: int | None
    hard_bytes: int | None
    cap_ipc_lock: bool | None
    locked_bytes: int | None
    pinned_bytes: int | None
    probe: dict[str, object] | None
    pinned_probe: dict[str, object] | None


class CpuSection(TypedDict):
    effective_cpus: float | None
    limited_by: CpuLimitedBy | None
    online_cpus: int | None
    affinity_cpus: int | None
    cpuset_cpus: int | None
    quota_cpus: float | None


class ContainerSection(TypedDict):
    in_container: bool
    runtime: Runtime | None
    evidence: list[str]
    provider: str | None
    provider_hints: dict[str, str]


class MigDeviceEntry(TypedDict):
    index: int
    uuid: str
    name: str | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory_total_bytes: int
    memory_used_bytes: int | None
    memory_free_bytes: int | None
    memory_reserved_bytes: int | None


class GpuEntry(TypedDict):
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int | None
    memory_free_bytes: int | None
    memory_reserved_bytes: int | None
    pci_bus_id: str
    mig_mode: str | None
    mig_devices: list[MigDeviceEntry] | None
    parent_uuid: str | None


class GpuVisibility(TypedDict):
    nvidia_visible_devices: str | None
    cuda_visible_devices: str | None
    cuda_device_order: str | None


class GpuDriverSection(TypedDict):
    status: GpuDriverStatus
    source: str | None
    driver_version: str | None
    cuda_version: str | None
    visibility: GpuVisibility


class BudgetSection(TypedDict):
    bytes: int | None
    source: BudgetSource | None
    basis_bytes: int | None
    safety_margin_bytes: int | None
    requested: str | None


class PlanCapacity(TypedDict):
    """Jobs that fit under each constraint; None where the constraint does not apply."""

    memory: int
    memlock: int | None
    gpu: int | None
    max_jobs: int | None
    cpu: int | None


class PlanShape(TypedDict):
    profile: str | None
    per_job_bytes: int
    baseline_bytes: int
    pinned_per_job_bytes: int | None
    pinned_baseline_bytes: int
    pin_method: PinMethod
    gpu_per_job_bytes: int | None
    max_jobs: int | None
    cpus_per_job: float | None


class PlanCuzk(TypedDict):
    """CuZK's own count at the plan's budget (``policy/cuzk.py``); sizes from the profile."""

    total_budget_bytes: int | None
    resident_bytes: int
    partition_bytes: int
    workers: int | None
    partitions: int | None


class Plan(TypedDict):
    """``policy.plan.make_plan``'s result; a report carries it as ``plan`` when a job shape was given."""

    concurrency: int
    binding: str
    capacity: PlanCapacity
    headroom_bytes: int | None
    explanation: str
    shape: PlanShape
    cuzk: PlanCuzk | None


class ConsumerEntry(TypedDict):
    """A memory consumer's own view of its budget (``agent --cuzk-status``: ``agent/consumers.py``)."""

    name: str
    url: str
    budget_bytes: int | None
    used_bytes: int | None
    available_bytes: int | None
    error: str | None


class _ReportRequired(TypedDict):
    schema_version: int
    oomguard_version: str
    root: str
    memory: MemorySection
    memlock: MemlockSection
    cpu: CpuSection
    container: ContainerSection
    gpus: list[GpuEntry]
    gpu_driver: GpuDriverSection
    budget: BudgetSection
    warnings: list[WarningEntry]


class Report(_ReportRequired, total=False):
    """The report; ``plan`` is there only when a job shape was given (``agent --per-job``);
    ``consumers`` only in an agent's report with ``--cuzk-status``."""

    plan: Plan
    consumers: list[ConsumerEntry]


# The closed sets of the wire messages beside the report, once: the supervisor's events
# (event.schema.json), the observations (observation.schema.json) and the recommendation
# (recommendation.schema.json). tests/test_wire_schemas.py compares each with its schema's enum;
# the value tuples below are what code checks at run time (``typing.get_args``).
SupervisorEventName = Literal["start", "exit", "restart", "give-up", "stop"]  # what ``run --events`` writes
EventName = Literal[SupervisorEventName, "heartbeat", "gate"]  # + the forwarder's heartbeat, the entrypoint's gate
ExitReason = Literal["clean", "exit", "signal", "oom-kill", "pressure-stop"]  # supervisor/exits.py classifies
OomVictim = Literal["worker", "descendant", "group"]
PeakSource = Literal["vmhwm", "memory.peak", "memory.max_usage_in_bytes"]
GraceSource = Literal["given", "learned"]
GateStep = Literal["check", "plan", "verify"]
Outcome = Literal["ok", "oom-kill", "pressure-stop"]  # an observation's: how the run ended
RecommendationSource = Literal["node", "class", "fleet", "floor", "declared"]  # the scope a recommendation came from
LearnedOrigin = Literal["manager", "cache", "none"]  # where ``--learned`` got its answer

EVENT_NAMES: tuple[EventName, ...] = get_args(EventName)
SUPERVISOR_EVENT_NAMES: tuple[SupervisorEventName, ...] = get_args(SupervisorEventName)
EXIT_REASONS: tuple[ExitReason, ...] = get_args(ExitReason)
GATE_STEPS: tuple[GateStep, ...] = get_args(GateStep)
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
FAILURES: tuple[Outcome, ...] = tuple(o for o in OUTCOMES if o != "ok")  # the outcomes that raise a floor
RECOMMENDATION_SOURCES: tuple[RecommendationSource, ...] = get_args(RecommendationSource)
LEARNED_ORIGINS: tuple[LearnedOrigin, ...] = get_args(LearnedOrigin)
