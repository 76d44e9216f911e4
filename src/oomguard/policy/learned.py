"""A learned size (issue 23): the fleet manager's recommendation for a profile, applied to a shape.

``plan --learned``, ``run --learned`` and ``MemoryBudget(learned=...)`` plan a profile's jobs at
what the fleet has learned they really use (``GET /api/v1/profiles/NAME/recommendation``, the
manager's rule: ``oomguard.manager.learning``). This module is the rule on plain values, no
network and no files; ``oomguard.agent.learned`` fetches the answer and keeps the last one on disk.

- **Which answer**: the manager's, else (unreachable, refused, not JSON) the last answer kept on
  disk, else none: the declared size. An answer whose ``source`` is ``declared`` (the manager has
  too few samples of the profile) leaves the declared size too, but where its per-job size or
  baseline is above the declared one (an older manager's floor from a kill in the class): an
  answer above the declared size is never dropped (issue 36), and ``source: floor`` (the class's
  floor after its first OOM kill, before 3 samples) is taken as any learned answer.
- **Raise-only** by default: per job ``max(declared, learned)``, the baseline likewise. A learned
  size below the declared one is the operator's choice (``may_lower``: ``--learned-may-lower``);
  the manager's lower answer is still said.
- **Bounded by the local ceiling**: a learned per-job size or baseline above this node's ceiling
  (``memory.effective_bytes``) is taken as the ceiling, and said: no job fits then, and the plan
  says so, rather than a number the node could never hold. The budget itself is never changed.
- **Said**: ``decision`` (the ``learned`` object of ``plan --json`` and of ``run``'s start event)
  names the sizes declared, learned and used, where the answer came from (``manager``, ``cache``,
  ``none``) and why, in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from oomguard._types import LEARNED_ORIGINS, RECOMMENDATION_SOURCES
from oomguard.policy.plan import Shape
from oomguard.units import MAX_SIZE, format_size

SOURCES = RECOMMENDATION_SOURCES  # the one definition: oomguard._types (recommendation.schema.json's enum)
ORIGINS = LEARNED_ORIGINS


@dataclass(frozen=True)
class Answer:
    """The fields of a recommendation this side uses (``parse_answer`` checks them)."""

    per_job_bytes: int | None
    baseline_bytes: int | None
    source: str
    samples: int
    confidence: float | None
    updated: str | None
    node_class: str | None


def _size(value: object) -> int | str | None:
    """A size field: the int, None, or the text of what is wrong with it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"not a whole number of bytes: {value!r}"[:120]
    if not 0 <= value <= MAX_SIZE:
        return f"out of range: {value}"
    return value


def parse_answer(data: object) -> Answer | str:
    """The recommendation *data* (parsed JSON) as an ``Answer``, or one line saying why not."""
    if not isinstance(data, dict):
        return "the answer is not a JSON object"
    sizes: dict[str, int | None] = {}
    for key in ("per_job_bytes", "baseline_bytes"):
        checked = _size(data.get(key))
        if isinstance(checked, str):
            return f"{key} is {checked}"
        sizes[key] = checked
    source = data.get("source")
    if source not in SOURCES:
        return f"source is not one of {', '.join(SOURCES)}: {source!r}"[:160]
    if source != "declared" and sizes["per_job_bytes"] is None:
        return f"source {source} without per_job_bytes"
    samples = data.get("samples", 0)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        return f"samples is not a count: {samples!r}"[:120]
    confidence = data.get("confidence")
    if confidence is not None and (
        isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not math.isfinite(confidence)
    ):
        return f"confidence is not a number: {confidence!r}"[:120]
    updated, node_class = data.get("updated"), data.get("node_class")
    return Answer(
        per_job_bytes=sizes["per_job_bytes"],
        baseline_bytes=sizes["baseline_bytes"],
        source=str(source),
        samples=samples,
        confidence=None if confidence is None else float(confidence),
        updated=updated if isinstance(updated, str) else None,
        node_class=node_class if isinstance(node_class, str) else None,
    )


def _pick(declared: int, learned: int | None, may_lower: bool, ceiling: int | None) -> tuple[int, bool]:
    """(the size used for one field, whether the ceiling bounded it)."""
    if learned is None:
        return declared, False
    used = learned if may_lower else max(declared, learned)
    if ceiling is not None and used > ceiling:
        return ceiling, True
    return used, False


def _above(shape: Shape, answer: Answer) -> bool:
    """Whether *answer* asks more than *shape* declares, per job or for the baseline."""
    return (answer.per_job_bytes or 0) > shape.per_job or (answer.baseline_bytes or 0) > shape.baseline


def apply(
    shape: Shape,
    answer: Answer | None,
    *,
    origin: str,
    fetched: str | None = None,
    unreached: str | None = None,
    ceiling: int | None = None,
    may_lower: bool = False,
) -> tuple[Shape, dict[str, Any]]:
    """*shape* with the learned per-job size and baseline of *answer* (None: none to be had), and
    the decision, said. *origin*: ``manager`` or ``cache`` (where *answer* came from), ``none``;
    *fetched*: when the answer was fetched; *unreached*: why the manager gave none (for ``cache``
    and ``none``); *ceiling*: this node's (``memory.effective_bytes``), None when unknown."""
    assert origin in ORIGINS, origin
    learned = answer is not None and (answer.source != "declared" or _above(shape, answer))
    # A "declared" answer above the declared size raises only: it never lowers, whatever may_lower.
    lower = may_lower and answer is not None and answer.source != "declared"
    per_job, job_capped = _pick(shape.per_job, answer.per_job_bytes if learned and answer else None, lower, ceiling)
    baseline, base_capped = _pick(shape.baseline, answer.baseline_bytes if learned and answer else None, lower, ceiling)
    per_job = max(1, per_job)  # a Shape's per-job size is above 0 (a ceiling of 0 would make it 0)
    used = learned is not None and (per_job, baseline) != (shape.per_job, shape.baseline)
    decision: dict[str, Any] = {
        "profile": shape.profile,
        "used": "learned" if used else "declared",
        "origin": origin,
        "source": answer.source if answer is not None else None,
        "per_job_bytes": per_job,
        "baseline_bytes": baseline,
        "declared_per_job_bytes": shape.per_job,
        "declared_baseline_bytes": shape.baseline,
        "learned_per_job_bytes": answer.per_job_bytes if answer is not None else None,
        "learned_baseline_bytes": answer.baseline_bytes if answer is not None else None,
        "samples": answer.samples if answer is not None else None,
        "confidence": answer.confidence if answer is not None else None,
        "updated": answer.updated if answer is not None else None,
        "fetched": fetched,
        "why": _why(shape, answer, origin, fetched, unreached, per_job=per_job, capped=job_capped or base_capped),
    }
    if not used:
        return shape, decision
    new = Shape(
        per_job,
        baseline,
        pinned_per_job=shape.pinned_per_job,
        pinned_baseline=shape.pinned_baseline,
        pin_method=shape.pin_method,
        gpu_per_job=shape.gpu_per_job,
        max_jobs=shape.max_jobs,
        cpus_per_job=shape.cpus_per_job,
        profile=shape.profile,
        consumer=shape.consumer,
    )
    return new, decision


def _why(
    shape: Shape,
    answer: Answer | None,
    origin: str,
    fetched: str | None,
    unreached: str | None,
    *,
    per_job: int,
    capped: bool,
) -> str:
    """The decision in one line."""
    where = "" if unreached is None else f"the manager gave no answer ({unreached}); "
    if answer is None:
        return f"{where}no earlier answer kept: the declared {format_size(shape.per_job)} per job"
    if origin == "cache":
        where += f"the answer kept from {fetched or 'an earlier run'}: "
    if answer.source == "declared" and not _above(shape, answer):
        return f"{where}the manager has learned nothing of {shape.profile} yet: the declared size"
    scope = answer.source + (f" {answer.node_class}" if answer.source == "class" and answer.node_class else "")
    if answer.source in ("floor", "declared"):
        scope = f"the floor an OOM kill or pressure stop in class {answer.node_class or '?'} set"
    learned = f"learned {format_size(answer.per_job_bytes or 0)} per job ({answer.samples} sample(s), {scope})"
    declared = format_size(shape.per_job)
    if capped:
        return f"{where}{learned} is above this node's ceiling: taken as the ceiling, so no job fits"
    if (answer.per_job_bytes or 0) < shape.per_job and per_job == shape.per_job:
        return f"{where}{learned} is below the declared {declared}: kept at the declared size (--learned-may-lower)"
    if per_job == shape.per_job:
        return f"{where}{learned}: the declared size"
    return f"{where}{learned}, declared {declared}"
