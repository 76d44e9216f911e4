"""``run --guard``'s decisions, sample by sample: pure, no I/O (the rules are in guard.py's docstring).

``Guard`` (guard.py) reads the worker's group and acts; this module only says what a sample means:
at the budget (once per crossing, re-armed below 95% of it), at the stop line (ceiling - guard
margin: a pressure stop), or stalled under memory.high for ``stall_limit`` seconds.
"""

from __future__ import annotations

from oomguard.probes.counters import MemorySample
from oomguard.supervisor.config import NEAR_MARGINS
from oomguard.units import format_size

__all__ = ["HIGH", "PRESSURE", "REARM_RATIO", "STOP", "GuardState"]

REARM_RATIO = 0.95
PRESSURE, HIGH, STOP = "pressure", "high", "stop"


class GuardState:
    """The decisions of one run, sample by sample: no I/O."""

    def __init__(self, budget: int, ceiling: int, margin: int, *, set_high: bool, stall_limit: float) -> None:
        self.budget, self.ceiling, self.margin = budget, ceiling, margin
        self.stop_line = ceiling - margin
        self.near = ceiling - NEAR_MARGINS * margin  # from here on, sample fast
        self.rearm = int(budget * REARM_RATIO)
        self.set_high, self.stall_limit = set_high, stall_limit
        self.armed, self.high_set = True, False
        self.crossings = 0
        self.peak: int | None = None
        self.stop_why: str | None = None  # set once: why the worker is stopped
        self._stall0: float | None = None  # PSI full total at this crossing

    def step(self, s: MemorySample) -> list[str]:
        """The actions this sample asks for: PRESSURE, HIGH, STOP (each at most once a crossing)."""
        ws = s.working_set
        if ws is None:
            return []
        self.peak = ws if self.peak is None else max(self.peak, ws)
        if self.stop_why is not None:
            return []
        actions = self._budget(ws, s.stall_us)
        if ws >= self.stop_line:
            self.stop_why = (
                f"working set {format_size(ws)} reached the stop line {format_size(self.stop_line)} "
                f"({format_size(self.ceiling)} limit - {format_size(self.margin)} guard margin)"
            )
        elif self._stalled(s.stall_us):
            self.stop_why = (
                f"stalled {self.stall_limit:g}s on memory under memory.high {format_size(self.budget)} "
                f"with the working set {format_size(ws)} above the budget"
            )
        return [*actions, STOP] if self.stop_why else actions

    def _budget(self, ws: int, stall_us: float | None) -> list[str]:
        if ws < self.rearm:
            self.armed, self._stall0 = True, None
            return []
        if ws < self.budget or not self.armed:
            return []
        self.armed, self._stall0 = False, stall_us
        self.crossings += 1
        if self.set_high and not self.high_set:
            self.high_set = True
            return [PRESSURE, HIGH]
        return [PRESSURE]

    def _stalled(self, stall_us: float | None) -> bool:
        if not self.high_set or self.armed or stall_us is None:
            return False
        if self._stall0 is None:
            self._stall0 = stall_us
        return (stall_us - self._stall0) / 1e6 >= self.stall_limit
