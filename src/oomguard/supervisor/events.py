"""Supervisor events: JSON lines to ``--events FILE`` and one readable line each on stderr.

Every event has the same keys (null where they do not apply)::

    {"event": "start"|"exit"|"restart"|"give-up"|"stop", "time": ISO 8601 UTC, "pid",
     "budget_bytes", "concurrency", "reason": "oom-kill"|"signal"|"exit"|"clean",
     "exit_code", "signal", "duration_s", "delay_s", "peak_bytes", "message"}
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
    "reason",
    "exit_code",
    "signal",
    "duration_s",
    "delay_s",
    "peak_bytes",
    "message",
)


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
        detail = {"signal": f" (signal {e['signal']})", "exit": f" (code {e['exit_code']})"}.get(e["reason"], "")
        parts.append(f"{e['reason']}{detail}")
    if e["duration_s"] is not None:
        parts.append(f"after {e['duration_s']:.1f}s")
    if e["peak_bytes"] is not None:
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
