"""Whether ``run`` may start the worker with this budget, and what it says when it does.

A budget that cannot work is not handed to a worker (docs/run.md, "Before each start"):

- a budget of 0 (or less): an auto budget whose safety margin eats the whole basis (a 256 MiB
  group and the 256 MiB margin floor), ``--budget 0``, ``0%``;
- with plan flags, a budget below the plan's baseline + one job, or any plan that fits no job
  (RLIMIT_MEMLOCK below the pinned baseline, no GPU for a job that needs one);
- an explicit budget (``--budget``, ``OOMGUARD_BUDGET``) above the hard ceiling, unless
  ``--allow-over-limit`` (``policy.budget.over_limit``: the same sentence ``check --require`` and
  ``plan --require-jobs`` refuse with).

``run`` then starts nothing: a ``give-up`` event whose message says why, and exit 3, as
``check`` warns ``budget-too-small`` and ``plan --require-jobs 1`` exits 3 for the same numbers.
What an OOM kill or a pressure stop teaches never leads here (``adapt.py`` keeps the last
workable budget): an auto budget is refused for its limits alone (a 256 MiB group). An explicit
budget that starts above the hard ceiling (only with ``--allow-over-limit``) or above the soft
limit (within the ceiling) is said as a warning on the start event (``warnings`` codes, and the
message).
"""

from __future__ import annotations

from typing import Any

from oomguard.policy.budget import over_limit
from oomguard.units import format_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Plan, Report, WarningEntry

START_WARNINGS = ("budget-exceeds-limit", "budget-exceeds-soft-limit")


def _empty_budget(report: Report, budget: int) -> str:
    b, mem = report["budget"], report["memory"]
    if b["source"] == "auto" and b["basis_bytes"] is not None:
        return (
            f"the budget is {format_size(budget)}: the {format_size(b['safety_margin_bytes'])} safety margin "
            f"takes all of the {format_size(b['basis_bytes'])} basis ({mem['limited_by']})"
        )
    return f"the {b['source']} budget is {format_size(budget)} ({b['requested']!r})"


def refusal(report: Report, budget: int, plan: Plan | None, *, allow_over_limit: bool = False) -> str | None:
    """Why the worker must not start with *budget* (and *plan*), in one sentence; None when it may."""
    if budget <= 0:
        return _empty_budget(report, budget) + "; not starting the worker"
    above = None if allow_over_limit else over_limit(report)
    if above is not None:
        return above + "; not starting the worker"
    if plan is None or plan["concurrency"] > 0:
        return None
    shape = plan["shape"]
    need = shape["baseline_bytes"] + shape["per_job_bytes"]
    if plan["binding"] == "memory" and budget < need:
        return (
            f"the budget {format_size(budget)} is below the plan's baseline {format_size(shape['baseline_bytes'])} "
            f"+ one job {format_size(shape['per_job_bytes'])} = {format_size(need)}; not starting the worker"
        )
    return f"the plan fits 0 jobs ({plan['explanation']}); not starting the worker"


def start_warnings(report: Report) -> list[WarningEntry]:
    """The report's warnings that ``run`` repeats when it starts the worker."""
    return [w for w in report["warnings"] if w["code"] in START_WARNINGS]


def start_note(report: Report, lifted: str | None) -> dict[str, Any]:
    """The start event's ``warnings`` (codes) and ``message``: the warnings, then what was lifted."""
    warned = start_warnings(report)
    notes = [f"warning {w['code']}: {w['message']}" for w in warned] + ([lifted] if lifted else [])
    return {"warnings": [w["code"] for w in warned] or None, "message": "; ".join(notes) or None}
