"""What one run of a profiled worker really used, for the fleet manager's recommender (issue 23).

``run --profile NAME --manager URL`` sends one observation per worker exit, beside the exit
event, built here from that event and the run's shape:

- ``peak_per_job_bytes``: the run's peak (``peak.py``: the worker's own group with ``--isolate``,
  else the largest ``VmHWM`` of its tree) minus the shape's baseline, divided by the concurrency;
- ``declared_per_job_bytes`` and ``declared_baseline_bytes``: the shape's, ``concurrency``: the
  run's; ``peak_baseline_bytes``: null, not measured (the supervisor cannot tell when the jobs
  begin);
- ``outcome``: ``oom-kill`` and ``pressure-stop`` as the exit's reason; ``ok`` for a clean exit or
  an exit with a status (its peak is still a peak). A run ended by a signal from outside, or
  without a known peak or concurrency, is no observation, but for an OOM kill: the lesson that
  matters most. Without ``--isolate`` the OOM reaper often empties a killed worker before it
  exits, so its peak is unknown (``peak.py``); the kernel killed it at the limit, though, so its
  peak is taken as the limit (``effective_bytes``) less what the group's other processes held
  (``outside_bytes``): what the worker had reached when it was killed. ``tests/integration/test_miniature.py``
  lost its only kill without this, under load.

Its bias, and which way: the baseline is taken as declared, so a worker whose real baseline is
larger reads its jobs as larger (the safe way); jobs that peak at different times share the
peak, so each reads low (the manager's margin and its floor after a kill bound that); without
``--isolate`` the peak is one process's, so jobs in separate processes read low, much more so.
Without the operator's class (``--node-class``, ``OOMGUARD_NODE_CLASS``: the ``node_class`` label),
the manager gives the observation the node's class from its latest report.
"""

from __future__ import annotations

from typing import Any

from oomguard._types import Outcome
from oomguard.policy.plan import Shape
from oomguard.supervisor.exits import CLEAN, EXIT, OOM_KILL, PRESSURE_STOP

# The exit's reason (oomguard._types.ExitReason) -> the observation's outcome (Outcome); a signal is none.
OUTCOME_OF_REASON: dict[str, Outcome] = {CLEAN: "ok", EXIT: "ok", OOM_KILL: "oom-kill", PRESSURE_STOP: "pressure-stop"}


def observation(
    exit_event: dict[str, Any], shape: Shape | None, node_class: str | None = None
) -> dict[str, Any] | None:
    """The observation of the run that *exit_event* ended (a supervisor event), or None: not an
    exit, no profile, or nothing to learn from it. *node_class*: the operator's (the node's
    ``node_class`` label), sent when given."""
    if exit_event.get("event") != "exit" or shape is None or shape.profile is None:
        return None
    outcome = OUTCOME_OF_REASON.get(str(exit_event.get("reason")))
    peak, jobs, when = exit_event.get("peak_bytes"), exit_event.get("concurrency"), exit_event.get("time")
    limit, outside = exit_event.get("effective_bytes"), exit_event.get("outside_bytes")
    if outcome == "oom-kill" and not isinstance(peak, int) and isinstance(limit, int):
        peak = max(0, limit - (outside if isinstance(outside, int) else 0))  # killed at the limit
    if outcome is None or not isinstance(peak, int) or not isinstance(jobs, int) or jobs < 1 or not when:
        return None
    return {
        "profile": shape.profile,
        **({"node_class": node_class} if node_class else {}),
        "declared_per_job_bytes": shape.per_job,
        "peak_per_job_bytes": max(0, peak - shape.baseline) // jobs,
        "declared_baseline_bytes": shape.baseline,
        "peak_baseline_bytes": None,
        "concurrency": jobs,
        "outcome": outcome,
        "time": when,
    }
