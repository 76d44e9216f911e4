"""Supervisor events: JSON lines to ``--events FILE`` and one readable line each on stderr.

Every event has the same keys (null where they do not apply)::

    {"event": "start"|"exit"|"restart"|"give-up"|"stop", "time": ISO 8601 UTC, "pid",
     "budget_bytes", "concurrency", "effective_bytes", "limited_by",
     "reason": "oom-kill"|"pressure-stop"|"signal"|"exit"|"clean", "exit_code", "signal",
     "oom_kills", "oom_victim": "worker"|"descendant"|"group",
     "duration_s", "delay_s", "peak_bytes", "peak_source", "outside_bytes",
     "guard_margin_bytes", "working_set_peak_bytes", "grace_bytes", "grace_source",
     "grace_high_bytes", "stop_working_set_bytes", "stop_rate_bytes_per_s",
     "grown_after_stop_bytes", "stop_finished", "warnings", "message", "learned"}

``effective_bytes`` and ``limited_by`` are the hard ceiling the budget was computed from and
where it came from (the report's ``memory`` section), so a limit change shows as such;
``warnings`` lists the codes ``run`` printed when it started the worker (a budget above the
ceiling). An ``exit`` event's message says the peak (``peak_source``: the worker's own group's
``memory.peak`` / ``memory.max_usage_in_bytes``, else ``vmhwm``, ``supervisor/peak.py``) against
the budget and the limit; after an OOM kill, that the kernel's OOM killer acted at the limit; and
after an OOM kill or a pressure stop, ``outside_bytes``, the anonymous memory of the group's
processes outside the worker's tree, in words when it is a meaningful share (``neighbour_note``).
With ``--guard``, ``guard_margin_bytes`` is the margin below the ceiling where the guard stops
the worker, ``grace_bytes`` the room kept under that line for its graceful stop and
``grace_source`` where it came from (``given``: ``--grace-bytes``; ``learned``: this supervisor's
earlier stops, ``supervisor/grace.py``; null: none), and ``working_set_peak_bytes`` the highest
working set it sampled (``supervisor/guard.py``). After a pressure stop,
``stop_working_set_bytes`` is the working set the stop was decided at, ``stop_rate_bytes_per_s``
how fast it grew then (over the last 0.5 s of samples), ``grace_high_bytes`` the ``memory.high``
set while the worker stopped (v2 with ``--isolate``; null elsewhere),
``grown_after_stop_bytes`` how far it rose from there while the worker stopped (sampled every 20 ms),
and ``stop_finished`` whether the worker then ended by itself (false: SIGKILL at ``--stop-timeout``,
or the kernel's OOM killer during its shutdown, ended it).
With ``--learned``, ``learned`` is the decision of the start (``policy/learned.py``): the per-job
size and baseline declared, learned and used, where the answer came from, and why.

``--events FILE`` is opened without blocking (``open_events``): a FIFO nobody reads is an error at
once, not a hang. A write that fails later (a full disk) is said once on stderr and the events go on
to stderr and the sinks only.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

from oomguard.supervisor.members import Outside
from oomguard.times import iso_now
from oomguard.units import format_size

FIELDS = (
    "event",
    "time",
    "pid",
    "budget_bytes",
    "concurrency",
    "effective_bytes",
    "limited_by",
    "reason",
    "exit_code",
    "signal",
    "oom_kills",
    "oom_victim",
    "duration_s",
    "delay_s",
    "peak_bytes",
    "peak_source",
    "outside_bytes",
    "guard_margin_bytes",
    "working_set_peak_bytes",
    "grace_bytes",
    "grace_source",
    "grace_high_bytes",
    "stop_working_set_bytes",
    "stop_rate_bytes_per_s",
    "grown_after_stop_bytes",
    "stop_finished",
    "warnings",
    "message",
    "learned",
)


# The peak's source in words (supervisor/peak.py).
SOURCE_WORDS = {"vmhwm": "VmHWM"}
# Neighbours holding at least this share of the group are said, and can excuse the worker (issue 19,
# item 5: a 400 MiB neighbour in a 4 GiB group, 10%, was not said); an agent or a shell (10-30 MiB)
# in a group of several GiB stays below it.
NEIGHBOUR_SHARE = 0.05


def _peak_against(peak: int, size: int, what: str, source: str | None = None) -> str:
    """ "over its 3.6 GiB budget" or "within the 4 GiB limit (cgroup-v2, 93%)"."""
    notes = [source] if source else []
    if peak <= size and size > 0:
        notes.append(f"{peak * 100 // size}%")
    where = "over" if peak > size else "within"
    return f"{where} {what.replace('SIZE', format_size(size))}" + (f" ({', '.join(notes)})" if notes else "")


def oom_phrase(victim: str | None, limit: int | None, limited_by: str | None, kills: int | None) -> str:
    """ "killed by the kernel's OOM killer at the 4 GiB limit (cgroup-v2, oom_kill +1)".

    The memory cgroup's OOM killer acts at the limit: cgroup-v2.rst 5-2-1, "memory.max": "If a
    cgroup's memory usage reaches this limit and can't be reduced, the OOM killer is invoked in the
    cgroup"; cgroup-v1/memory.rst §2.5 ("Reclaim"): "When a cgroup goes over its limit, we first try
    to reclaim memory from the cgroup ... If the reclaim is unsuccessful, an OOM routine is invoked".
    So the peak a reader sees then (v1 usage never passes the limit) is no room left "within" it.
    """
    notes = ", ".join(filter(None, [limited_by, f"oom_kill +{kills}" if kills else None]))
    at = f" at the {format_size(limit)} limit" if limit is not None else ""
    who = "a descendant of the worker was killed" if victim == "descendant" else "killed"
    return f"{who} by the kernel's OOM killer{at}" + (f" ({notes})" if notes else "")


def peak_story(
    peak: int | None,
    budget: int | None,
    limit: int | None,
    limited_by: str | None,
    *,
    source: str | None = None,
    oom: str | None = None,
    kills: int | None = None,
    unknown: str | None = None,
    at_least: int | None = None,
) -> str | None:
    """The exit's numbers, e.g. "peak 3.5 GiB (VmHWM), within its 3.6 GiB budget (97%), within the 4 GiB
    limit (cgroup-v2, 87%)". After an OOM kill (*oom*: the victim) the limit is where the kernel acted:
    "...; killed by the kernel's OOM killer at the 4 GiB limit (cgroup-v2, oom_kill +1)", never "within"
    it. A budget above the limit is said as such, never compared with the peak. Without a peak, *unknown*
    says why in its place, and a lower bound of it (*at_least*, the last sample) above the budget is still
    "over its SIZE budget (at least)": a bound over the budget proves the peak was; one within it proves
    nothing, so nothing is said."""
    parts = [f"peak {format_size(peak)}" + (f" ({SOURCE_WORDS.get(source, source)})" if source else "")]
    if peak is None:
        parts = [unknown] if unknown else []
    if budget is not None and limit is not None and budget > limit:
        parts.append(f"its {format_size(budget)} budget is over the {format_size(limit)} limit")
    elif budget is not None and peak is not None:
        parts.append(_peak_against(peak, budget, "its SIZE budget"))
    elif budget is not None and at_least is not None and at_least > budget:
        parts.append(f"over its {format_size(budget)} budget (at least)")
    if oom is None and limit is not None and peak is not None:
        parts.append(_peak_against(peak, limit, "the SIZE limit", limited_by))
    text = ", ".join(parts)
    if oom is not None:
        text = "; ".join(filter(None, [text, oom_phrase(oom, limit, limited_by, kills)]))
    return text or None


def neighbour_share(outside: Outside | None, whole: int | None) -> Outside | None:
    """*outside* when the processes outside the worker's tree held a meaningful share
    (``NEIGHBOUR_SHARE``) of *whole* (the working set at a pressure stop, the limit at an OOM kill)."""
    if outside is None or not whole or outside.bytes < NEIGHBOUR_SHARE * whole:
        return None
    return outside


def neighbour_note(outside: Outside, whole: int, what: str) -> str:
    """ "400 MiB (10%) of the 3.92 GiB working set was outside the worker's tree (anonymous memory of pid 77)"."""
    pids = ", ".join(map(str, outside.pids[:5])) + (" ..." if len(outside.pids) > 5 else "")
    return (
        f"{format_size(outside.bytes)} ({outside.bytes * 100 // whole}%) of the {format_size(whole)} {what} was "
        f"outside the worker's tree (anonymous memory of pid {pids})"
    )


def own_share(outside: Outside, whole: int, budget: int) -> str | None:
    """Why the worker is not stepped down for a neighbour's memory, or None when its own share, *whole*
    less the neighbours', is above its *budget*."""
    own = whole - outside.bytes
    if own > budget:
        return None
    return f"the worker's own {format_size(own)} is within its {format_size(budget)} budget: nothing lowered"


def describe(e: dict[str, Any]) -> str:
    kind = e["event"]
    parts = [f"oomguard run: {kind}"]
    if e["pid"] is not None:
        parts.append(f"pid {e['pid']}")
    if kind == "start":
        parts.append(f"budget {format_size(e['budget_bytes'])}")
        if e["concurrency"] is not None:
            parts.append(f"concurrency {e['concurrency']}")
        learned = e.get("learned")
        if isinstance(learned, dict):  # --learned: the size the jobs were planned at, and why
            parts.append(f"per job {format_size(learned['per_job_bytes'])} ({learned['why']})")
    if e["reason"] is not None:
        ended = f" (signal {e['signal']})" if e["signal"] is not None else f" (code {e['exit_code']})"
        detail = {"signal": ended, "exit": ended, "pressure-stop": ended}.get(e["reason"], "")
        victim = " of a descendant" if e["reason"] == "oom-kill" and e["oom_victim"] == "descendant" else ""
        parts.append(f"{e['reason']}{victim}{detail}")
    if e["duration_s"] is not None:
        parts.append(f"after {e['duration_s']:.1f}s")
    if e["peak_bytes"] is not None and kind != "exit":  # an exit's message compares it
        parts.append(f"peak {format_size(e['peak_bytes'])}")
    if e["delay_s"] is not None:
        parts.append(f"in {e['delay_s']:.1f}s")
    line = ", ".join(parts)
    return line + (f": {e['message']}" if e["message"] else "")


def open_events(path: str) -> TextIO:
    """*path* opened to append, without waiting: ``OSError`` for a FIFO with no reader (open(2):
    "ENXIO ... O_NONBLOCK | O_WRONLY is set, the named file is a FIFO, and no process has the FIFO
    open for reading"). Once open, writes block as usual (a reader that is slow is waited for)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    os.set_blocking(fd, True)
    return open(fd, "a", encoding="utf-8")


class EventLog:
    """Writes events; *sinks* receive each event dict too (the manager client, tests)."""

    def __init__(self, path: str | None = None, stderr: TextIO | None = None) -> None:
        self.path = path
        self.stderr = stderr if stderr is not None else sys.stderr
        self.sinks: list[Callable[[dict[str, Any]], None]] = []
        self._file: TextIO | None = open_events(path) if path else None

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        e: dict[str, Any] = dict.fromkeys(FIELDS)
        e.update(fields, event=event, time=iso_now())
        if self._file is not None:
            try:
                self._file.write(json.dumps(e) + "\n")
                self._file.flush()
            except OSError as exc:
                self.stderr.write(
                    f"oomguard run: cannot write to {self.path} ({exc.strerror or exc}); events go to stderr only\n"
                )
                self._close_file()
        self.stderr.write(describe(e) + "\n")
        self.stderr.flush()
        for sink in self.sinks:
            sink(e)
        return e

    def _close_file(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):  # the buffered line that failed, failing again
                file.close()

    def close(self) -> None:
        self._close_file()
