"""Why a child died: the one exit classifier of ``run`` (workers) and ``verify`` (allocation children).

The kernel's OOM killer ends its victim with SIGKILL (mm/oom_kill.c, ``__oom_kill_process``);
so does an operator's ``kill -9``. What tells them apart is the memory cgroup's ``oom_kill``
counter (``memory.events`` on v2, ``memory.oom_control`` on v1; see ``probes/counters.py``),
read before the child started and after it was reaped: a SIGKILL while the counter rose is an
OOM kill. When the counter cannot be read, a SIGKILL stays a "signal" with a note saying so.

The return code is as ``subprocess.Popen`` gives it (``os.waitstatus_to_exitcode``): the exit
status, or minus the signal number.
"""

from __future__ import annotations

import signal

CLEAN = "clean"
EXIT = "exit"
SIGNAL = "signal"
OOM_KILL = "oom-kill"
REASONS = (CLEAN, EXIT, SIGNAL, OOM_KILL)
NO_COUNTER = "no oom_kill counter is readable: an OOM kill cannot be told from another SIGKILL"


def classify(returncode: int, oom_before: int | None, oom_after: int | None) -> tuple[str, str | None]:
    """(one of ``REASONS``, a note when the OOM counter could not be read)."""
    if returncode == 0:
        return CLEAN, None
    if returncode > 0:
        return EXIT, None
    if returncode == -signal.SIGKILL:
        if oom_before is None or oom_after is None:
            return SIGNAL, NO_COUNTER
        if oom_after > oom_before:
            return OOM_KILL, None
    return SIGNAL, None


def exit_fields(returncode: int) -> dict[str, int | None]:
    """``{"exit_code", "signal"}`` of an event or a verify child: one of them is None."""
    return {
        "exit_code": returncode if returncode >= 0 else None,
        "signal": -returncode if returncode < 0 else None,
    }


def shell_status(returncode: int) -> int:
    """The status a shell would report for the child: the code, or 128 + the signal."""
    return returncode if returncode >= 0 else 128 - returncode
