"""How ``verify`` spreads its target over at most N child processes (issue #37, item 3).

The target is made of *shares*: the baseline and one share per planned job (a plan), or N equal
slices of the budget (a bare budget). Before, each share was its own child process, so
``verify --budget 32MiB --per-job 1KiB`` (a plan of 32,768 jobs) forked until the machine
refused: 400 children and 1.7 GiB of interpreters in 13 s under a pids limit of 400, then a
traceback. Now at most ``--children`` processes (``default_children``) allocate: each maps the
sum of its shares once and writes every page, so a plan of any size costs N interpreters.

Each child's ``Load`` says which shares it holds, in runs of equal shares ("COUNTxBYTES" on the
child's command line, ``_alloc``'s protocol), so the result still counts jobs: a job is
delivered when the child that holds it wrote all of its memory and held it.

Pure: no I/O, no processes; ``runner.py`` starts the children.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from oomguard.errors import BudgetUnknownError
from oomguard.policy.plan import Shape, make_plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Plan, Report

# The default cap on children: faulting pages in is CPU work (the kernel zeroes each page, the
# child writes it), so more children than CPUs fault no faster; each child is an interpreter
# (about 10 MiB and a PID) that the measurement includes. 8 keeps that overhead under 100 MiB and
# the per-child progress lines on one screen, and was already the bare budget's child count.
DEFAULT_CHILDREN = 8
MAX_CHILDREN = 256  # --children: 1..256; more would be the fork bomb again (256 x 10 MiB)


@dataclass(frozen=True)
class Load:
    """What one child allocates: runs of (count, bytes) shares; *jobs* of them are planned jobs."""

    runs: tuple[tuple[int, int], ...]
    jobs: int = 0
    baseline_bytes: int = 0

    @property
    def bytes(self) -> int:
        return sum(count * size for count, size in self.runs)

    @property
    def shares(self) -> int:
        return sum(count for count, _ in self.runs)

    def argv(self) -> list[str]:
        """The child's arguments: one ``COUNTxBYTES`` per run (``_alloc``'s protocol)."""
        return [f"{count}x{size}" for count, size in self.runs]


def default_children(report: Report) -> int:
    """The CPUs this process may use (the report's effective CPUs), at most ``DEFAULT_CHILDREN``."""
    cpus = report["cpu"]["effective_cpus"] or os.cpu_count() or 1
    return max(1, min(int(cpus), DEFAULT_CHILDREN))


def _even(total: int, parts: int) -> list[int]:
    """*total* split into *parts* whole numbers that differ by at most one, largest first."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def spread(baseline: int, jobs: int, per_job: int, children: int) -> list[Load]:
    """*jobs* shares of *per_job* bytes and a *baseline* share (0: none) over at most *children*
    children, the bytes as even as whole shares allow: the baseline's child takes fewer jobs."""
    units = jobs + (1 if baseline else 0)
    n = min(children, units)
    if n <= 0:
        return []
    if not baseline:
        return [Load(((k, per_job),), jobs=k) for k in _even(jobs, n) if k]
    if n == 1:
        return [Load(((1, baseline), (jobs, per_job)) if jobs else ((1, baseline),), jobs, baseline)]
    ideal = (baseline + jobs * per_job) / n
    beside = min(jobs, max(0, round((ideal - baseline) / per_job)))  # jobs in the baseline's child
    first = Load(((1, baseline), (beside, per_job)) if beside else ((1, baseline),), beside, baseline)
    return [first] + [Load(((k, per_job),), jobs=k) for k in _even(jobs - beside, n - 1) if k]


def plan_loads(report: Report, shape: Shape | None, fraction: float, children: int) -> tuple[list[Load], Plan | None]:
    """Each child's load, and the plan when a shape was given. A share that *fraction* rounds
    down to 0 bytes is not allocated (nor counted among the jobs)."""
    budget = report["budget"]["bytes"]
    if budget is None:
        raise BudgetUnknownError("verify")
    if shape is None:
        slices = (int(s * fraction) for s in _even(budget, children))
        return [Load(((1, s),)) for s in slices if s > 0], None
    plan = make_plan(report, shape)
    per_job, baseline = int(shape.per_job * fraction), int(shape.baseline * fraction)
    jobs = plan["concurrency"] if per_job > 0 else 0
    return spread(baseline, jobs, per_job, children), plan
