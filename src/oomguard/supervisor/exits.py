"""Why a child died: the one exit classifier of ``run`` (workers) and ``verify`` (allocation children).

The kernel's OOM killer ends its victim with SIGKILL (mm/oom_kill.c, ``__oom_kill_process``);
so does an operator's ``kill -9``. What tells them apart is the memory cgroup's ``oom_kill``
counter, read before the child started and after it was reaped (``probes/counters.py``):

- v2 ``memory.events``: "oom_kill: The number of processes belonging to this cgroup killed by
  any kind of OOM killer" (Documentation/admin-guide/cgroup-v2.rst 5-2-1, "Memory Interface
  Files"), hierarchical;
- v1 ``memory.oom_control``: the same counter, since Linux 4.13
  (Documentation/admin-guide/cgroup-v1/memory.rst §10, "OOM Control"), the group's own processes.

The counter says how many processes of the group died, not which, nor when. ``Evidence`` carries
its rise (``kills``) and how many processes outside the caller's tree left the group around the
kills (``others_gone``, ``supervisor/members.py``); ``inside`` kills at least fell inside the tree
(``kills - others_gone`` where nothing more is known). ``run`` also knows when each kill happened
(``supervisor/oomwatch.py``: the kernel's OOM notification) and whether the worker was still
running, with no SIGKILL pending, just after it: such a kill was not the worker's (``spared``),
and ``at_end`` of the ``inside`` kills came while the worker may have been their victim. The
verdict, for a child that did not exit 0:

| the counter  | inside the tree        | SIGKILL                     | another end (code, signal)      |
|--------------|------------------------|-----------------------------|---------------------------------|
| unreadable   | -                      | signal (``NO_COUNTER``)      | exit / signal                   |
| did not rise | -                      | signal (a kill -9)          | exit / signal                   |
| rose         | at least one           | oom-kill, victim worker (2) | oom-kill, victim descendant (1) |
| rose         | maybe none             | signal, victim group        | exit / signal, victim group     |
| rose         | the worker outlived it | signal, victim group (3)    | as the two rows above           |

(1) a wrapper's child: only with *descendants* (``verify``'s children have none).
(2) at least one of them while the worker may have been the victim (``at_end``).
(3) the worker ran on after each kill, so its SIGKILL came from elsewhere: an operator's
``kill -9`` long after a neighbour's OOM kill is not blamed on the OOM killer.
"victim group" says it in words: an OOM kill happened in the group during the run, and it
cannot be told whether it was this process. A child that exits 0 stays ``clean``; a counter
that rose meanwhile is said in the note. With ``run --isolate`` nothing else is in the group,
so the attribution is exact.

``run --guard`` stops a worker before the kernel acts (``supervisor/guard.py``): its end is a
``pressure-stop`` (``pressure_stopped``) unless the OOM killer was faster, which the counter
shows: an ``oom-kill`` stays one.

The return code is as ``subprocess.Popen`` gives it (``os.waitstatus_to_exitcode``): the exit
status, or minus the signal number.
"""

from __future__ import annotations

import signal
from typing import NamedTuple

from oomguard._types import EXIT_REASONS

CLEAN = "clean"
EXIT = "exit"
SIGNAL = "signal"
OOM_KILL = "oom-kill"
PRESSURE_STOP = "pressure-stop"
REASONS = EXIT_REASONS  # the one definition: oomguard._types.ExitReason (event.schema.json's enum)
# Who the OOM killer hit, as far as the evidence goes (an event's ``oom_victim``).
WORKER, DESCENDANT, GROUP = "worker", "descendant", "group"
NO_COUNTER = "no oom_kill counter is readable: an OOM kill cannot be told from another SIGKILL"
ISOLATE_HINT = "--isolate tells exactly"


class Evidence(NamedTuple):
    """What the caller measured around one child (None: unknown).

    *kills*: the counter's rise; *others_gone*: outsiders that left the group around the kills;
    *inside*: kills that fell inside the caller's tree at least (None: ``kills - others_gone``);
    *at_end*: of those, the ones that came while the worker may have been the victim (None: all);
    *spared*: kills the worker outlived, running with no SIGKILL pending just after them;
    *outlived_s*: how long before the worker's end the last of those came.
    """

    kills: int | None
    others_gone: int | None = 0
    inside: int | None = None
    at_end: int | None = None
    spared: int = 0
    outlived_s: float | None = None

    @property
    def in_tree(self) -> int:
        """Kills that fell inside the caller's tree, at least."""
        if self.inside is not None:
            return self.inside
        return (self.kills or 0) - self.others_gone if self.others_gone is not None else 0


class Verdict(NamedTuple):
    reason: str
    victim: str | None
    note: str | None


def evidence(before: int | None, after: int | None, others_gone: int | None = 0) -> Evidence:
    """Evidence from two counter readings alone (when each kill happened unknown); a counter that
    went down (the group re-made) rose by 0."""
    kills = None if before is None or after is None else max(0, after - before)
    return Evidence(kills, others_gone)


def _end(returncode: int) -> str:
    return f"code {returncode}" if returncode >= 0 else f"signal {-returncode}"


def _unplaced(e: Evidence, who: str) -> str:
    why = (
        "the group's processes could not be read"
        if e.others_gone is None
        else f"{e.others_gone} other process(es) of the group ended meanwhile"
    )
    return (
        f"an OOM kill happened in the group during the run (oom_kill +{e.kills}); cannot tell "
        f"whether it was {who} ({why}; {ISOLATE_HINT})"
    )


def _outlived(e: Evidence) -> str:
    when = f", {e.outlived_s:.1f}s before the worker ended" if e.outlived_s is not None else ""
    return (
        f"not killed by the kernel's OOM killer: the group's OOM kill (oom_kill +{e.kills}{when}) "
        "was not the worker's, which ran on after it; its SIGKILL came from elsewhere (a kill -9)"
    )


def classify(returncode: int, e: Evidence, *, descendants: bool = True) -> Verdict:
    """The verdict on one child's end (the table above); *descendants* False: it had none."""
    plain = EXIT if returncode > 0 else SIGNAL
    kills = e.kills or 0
    inside = e.in_tree
    if returncode == 0:
        if not kills or not descendants:
            return Verdict(CLEAN, None, None)
        victim = DESCENDANT if inside > 0 else GROUP
        return Verdict(CLEAN, victim, f"exited 0, but the group's oom_kill counter rose by {kills} during the run")
    sigkill = returncode == -signal.SIGKILL
    if e.kills is None:
        return Verdict(SIGNAL, None, NO_COUNTER) if sigkill else Verdict(plain, None, None)
    if not kills or not (sigkill or descendants):
        return Verdict(plain, None, None)
    if sigkill:
        if (inside if e.at_end is None else e.at_end) > 0:
            return Verdict(OOM_KILL, WORKER, None)
        if e.spared >= kills:
            return Verdict(SIGNAL, GROUP, _outlived(e))
        return Verdict(SIGNAL, GROUP, _unplaced(e, "this process"))
    if inside > 0:
        return Verdict(OOM_KILL, DESCENDANT, f"the worker then ended with {_end(returncode)}")
    return Verdict(plain, GROUP, _unplaced(e, "one of its descendants"))


def pressure_stopped(verdict: Verdict, returncode: int, why: str) -> Verdict:
    """The verdict on a worker the guard stopped for *why*: ``pressure-stop``, unless it is an OOM kill."""
    if verdict.reason == OOM_KILL:
        return verdict
    note = f"stopped by the guard before the kernel acted: {why}; the worker then ended with {_end(returncode)}"
    return Verdict(PRESSURE_STOP, verdict.victim, "; ".join(filter(None, [note, verdict.note])))


def exit_fields(returncode: int) -> dict[str, int | None]:
    """``{"exit_code", "signal"}`` of an event or a verify child: one of them is None."""
    return {
        "exit_code": returncode if returncode >= 0 else None,
        "signal": -returncode if returncode < 0 else None,
    }


def shell_status(returncode: int) -> int:
    """The status a shell would report for the child: the code, or 128 + the signal."""
    return returncode if returncode >= 0 else 128 - returncode
