"""The gate event: how the worker entrypoint's gate (``check``, ``plan``, ``verify``) came out.

deploy/worker/entrypoint.sh runs the gate before it starts anything, so a refused node would
never reach the manager. It tells the manager instead: when a step fails, with a one-shot report
and this event (``oomguard agent --once --gate STEP --gate-exit N --gate-message TEXT``); when the
gate passes, with its agent's first report (``--gate-exit 0``), so a node refused before is
cleared. Posted on ``/api/v1/events`` in the usual envelope::

    {"event": "gate", "time": "2025-01-01T00:00:00Z", "step": "check"|"plan"|"verify",
     "passed": false, "exit_code": 3, "message": "--require: budget 0 B is below the required 1 B"}

*step* is the step that failed, or the last one that ran when all passed; *passed* is
``exit_code == 0``; *message* one line of at most ``MESSAGE_MAX`` characters (the manager's limit
on an event's message), chosen from the step's output by ``gate_message``.
"""

from __future__ import annotations

from typing import Any

from oomguard._types import GATE_STEPS
from oomguard.agent.log import one_line
from oomguard.times import iso_now

STEPS = GATE_STEPS  # the one definition: oomguard._types.GateStep (event.schema.json's enum)
MESSAGE_MAX = 4000
ERROR_PREFIX = "oomguard: error: "  # how the command line says an error (oomguard/cli.py main)


def gate_message(step: str, exit_code: int, text: str) -> str:
    """The one line that says why *step* came out so, from *text* (one line, or the step's stderr).

    The last error line (``oomguard: error: --require: budget 0 B is below the required 1 B``,
    without its prefix), else the step's last own line (``oomguard verify: 1 of 2 children touched
    ...``, verify's summary), else the last line that is not blank, else what the exit code says;
    white space squeezed, a character that cannot be printed (a terminal's escape, a byte that
    was not UTF-8) shown as ``?``, cut at ``MESSAGE_MAX``.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line[len(ERROR_PREFIX) :] for line in lines if line.startswith(ERROR_PREFIX)]
    own = [line for line in lines if line.startswith(f"oomguard {step}: ")]
    chosen = next((found[-1] for found in (errors, own, lines) if found), "")
    if not chosen:
        chosen = f"oomguard {step} passed" if exit_code == 0 else f"oomguard {step} failed (exit {exit_code})"
    return "".join(c if c.isprintable() else "?" for c in one_line(chosen, MESSAGE_MAX))


def gate_event(step: str, exit_code: int, message: str, *, time: str | None = None) -> dict[str, Any]:
    """The gate event for *step* (one of ``STEPS``) with its *exit_code* and *message* (any text:
    ``gate_message`` picks its line)."""
    if step not in STEPS:
        raise ValueError(f"unknown gate step {step!r} (expected one of {', '.join(STEPS)})")
    return {
        "event": "gate",
        "time": time or iso_now(),
        "step": step,
        "passed": exit_code == 0,
        "exit_code": exit_code,
        "message": gate_message(step, exit_code, message),
    }
