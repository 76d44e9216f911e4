"""Request bodies: what an agent may send. Anything else is a 422, never a 500.

Every integer that reaches a BIGINT column is bounded; floats must be finite; strings that
become columns are short and of a conservative character set. The report itself is kept as
JSON text, so its other fields pass through as the agent sent them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

NODE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
BIG = 2**63 - 1

NodeName = Annotated[str, Field(pattern=NODE_PATTERN, max_length=128, description="Node name: [A-Za-z0-9._-], 1-128")]
IngestId = Annotated[str, Field(pattern=ID_PATTERN, max_length=128, description="Idempotency key, e.g. a UUID")]
Bytes = Annotated[int, Field(ge=0, le=BIG)]
SmallInt = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Finite = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]
Label = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{0,32}$", max_length=32)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class MemoryIn(_Open):
    effective_bytes: Bytes | None = None
    host_total_bytes: Bytes | None = None
    limited_by: Literal["cgroup-v2", "cgroup-v1", "meminfo"] | None = None
    usage_bytes: Bytes | None = None
    working_set_bytes: Bytes | None = None


class BudgetIn(_Open):
    bytes: Bytes | None = None
    source: Literal["auto", "explicit", "env"] | None = None


class MemlockIn(_Open):
    soft_bytes: Bytes | None = None


class ContainerIn(_Open):
    runtime: Label | None = None


class GpuIn(_Open):
    index: SmallInt
    name: Annotated[str, Field(max_length=200)] = ""
    memory_total_bytes: Bytes | None = None
    memory_free_bytes: Bytes | None = None


class WarningIn(_Open):
    code: Label
    message: Annotated[str, Field(max_length=4000)] = ""


class PlanIn(_Open):
    concurrency: Annotated[int, Field(ge=0, le=1_000_000)] | None = None


class ReportIn(_Open):
    schema_version: Annotated[int, Field(ge=1, le=1000)]
    memory: MemoryIn
    budget: BudgetIn = BudgetIn()
    memlock: MemlockIn = MemlockIn()
    container: ContainerIn = ContainerIn()
    gpus: Annotated[list[GpuIn], Field(max_length=64)] = []
    warnings: Annotated[list[WarningIn], Field(max_length=200)] = []
    plan: PlanIn | None = None


class ReportEnvelope(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: NodeName
    id: IngestId
    report: ReportIn
    interval_s: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] | None = None
    time: (
        Annotated[
            str,
            Field(
                max_length=64, description="When the report was made (ISO 8601); a spooled report keeps its own time"
            ),
        ]
        | None
    ) = None


class EventIn(_Open):
    """A supervisor event; ``heartbeat`` (with the supervisor's ``interval_s``) is stored as no
    row, it only keeps a node known from run events alone (run-only) from going offline."""

    event: Literal["start", "exit", "restart", "give-up", "stop", "heartbeat"]
    time: Annotated[str, Field(max_length=64)] | None = None
    pid: SmallInt | None = None
    budget_bytes: Bytes | None = None
    concurrency: SmallInt | None = None
    reason: Literal["oom-kill", "pressure-stop", "signal", "exit", "clean"] | None = None
    exit_code: SmallInt | None = None
    signal: SmallInt | None = None
    duration_s: Finite | None = None
    delay_s: Finite | None = None
    peak_bytes: Bytes | None = None
    message: Annotated[str, Field(max_length=4000)] | None = None
    interval_s: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] | None = None


class EventEnvelope(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: NodeName
    id: IngestId
    event: EventIn


class Stored(BaseModel):
    stored: bool = Field(description="False when this id was already stored (an idempotent retry)")
    id: str
