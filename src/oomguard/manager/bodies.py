"""Request bodies: what a client may send, held to strict JSON by the middleware before any route
sees it (``parse_strict``), then to the envelopes below (pydantic): anything else is a 422 with a
one-line reason, never a 500.

Strict JSON (``parse_strict``, ``check_value``):

- RFC 8259 JSON only: ``NaN``, ``Infinity`` and ``-Infinity`` are not JSON (section 6), though
  Python's ``json`` accepts them; bytes must be UTF-8 (section 8.1).
- At most ``MAX_DEPTH`` levels of arrays and objects (a report is 4 deep; section 9 lets a parser
  limit nesting), so nothing downstream recurses without bound.
- No NUL character in any string or key: PostgreSQL text cannot hold one ("PostgreSQL text
  fields cannot contain NUL (0x00) bytes"), and no field of a report needs one.
- Integers within a signed 64-bit range (what a BIGINT column holds); a longer run of digits is
  refused whole (CPython caps int parsing at 4300 digits anyway: sys.set_int_max_str_digits).
- A lone surrogate escape (``"\\ud800"``) is JSON (RFC 8259 section 8.2 allows it) and is kept:
  the report is stored as JSON text with its escapes, which both databases hold, and read back
  through ``oomguard.manager.store.text`` (the surrogate shown as its escape). An honest agent
  sends one where a path held a byte that is not UTF-8.

A refusal names the place, never the input: a key the manager knows (a field of schema.json or of
an envelope, an observation's included: ``known``) by its name, any other by its position in its
object (``<field 3>``, the third), a list item by its index (``place``).

The envelopes (``ReportEnvelope``, ``EventEnvelope``, ``ObservationEnvelope``): every integer that
reaches a BIGINT column is bounded; floats must be finite; strings that become columns are short
and of a conservative character set. The report inside an envelope is the report's own contract
(``schema.json``), checked once, by ``oomguard.manager.contract``, and kept as JSON text as the
agent sent it. An observation is also held to its node's latest report (``observation_problem``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from oomguard._types import EventName, ExitReason, GateStep, Outcome
from oomguard.labels import KEY_MAX, KEY_PATTERN, LABELS_MAX, VALUE_MAX, label_problem, labels_problem
from oomguard.manager import contract, reportschema
from oomguard.manager.times import parse_iso_ms
from oomguard.nodes import NODE_CLASS_PATTERN, NODE_PATTERN, PROFILE_PATTERN
from oomguard.units import MiB, format_size_precise

MAX_DEPTH = 32
INT_LIMIT = contract.BIG  # what a BIGINT column holds


class _NotJson(ValueError):
    pass


def _no_constants(name: str) -> Any:
    raise _NotJson(f"{name} is not JSON (RFC 8259)")


def _strict_loads(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constants)


def parse_strict(body: bytes) -> tuple[Any, str | None]:
    """(value, None) for a strict JSON body, else (None, the reason)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"the body is not UTF-8 (byte {exc.start})"
    try:
        value = _strict_loads(text)
    except _NotJson as exc:
        return None, str(exc)
    except RecursionError:
        return None, f"the body is nested more than {MAX_DEPTH} levels deep"
    except ValueError as exc:  # JSONDecodeError, and the int digit cap
        return None, f"invalid JSON: {str(exc).splitlines()[0][:200]}"
    problem = check_value(value)
    return (None, problem) if problem else (value, None)


def check_value(value: Any) -> str | None:
    """The first problem of a parsed JSON value (depth, NUL, integer range), or None. Iterative."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "$")]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, dict | list) and depth > MAX_DEPTH:
            return f"{where}: nested more than {MAX_DEPTH} levels deep"
        if isinstance(item, dict):
            for position, (key, sub) in enumerate(item.items(), 1):
                if "\x00" in key:
                    return f"{where}: a key contains a NUL character"
                stack.append((sub, depth + 1, place(where, key, position)))
        elif isinstance(item, list):
            stack.extend((sub, depth + 1, f"{where}[{i}]") for i, sub in enumerate(item))
        elif isinstance(item, str) and "\x00" in item:
            return f"{where}: a string contains a NUL character"
        elif isinstance(item, int) and not isinstance(item, bool) and not -INT_LIMIT <= item <= INT_LIMIT:
            return f"{where}: an integer outside the signed 64-bit range"
    return None


def place(where: str, key: str, position: int) -> str:
    """The place of *key*, the *position*-th (from 1) member of the object at *where*: its name
    when the manager knows it (``known``), else its position, so that no input is echoed."""
    return f"{where}.{key}" if key in known() else f"{where}.<field {position}>"


def safe_loc(loc: Sequence[object]) -> list[int | str]:
    """A validation error's location as a 422 may show it. A query, path, header or cookie
    location names a parameter the route declares (FastAPI reports no other): as it is. In a body:
    each index, each name the manager knows (``known``), else ``<field>`` (a key of the client's
    own, such as an unknown envelope field or a label's name: not echoed)."""
    if not loc or loc[0] != "body":
        return [p if isinstance(p, int) else str(p)[:100] for p in loc]
    return [p if isinstance(p, int) else p if isinstance(p, str) and p in known() else "<field>" for p in loc]


@functools.cache
def known() -> frozenset[str]:
    """Every key the manager itself names: the properties of schema.json (and of the manager's own
    needs, ``contract.needs``), the fields of the envelopes, and a request's parts (``body``, ...)."""
    names = {"body", "query", "path", "header", "cookie"}
    stack: list[Any] = [reportschema.schema(), contract.needs()]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                names.update(props)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    for model in (ReportEnvelope, EventEnvelope, EventIn, ObservationEnvelope, ObservationIn):
        names.update(model.model_fields)
    return frozenset(names)


# -- the envelopes --------------------------------------------------------------------------------

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"

NodeName = Annotated[str, Field(pattern=NODE_PATTERN, max_length=128, description="Node name: [A-Za-z0-9._-], 1-128")]
IngestId = Annotated[str, Field(pattern=ID_PATTERN, max_length=128, description="Idempotency key, e.g. a UUID")]
Bytes = Annotated[int, Field(ge=0, le=INT_LIMIT)]
SmallInt = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Finite = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]
Interval = Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)]
Report = Annotated[
    dict[str, Any],
    Field(
        description=(
            "An `oomguard check` report: src/oomguard/schema.json, relaxed for a mixed fleet (a field an older "
            "agent lacks may be missing, one a newer agent adds may be there), and what the manager itself needs "
            "of every report (below)"
        ),
        json_schema_extra=contract.needs(),
    ),
]


# Labels: the one rule the agent checks too (oomguard.labels: Prometheus' label names, 1-256
# printable characters, at most 16); the pattern and lengths give the OpenAPI schema, the
# validator the whole rule (a 422 giving the label by its position: the agent's own message,
# ``labels_problem``, names it, which a 422 must not echo).
LABEL_RULE = (
    f"a label's name is 1-{KEY_MAX} of [a-zA-Z0-9_], not starting with a digit or __, and its value "
    f"1-{VALUE_MAX} printable characters"
)


def _labels_ok(labels: dict[str, str]) -> dict[str, str]:
    if len(labels) > LABELS_MAX:
        raise ValueError(f"labels: {len(labels)}, at most {LABELS_MAX}")
    for position, (key, value) in enumerate(labels.items(), 1):
        if label_problem(key, value) is not None:
            raise ValueError(f"label {position} of {len(labels)} breaks the rule: {LABEL_RULE}")
    if labels_problem(labels) is not None:  # the agent's rule, whole (what the loop above does not say)
        raise ValueError(f"labels break the rule: {LABEL_RULE}")
    return labels


LabelKey = Annotated[str, Field(pattern=KEY_PATTERN, max_length=KEY_MAX)]
LabelValue = Annotated[str, Field(min_length=1, max_length=VALUE_MAX)]
Labels = Annotated[
    dict[LabelKey, LabelValue],
    Field(
        max_length=LABELS_MAX,
        description=(
            f"The node's labels (the latest sent are kept): at most {LABELS_MAX}, keys as Prometheus label names "
            f"(not starting with __), values 1-{VALUE_MAX} printable characters"
        ),
    ),
    AfterValidator(_labels_ok),
]


LABEL_FILTER_HELP = (
    f"label: expected KEY=VALUE, KEY a label name (letters, digits and _) and VALUE at most {VALUE_MAX} characters"
)


def label_filter(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the node list's ``label`` filter) as (key, value); ValueError for anything else."""
    key, sep, value = text.partition("=")
    if not sep or label_problem(key, value or "x") is not None:
        raise ValueError(LABEL_FILTER_HELP)
    return key, value


# Every envelope is strict (issue 37): JSON's types as the wire schemas say, so a size or an
# interval given as "1" or true is a 422, never read as 1 (pydantic's lax mode would take both:
# "Conversion Table", https://docs.pydantic.dev/latest/concepts/conversion_table/). The report
# inside is the report's own contract (``contract.problem``), which is as strict.
STRICT = ConfigDict(extra="forbid", strict=True)


class ReportEnvelope(BaseModel):
    """A report as an agent posts it. The report is checked by ``contract.problem`` (the route's
    422), not here, and stored as the agent sent it."""

    model_config = STRICT
    node: NodeName
    id: IngestId
    report: Report
    labels: Labels | None = None
    interval_s: Interval | None = None
    time: (
        Annotated[
            str,
            Field(
                max_length=64, description="When the report was made (ISO 8601); a spooled report keeps its own time"
            ),
        ]
        | None
    ) = None


class EventIn(BaseModel):
    """A supervisor event (docs/run.md; fields of a newer supervisor are kept); ``heartbeat`` (with
    the supervisor's ``interval_s``) is stored as no row, it only keeps a node known from run events
    alone (run-only) from going offline. ``gate``: the entrypoint's gate before anything starts
    (``step``, ``passed``, ``exit_code``, ``message``: the failing step's one line, with its numbers)."""

    model_config = ConfigDict(extra="allow", strict=True)  # JSON types as event.schema.json says: "7" is no pid
    event: EventName
    time: Annotated[str, Field(max_length=64)] | None = None
    pid: SmallInt | None = None
    budget_bytes: Bytes | None = None
    concurrency: SmallInt | None = None
    reason: ExitReason | None = None
    exit_code: SmallInt | None = None
    signal: SmallInt | None = None
    duration_s: Finite | None = None
    delay_s: Finite | None = None
    peak_bytes: Bytes | None = None
    message: Annotated[str, Field(max_length=4000)] | None = None
    interval_s: Interval | None = None
    effective_bytes: Bytes | None = None  # on start: the hard ceiling the budget was computed from
    limited_by: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,16}$")] | None = None
    step: GateStep | None = None
    passed: StrictBool | None = None  # true or false, never "no" (which pydantic would read as false)

    @model_validator(mode="after")
    def _gate_fields(self) -> EventIn:
        if self.event == "gate" and (self.step is None or self.passed is None):
            raise ValueError("a gate event needs step (check, plan or verify) and passed (true or false)")
        return self


class EventEnvelope(BaseModel):
    model_config = STRICT
    node: NodeName
    id: IngestId
    event: EventIn
    labels: Labels | None = None


CLASS_PATTERN = NODE_CLASS_PATTERN  # an operator's class, and every one learning derives
Size = Annotated[int, Field(ge=0, le=INT_LIMIT)]


class ObservationIn(BaseModel):
    """One run of a profiled worker: what its jobs really used (``oomguard.manager.learning``).
    Sizes in bytes; ``time`` (ISO 8601) when the run ended, by the node's clock."""

    model_config = ConfigDict(extra="forbid", strict=True)  # JSON types as observation.schema.json says
    profile: Annotated[str, Field(pattern=PROFILE_PATTERN, max_length=128, description="The profile's name")]
    node_class: (
        Annotated[
            str,
            Field(
                pattern=CLASS_PATTERN,
                max_length=64,
                description="The operator's class of node; without it, derived from the node's latest report",
            ),
        ]
        | None
    ) = None
    declared_per_job_bytes: Annotated[int, Field(ge=1, le=INT_LIMIT, description="The size each job was given")]
    peak_per_job_bytes: Annotated[Size, Field(description="The peak one job was seen to reach")]
    declared_baseline_bytes: Annotated[Size, Field(description="The baseline declared")]
    peak_baseline_bytes: Annotated[
        Size | None, Field(description="The working set before the jobs, at its peak; null: not measured")
    ] = None
    concurrency: Annotated[int, Field(ge=1, le=1_000_000, description="Jobs at once")]
    outcome: Outcome
    time: Annotated[str, Field(max_length=64, description="When the run ended (ISO 8601)")]

    @field_validator("time")
    @classmethod
    def _iso(cls, value: str) -> str:
        if parse_iso_ms(value) is None:
            raise ValueError("time: expected an ISO 8601 time such as 2026-12-01T18:00:00Z")
        return value


class ObservationEnvelope(BaseModel):
    model_config = STRICT
    node: NodeName
    id: IngestId
    observation: ObservationIn
    labels: Labels | None = None


# -- an observation against its node's own report ------------------------------------------------
# Issue 36, item 2: a run's numbers cannot exceed the hard ceiling of the node it ran on. One
# observation of a 1 EiB peak, or of a million jobs, would otherwise move its class's P98 and the
# fleet's for 14 days. Checked where the node has a latest report with a known effective limit;
# a node that never reported (run-only), or whose report knew no limit, is not checked.

JOB_MIN_BYTES = MiB  # no job is planned below 1 MiB (learning.MIN_PER_JOB): more jobs than this allows never ran
_SIZES = ("peak_per_job_bytes", "declared_per_job_bytes", "peak_baseline_bytes", "declared_baseline_bytes")


def _checked_against(limit: int) -> str:
    return f"the effective limit of the node's latest report, {format_size_precise(limit)}"


def observation_problem(o: ObservationIn, limit: int) -> str | None:
    """Why *o* cannot be a run of a node whose latest report's effective limit is *limit* bytes,
    in one line naming the field and the limit (no value of the client's echoed); None when it fits."""
    for name in _SIZES:
        value = getattr(o, name)
        if value is not None and value > limit:
            return f"observation.{name}: above {_checked_against(limit)}"
    most = limit // JOB_MIN_BYTES
    if o.concurrency > most:
        return f"observation.concurrency: above {most} jobs of 1 MiB, all that fit {_checked_against(limit)}"
    if o.concurrency * o.declared_per_job_bytes + o.declared_baseline_bytes > limit:
        return (
            "observation.concurrency: its jobs at declared_per_job_bytes each, with declared_baseline_bytes, "
            f"are above {_checked_against(limit)}"
        )
    return None


def whole_bytes(value: object) -> object:
    """A size in a query string: ASCII digits only (pydantic's lax int would take ``1.0``, ``+1``,
    `` 1`` or ``1_000``), at most 19 of them (2^63 - 1 has 19); the bounds are the parameter's."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit() and len(value) <= 19):
        raise ValueError("expected a whole number of bytes: 1 to 19 digits, nothing else")
    return value


class Stored(BaseModel):
    stored: bool = Field(description="False when this id was already stored (an idempotent retry)")
    id: str
