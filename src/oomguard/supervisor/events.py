"""Supervisor events: JSON lines to ``--events FILE`` and one readable line each on stderr.

Every event has the same keys (null where they do not apply)::

    {"event": "start"|"exit"|"restart"|"give-up"|"stop", "time": ISO 8601 UTC, "pid",
     "budget_bytes", "concurrency", "effective_bytes", "limited_by",
     "reason": "oom-kill"|"pressure-stop"|"signal"|"exit"|"clean", "exit_code", "signal",
     "oom_kills", "oom_victim": "worker"|"descendant"|"group",
     "duration_s", "delay_s", "peak_bytes", "guard_margin_bytes", "working_set_peak_bytes",
     "warnings", "message"}

``effective_bytes`` and ``limited_by`` are the hard ceiling the budget was computed from and
where it came from (the report's ``memory`` section), so a limit change shows as such;
``warnings`` lists the codes ``run`` printed when it started the worker (a budget above the
ceiling); an ``exit`` event's message compares the peak with the budget and the limit. With
``--guard``, ``guard_margin_bytes`` is the margin below the ceiling where the guard stops the
worker and ``working_set_peak_bytes`` the highest working set it sampled (``supervisor/guard.py``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

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
    "guard_margin_bytes",
    "working_set_peak_bytes",
    "warnings",
    "message",
)


def _against(peak: int, size: int, what: str, source: str | None = None) -> str:
    """ "over its 3.6 GiB budget" or "within the 4 GiB limit (cgroup-v2, 93%)"."""
    notes = [source] if source else []
    if peak <= size and size > 0:
        notes.append(f"{peak * 100 // size}%")
    where = "over" if peak > size else "within"
    return f"{where} {what.replace('SIZE', format_size(size))}" + (f" ({', '.join(notes)})" if notes else "")


def peak_story(peak: int | None, budget: int | None, limit: int | None, limited_by: str | None) -> str | None:
    """ "peak 3.98 GiB, over its 3.6 GiB budget, within the 4 GiB limit (cgroup-v2, 99%)"; None without a peak."""
    if peak is None:
        return None
    parts = [f"peak {format_size(peak)}"]
    if budget is not None:
        parts.append(_against(peak, budget, "its SIZE budget"))
    if limit is not None:
        parts.append(_against(peak, limit, "the SIZE limit", limited_by))
    return ", ".join(parts)


def describe(e: dict[str, Any]) -> str:
    kind = e["event"]
    parts = [f"oomguard run: {kind}"]
    if e["pid"] is not None:
        parts.append(f"pid {e['pid']}")
    if kind == "start":
        parts.append(f"budget {format_size(e['budget_bytes'])}")
        if e["concurrency"] is not None:
            parts.append(f"concurrency {e['concurrency']}")
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


class EventLog:
    """Writes events; *sinks* receive each event dict too (the manager client, tests)."""

    def __init__(self, path: str | None = None, stderr: TextIO | None = None) -> None:
        self.path = path
        self.stderr = stderr if stderr is not None else sys.stderr
        self.sinks: list[Callable[[dict[str, Any]], None]] = []
        self._file: TextIO | None = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        e: dict[str, Any] = dict.fromkeys(FIELDS)
        e.update(fields, event=event, time=iso_now())
        if self._file is not None:
            self._file.write(json.dumps(e) + "\n")
            self._file.flush()
        self.stderr.write(describe(e) + "\n")
        self.stderr.flush()
        for sink in self.sinks:
            sink(e)
        return e

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
