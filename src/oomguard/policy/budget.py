"""The budget, and ``probe()``, the public one-call entry point (probe + budget).

The budget: how much memory a worker should plan to use, and where the number came from.

Precedence: ``--budget`` flag, then ``OOMGUARD_BUDGET`` in the probed environment, then auto.

- auto: basis = min(effective_bytes, soft_limit_bytes); budget = basis - margin, where the
  default margin is min(10 GiB, max(256 MiB, 10% of basis)); ``--margin`` overrides it.
- explicit (``SIZE`` or ``PCT%`` of the basis): kept as the operator's override, with no
  margin; above the hard ceiling it adds warning ``budget-exceeds-limit``, and it fails every
  gate (``check --require``, ``plan --require-jobs``, ``run``: ``over_limit()``) unless the
  operator says it is meant (``--allow-over-limit`` or ``OOMGUARD_ALLOW_OVER_LIMIT=1``): a budget
  above the ceiling is the outage itself (a 503 GiB budget in a 342 GiB container), and the
  kernel OOM-kills a worker that uses it at the ceiling ("memory.max: ... If a cgroup's memory
  usage reaches this limit and can't be reduced, the OOM killer is invoked", cgroup-v2.rst;
  cgroup-v1/memory.rst §2.5: "When a cgroup goes over its limit, we first try to reclaim ...
  If the reclaim is unsuccessful, an OOM routine is invoked"). Swap-backed or deliberately
  overcommitted set-ups are why the override exists.

Warnings about the budget: ``budget-unknown``, ``budget-exceeds-limit``,
``budget-exceeds-soft-limit``, ``budget-too-small`` (a budget of 0: a worker given it cannot
run, and ``run`` refuses to start one; with a plan, ``plan.py`` also warns when the baseline
and one job do not fit), and ``oom-kills-seen``: the memory cgroup's ``oom_kill`` counter is
above 0, so processes in this group were OOM-killed since it was made; a budget computed
from this group's limit did not prevent that, or the kills came before it was used
(v2 ``memory.events``, v1 ``memory.oom_control``: Documentation/admin-guide/cgroup-v2.rst and
cgroup-v1/memory.rst, "oom_kill: The number of processes belonging to this cgroup killed by
any kind of OOM killer").
"""

from __future__ import annotations

from oomguard.errors import ThresholdError, UsageError
from oomguard.probes import probe_system
from oomguard.report import add_warning
from oomguard.sources.root import Root, open_root
from oomguard.units import GiB, MiB, format_size, format_size_precise, parse_size_or_percent

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from oomguard._types import BudgetSection, BudgetSource, Report

ENV_BUDGET = "OOMGUARD_BUDGET"
ENV_ALLOW_OVER_LIMIT = "OOMGUARD_ALLOW_OVER_LIMIT"
_YES, _NO = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
MARGIN_MIN = 256 * MiB
MARGIN_MAX = 10 * GiB
MARGIN_RATIO = 0.10


def default_margin(basis: int) -> int:
    """min(10 GiB, max(256 MiB, 10% of basis)), never more than the basis itself."""
    return min(basis, MARGIN_MAX, max(MARGIN_MIN, int(basis * MARGIN_RATIO)))


# The guard margin: how far under the ceiling ``run --guard`` stops a worker and
# ``MemoryBudget(watch=True)`` stops admitting. One definition, used by both.
GUARD_MARGIN_MIN = 64 * MiB
GUARD_MARGIN_RATIO = 0.02


def guard_margin(ceiling: int, size: int | None = None, pct: float | None = None) -> int | None:
    """The guard margin under *ceiling*: *size*, *pct* % of the ceiling, or max(64 MiB, 2% of it).

    None when it leaves no room under the ceiling (margin >= ceiling: with the default, a ceiling
    of 64 MiB or less). There is then no line to guard: ``run --guard`` runs without the guard and
    ``MemoryBudget(watch=True)`` admits by reserved bytes only, each saying why (docs/guard.md).
    """
    if size is not None:
        margin = size
    elif pct is not None:
        margin = int(ceiling * pct / 100)
    else:
        margin = max(GUARD_MARGIN_MIN, int(ceiling * GUARD_MARGIN_RATIO))
    return margin if margin < ceiling else None


def budget_basis(report: Report) -> int | None:
    mem = report["memory"]
    hard, soft = mem["effective_bytes"], mem["soft_limit_bytes"]
    if hard is None:
        return soft
    return min(hard, soft) if soft is not None else hard


def _amount(text: str, what: str, basis: int | None) -> int | None:
    size, pct = parse_size_or_percent(text, what)
    if pct is None:
        return size
    return None if basis is None else int(basis * pct / 100)


def resolve_budget(
    report: Report,
    budget: str | None = None,
    margin: str | None = None,
    env: dict[str, str] | None = None,
) -> BudgetSection:
    """Fill ``report["budget"]`` (and warnings) and return it.

    *budget* is the flag's text (None when not given); *env* the probed environment.
    Raises ``UsageError`` for an invalid size, naming the flag or the variable.
    """
    env = env or {}
    if budget is not None and budget.strip().lower() != "auto":
        source: BudgetSource = "explicit"
        requested, what = budget, "--budget"
    elif budget is None and env.get(ENV_BUDGET, "").strip() and env[ENV_BUDGET].strip().lower() != "auto":
        requested, what, source = env[ENV_BUDGET], ENV_BUDGET, "env"
    else:
        requested, what, source = "auto", "--budget", "auto"
    basis = budget_basis(report)
    margin_bytes: int | None = None
    if source == "auto":
        margin_bytes = _amount(margin, "--margin", basis) if margin is not None else None
        if basis is not None and margin_bytes is None:
            margin_bytes = default_margin(basis)
        value = None if basis is None or margin_bytes is None else max(0, basis - margin_bytes)
    else:
        value = _amount(requested, what, basis)
    section: BudgetSection = {
        "bytes": value,
        "source": source,
        "basis_bytes": basis,
        "safety_margin_bytes": margin_bytes,
        "requested": requested,
    }
    report["budget"] = section
    _check(report, section)
    _oom_kills_seen(report)
    return section


def _oom_kills_seen(report: Report) -> None:
    oom = report["memory"]["oom"]
    if oom is not None and oom["oom_kill"]:
        add_warning(
            report["warnings"],
            "oom-kills-seen",
            f"the memory cgroup's oom_kill counter is {oom['oom_kill']} ({oom['source']}): processes in "
            "this group were OOM-killed since it was made",
        )


def _too_small(report: Report, b: BudgetSection, value: int) -> None:
    if b["source"] == "auto" and b["basis_bytes"] is not None:
        why = (
            f"the {format_size(b['safety_margin_bytes'])} safety margin takes all of the "
            f"{format_size(b['basis_bytes'])} basis ({report['memory']['limited_by']})"
        )
    else:
        why = f"as given ({b['requested']!r})"
    add_warning(
        report["warnings"],
        "budget-too-small",
        f"the {b['source']} budget is {format_size(value)}: {why}; a worker given it cannot run "
        "(oomguard run does not start one)",
    )


def _check(report: Report, b: BudgetSection) -> None:
    warnings = report["warnings"]
    value, mem = b["bytes"], report["memory"]
    if value is None:
        add_warning(warnings, "budget-unknown", "the memory ceiling is unknown, so no budget could be computed")
        return
    if value <= 0:
        _too_small(report, b, value)
    if b["source"] == "auto":
        return
    if mem["effective_bytes"] is not None and value > mem["effective_bytes"]:
        add_warning(
            warnings,
            "budget-exceeds-limit",
            f"the {b['source']} budget {format_size(value)} is above the hard ceiling "
            f"{format_size(mem['effective_bytes'])} ({mem['limited_by']}); the worker may be OOM-killed",
        )
    elif mem["soft_limit_bytes"] is not None and value > mem["soft_limit_bytes"]:
        add_warning(
            warnings,
            "budget-exceeds-soft-limit",
            f"the {b['source']} budget {format_size(value)} is above the soft limit "
            f"{format_size(mem['soft_limit_bytes'])} (memory.high); the worker will be throttled",
        )


def allow_over_limit(flag: bool, env: Mapping[str, str]) -> bool:
    """``--allow-over-limit`` given, or ``OOMGUARD_ALLOW_OVER_LIMIT`` set to 1/true/yes/on in *env*.

    Raises ``UsageError`` for any other value of the variable (0/false/no/off or empty: not allowed).
    """
    text = env.get(ENV_ALLOW_OVER_LIMIT, "").strip().lower()
    if text not in _YES + _NO:
        raise UsageError(f"{ENV_ALLOW_OVER_LIMIT}: expected 1 or 0 (yes/no, true/false, on/off), got {text!r}")
    return flag or text in _YES


def over_limit(report: Report) -> str | None:
    """Why the report's explicit budget must not pass a gate: it is above the hard ceiling; else None.

    Names both numbers and where each came from. An auto budget is never above the ceiling, and
    an unknown budget or ceiling is said by ``budget-unknown`` instead.
    """
    b, mem = report["budget"], report["memory"]
    value, ceiling = b["bytes"], mem["effective_bytes"]
    if b["source"] == "auto" or value is None or ceiling is None or value <= ceiling:
        return None
    given = f"--budget {b['requested']}" if b["source"] == "explicit" else f"{ENV_BUDGET}={b['requested']}"
    where = mem["limit_file"] or mem["limited_by"]
    return (
        f"the {b['source']} budget {format_size_precise(value)}, from {given}, is above the hard ceiling "
        f"{format_size_precise(ceiling)} ({mem['limited_by']}, {where}): the kernel OOM-kills a worker that "
        f"uses it at the ceiling; --allow-over-limit (or {ENV_ALLOW_OVER_LIMIT}=1) if it is meant"
    )


def gate_over_limit(report: Report, flag: str, *, allowed: bool) -> None:
    """Raise ``ThresholdError`` (exit 3), worded for *flag*, when ``over_limit()`` says why and it is not *allowed*."""
    why = None if allowed else over_limit(report)
    if why is not None:
        raise ThresholdError(f"{flag}: {why}")


def require(report: Report, minimum: int, *, allowed_over_limit: bool = False) -> None:
    """Raise ``ThresholdError`` (exit 3) when the budget is unknown or below *minimum*, or above the
    hard ceiling (an explicit one, unless *allowed_over_limit*)."""
    gate_over_limit(report, "--require", allowed=allowed_over_limit)
    value = report["budget"]["bytes"]
    if value is None or value < minimum:
        have = "unknown" if value is None else format_size(value)
        raise ThresholdError(f"--require: budget {have} is below the required {format_size(minimum)}")


def probe(
    root: Root | str | None = None,
    budget: str | None = None,
    margin: str | None = None,
    *,
    gpu: bool = True,
    gpu_timeout: float = 5.0,
) -> Report:
    """Probe the live system (or a snapshot: a ``Root``, directory or tarball) into a report.

    *budget* and *margin* take the same text as ``--budget``/``--margin``; without
    *budget*, ``OOMGUARD_BUDGET`` from the probed environment applies, then auto.
    *gpu* False skips the GPU probe; *gpu_timeout* bounds NVML and nvidia-smi (seconds).
    Raises ``UsageError`` for invalid sizes and ``SnapshotError`` for a bad snapshot.
    """
    r = root if isinstance(root, Root) else open_root(root)
    env = r.environ()
    report = probe_system(r, env, gpu=gpu, gpu_timeout=gpu_timeout)
    resolve_budget(report, budget=budget, margin=margin, env=env)
    return report
