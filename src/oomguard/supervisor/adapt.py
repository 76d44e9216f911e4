"""What earlier OOM kills changed for the next start of ``run``, and when that is forgotten.

After an ``oom-kill``, and after a ``pressure-stop`` of ``run --guard`` (the same lesson, learnt
before the kernel acted), the next start asks for less (docs/run.md, "Restarts"):

- ``--on-oom concurrency`` (the default with plan flags): a cap one job below what ran, never
  below ``--min-concurrency``;
- ``--on-oom margin`` (the default otherwise): an auto budget's safety margin grows by
  max(256 MiB, 5% of the basis) after an OOM kill, by 5% of the basis after a pressure stop; an
  explicit budget is kept as given. A pressure stop came at the stop line, before the kernel
  acted, so the step is proportional to the group: a 256 MiB floor would take a third of a
  768 MiB group at once (measured in bench/guard.py: the restarted worker then ran its jobs
  at two thirds of the room, 2.0-2.4x the ideal makespan).

  No step leaves a budget that cannot work (``admit.py`` would refuse the start, and ``run``
  exit 3, over a lesson): a step that would is capped at half of the budget left, in whole MiB
  (a 512 MiB group's 256 MiB budget: 128 MiB after an OOM kill, not 0), and where even that
  cannot work (under 2 MiB left, or a plan that fits no job) no step is taken: the last workable
  budget is kept.

An OOM kill while the worker stops for the guard (``run --guard`` sent SIGTERM at its stop
line, and the kernel killed the worker in its graceful stop) teaches the grace, not this:
``lesson`` says ``GRACE``, and ``grace.py`` keeps more room under the stop line next time. The
worker was stopped before the kernel acted; what the kernel killed was its shutdown, which met
the group's limit ("If a cgroup's memory usage reaches this limit and can't be reduced, the OOM
killer is invoked", cgroup-v2.rst, "memory.max"; cgroup-v1/memory.rst §2.5). A smaller budget or
plan would not make that room, since the stop line is the ceiling's (less the guard margin and
the grace), not the budget's. The next stop, which finishes, is a pressure stop and asks for
less as such.

Both are lessons about one limit and one plan, so both are forgotten (back to the plan as
computed) when either changes: the hard ceiling or the soft limit (``memory.effective_bytes``,
``memory.soft_limit_bytes``: a resize, a new container), or the concurrency the plan gives
before any cap. They are also forgotten after a run of at least ``--healthy-after`` that did
not end in an OOM kill: the worker proved it fits, so the next start may try the plan again.
"""

from __future__ import annotations

from collections.abc import Callable

from oomguard.units import MiB, format_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import BudgetSection, Report

# The margin step: max(256 MiB, 5% of the basis). 256 MiB is also the floor of the default
# margin (policy/budget.py MARGIN_MIN), so a small basis still moves visibly.
OOM_STEP_MIN = 256 * MiB
OOM_STEP_RATIO = 0.05

# What the lessons of OOM kills were learnt under: (hard ceiling, soft limit, uncapped plan).
Situation = tuple[int | None, int | None, int | None]
# The ends that ask for less next time, and how a restart event names them.
STEP_DOWN = {"oom-kill": "an OOM kill", "pressure-stop": "a pressure stop"}
# The lesson of an OOM kill in the worker's graceful stop for the guard: more grace (grace.py).
GRACE = "grace"


def lesson(reason: str, *, guard_stopped: bool) -> str | None:
    """What an end of *reason* teaches the next start: ``GRACE`` for an OOM kill after the guard
    had stopped the worker (*guard_stopped*), *reason* for another OOM kill or a pressure stop
    (``Adaptation.after_oom`` asks for less), None for any other end."""
    if reason == "oom-kill" and guard_stopped:
        return GRACE
    return reason if reason in STEP_DOWN else None


def budget_left(basis: int, margin: int) -> int:
    """The auto budget *margin* leaves of *basis*, in whole MiB as ``run`` hands it out."""
    return max(0, basis - margin) // MiB * MiB


def oom_margin_step(basis_bytes: int | None) -> int:
    """How much an auto budget's margin grows after one OOM kill: max(256 MiB, 5% of the basis)."""
    return max(OOM_STEP_MIN, int((basis_bytes or 0) * OOM_STEP_RATIO))


def pressure_margin_step(basis_bytes: int | None) -> int:
    """How much it grows after one pressure stop: 5% of the basis (1 MiB at least)."""
    return max(MiB, int((basis_bytes or 0) * OOM_STEP_RATIO))


def situation_of(report: Report, planned: int | None) -> Situation:
    """What the lessons were learnt under: the hard ceiling, the soft limit, the uncapped plan."""
    mem = report["memory"]
    return mem["effective_bytes"], mem["soft_limit_bytes"], planned


def _describe(key: Situation) -> str:
    hard, soft, planned = key
    text = f"ceiling {format_size(hard)}"
    if soft is not None:
        text += f", soft limit {format_size(soft)}"
    return text + (f", plan {planned} jobs" if planned is not None else "")


class Adaptation:
    """The concurrency cap and the extra margin, with the situation they were set under."""

    def __init__(self, on_oom: str, min_concurrency: int = 1) -> None:
        self.on_oom = on_oom
        self.min_concurrency = min_concurrency
        self.cap: int | None = None
        self.extra_margin = 0
        self._under: Situation | None = None

    @property
    def active(self) -> bool:
        return self.cap is not None or self.extra_margin > 0

    def _lifted(self) -> str:
        parts = [f"the concurrency cap {self.cap}"] if self.cap is not None else []
        if self.extra_margin:
            parts.append(f"the extra safety margin +{format_size(self.extra_margin)}")
        self.cap, self.extra_margin = None, 0
        return " and ".join(parts) + " from earlier OOM kills lifted"

    def check(self, now: Situation) -> str | None:
        """Before a start: forget the lessons when the situation changed; what was said, if anything."""
        if not self.active or self._under is None or now == self._under:
            return None
        was = self._under
        return f"{self._lifted()}: {_describe(was)} -> {_describe(now)}"

    def after_run(self, uptime: float, healthy_after: float, reason: str) -> str | None:
        """After a run: forget the lessons once the worker ran healthy without an OOM kill."""
        if not self.active or reason in STEP_DOWN or uptime < healthy_after:
            return None
        return f"{self._lifted()}: ran {uptime:.1f}s (--healthy-after {healthy_after:g}s) without an OOM kill"

    def after_oom(
        self,
        report: Report,
        concurrency: int | None,
        under: Situation,
        reason: str = "oom-kill",
        *,
        workable: Callable[[int], bool] | None = None,
    ) -> str:
        """Ask for less next time (after *reason*: an OOM kill or a pressure stop); the restart
        event's message says what. *workable*: whether a start with an auto budget of so many
        bytes would be admitted (``admit.refusal``; without it, any budget above 0)."""
        self._under = under
        after = f"after {STEP_DOWN.get(reason, reason)}"
        if self.on_oom == "concurrency" and concurrency is not None:
            lowered = max(self.min_concurrency, concurrency - 1)
            self.cap = lowered
            if lowered == concurrency:
                return f"{after}: concurrency stays {concurrency} (--min-concurrency)"
            return f"{after}: concurrency {concurrency} -> {lowered}"
        b = report["budget"]
        if b["source"] != "auto":
            return f"{after}: the {b['source']} budget is kept as given (only an auto budget is lowered)"
        step = (pressure_margin_step if reason == "pressure-stop" else oom_margin_step)(b["basis_bytes"])
        return self._raise_margin(b, step, after, workable or (lambda budget: budget > 0))

    def _raise_margin(self, b: BudgetSection, step: int, after: str, workable: Callable[[int], bool]) -> str:
        """Grow the extra margin by *step*, capped so that the budget left still works (the module's docstring)."""
        basis, margin = b["basis_bytes"], b["safety_margin_bytes"]
        said = ""
        if basis is not None and margin is not None and not workable(budget_left(basis, margin + step)):
            now = budget_left(basis, margin)
            half = now // 2 // MiB * MiB
            if half == 0 or not workable(budget_left(basis, margin + half)):
                return (
                    f"{after}: the safety margin stays +{format_size(self.extra_margin)}: a step of "
                    f"{format_size(step)} would leave no budget that works; the last workable budget "
                    f"{format_size(now)} is kept"
                )
            said = (
                f": half of the {format_size(now)} budget left, since a step of {format_size(step)} "
                "would leave no budget that works"
            )
            step = half
        self.extra_margin += step
        return f"{after}: safety margin raised by {format_size(step)} (now +{format_size(self.extra_margin)}){said}"

    def capped(self, planned: int | None) -> int | None:
        return planned if planned is None or self.cap is None else min(planned, self.cap)
