"""``run --guard``'s decisions, sample by sample: pure, no I/O (the rules are in guard.py's docstring).

``Guard`` (guard.py) reads the worker's group and acts; this module only says what a sample means:
at the budget (once per crossing, re-armed below 95% of it), at the stop line (ceiling - guard
margin - grace: a pressure stop), or stalled under memory.high for ``stall_limit`` seconds. After
a stop it keeps following the working set: ``grown_after_stop`` is how far it rose past the
working set the stop was decided at, while the worker stopped (its graceful shutdown's cost).
Given each sample's time, it also keeps the working set's growth rate: the slope over the last
``RATE_WINDOW`` seconds of samples, which the stop records (``stop_rate``).
"""

from __future__ import annotations

from collections import deque

from oomguard.probes.counters import MemorySample
from oomguard.supervisor.config import NEAR_MARGINS
from oomguard.units import format_size

__all__ = ["HIGH", "PRESSURE", "RATE_WINDOW", "REARM_RATIO", "STOP", "GuardState"]

REARM_RATIO = 0.95
RATE_WINDOW = 0.5  # seconds of samples the growth rate is the slope of
PRESSURE, HIGH, STOP = "pressure", "high", "stop"


class GuardState:
    """The decisions of one run, sample by sample: no I/O."""

    def __init__(
        self, budget: int, ceiling: int, margin: int, *, set_high: bool, stall_limit: float, grace: int = 0
    ) -> None:
        self.budget, self.ceiling, self.margin, self.grace = budget, ceiling, margin, grace
        self.stop_line = ceiling - margin - grace  # the grace: room for the worker's graceful stop
        self.near = self.stop_line - (NEAR_MARGINS - 1) * margin  # from here on, sample fast
        self.rearm = int(budget * REARM_RATIO)
        self.set_high, self.stall_limit = set_high, stall_limit
        self.armed, self.high_set = True, False
        self.crossings = 0
        self.peak: int | None = None
        self.stop_why: str | None = None  # set once: why the worker is stopped
        self.stopped_ws: int | None = None  # the working set the stop was decided at
        self.after_stop_peak: int | None = None  # the highest working set from the stop on
        self.stop_rate: float | None = None  # bytes/s the working set grew by at the stop
        self._recent: deque[tuple[float, int]] = deque()  # (time, working set) of the last RATE_WINDOW s
        self._stall0: float | None = None  # PSI full total at this crossing

    def step(self, s: MemorySample, now: float | None = None) -> list[str]:
        """The actions this sample, taken at *now* (seconds; None: no rate), asks for: PRESSURE,
        HIGH, STOP (each at most once a crossing)."""
        ws = s.working_set
        if ws is None:
            return []
        self.peak = ws if self.peak is None else max(self.peak, ws)
        if now is not None:
            self._recent.append((now, ws))
            while len(self._recent) > 2 and now - self._recent[1][0] >= RATE_WINDOW:
                self._recent.popleft()
        if self.stop_why is not None:
            self.after_stop_peak = max(self.after_stop_peak or ws, ws)
            return []
        actions = self._budget(ws, s.stall_us)
        if ws >= self.stop_line:
            grace = f" - {format_size(self.grace)} grace" if self.grace else ""
            self.stop_why = (
                f"working set {format_size(ws)} reached the stop line {format_size(self.stop_line)} "
                f"({format_size(self.ceiling)} limit - {format_size(self.margin)} guard margin{grace})"
            )
        elif self._stalled(s.stall_us):
            self.stop_why = (
                f"stalled {self.stall_limit:g}s on memory under memory.high {format_size(self.budget)} "
                f"with the working set {format_size(ws)} above the budget"
            )
        if self.stop_why:
            self.stopped_ws = self.after_stop_peak = ws
            self.stop_rate = self.rate
            return [*actions, STOP]
        return actions

    @property
    def rate(self) -> float | None:
        """Bytes/s over the samples of the last RATE_WINDOW seconds (None: fewer than two, or no time)."""
        if len(self._recent) < 2:
            return None
        (t0, w0), (t1, w1) = self._recent[0], self._recent[-1]
        return (w1 - w0) / (t1 - t0) if t1 > t0 else None

    @property
    def grown_after_stop(self) -> int | None:
        """How far the working set rose past the stop's while the worker stopped (None: no stop)."""
        if self.stopped_ws is None or self.after_stop_peak is None:
            return None
        return max(0, self.after_stop_peak - self.stopped_ws)

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
