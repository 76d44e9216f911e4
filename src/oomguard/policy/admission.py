"""Watched admission's rule: what the working set samples say, and whether a request fits.

A pure decision over numbers (no thread, no file): ``runtime/watch.py`` samples the group and
feeds ``observe``; ``runtime/reserve.py`` (``MemoryBudget``) asks ``excess`` under its lock.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard.runtime.watch import Watch

__all__ = ["MAX_OVERSHOOT", "Admission"]

MAX_OVERSHOOT = 1.5  # the learned overshoot ratio never goes above this


class Admission:
    """What the samples say, and the watched rule. Used under the budget's lock.

    With working set *ws* (last sample), *reserved* bytes held, *limit* = ceiling - margin:
    - nothing reserved: a request of *n* fits when ``ws + n <= limit``;
    - otherwise when ``max(ws, baseline + k * reserved) + k * n <= limit``: *baseline* is
      the working set last seen with nothing reserved, and *k* the overshoot ratio, the
      most that ``(ws - baseline) / reserved`` has been over two samples in a row (from
      ``Watch.overshoot``, at most ``MAX_OVERSHOOT``; learned only while reserved >=
      ceiling / 16, so small reservations do not turn noise into a ratio, and a release
      sampled just before its memory was freed does not either). Reservations granted
      since the last sample count at once, and jobs still growing towards their peaks
      count at their projected size.
    - warm-up: while learning, *k* is ``MAX_OVERSHOOT`` until ``Watch.warmup_bytes`` of
      reservations (default: the ceiling's worth) have been released, so that the first
      jobs, admitted before any of them reached its peak, cannot overshoot together.
    Unknown working set or ceiling, or no longer *active* (closed): every request fits (the
    budget's static rule decides); the first unknown sample sets *warning*.
    """

    __slots__ = ("active", "baseline", "k", "last_ratio", "learned", "over", "released", "warning", "watch", "ws")

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.ws: int | None = None
        self.baseline: int | None = None
        self.k = watch.overshoot
        self.over = False  # the working set is above the budget's total
        self.warning: str | None = None
        self.active = True
        self.released = 0  # bytes of reservations released since the watch began
        self.last_ratio: float | None = None
        self.learned = False  # k was taken from two samples in a row at least once

    @property
    def factor(self) -> float:
        """The overshoot ratio admission applies now: *k*, or ``MAX_OVERSHOOT`` during the warm-up."""
        w = self.watch
        if w.learn and self.released < (w.warmup_bytes if w.warmup_bytes is not None else w.ceiling or 0):
            return MAX_OVERSHOOT
        return self.k

    def observe(self, ws: int | None, reserved: int, total: int) -> bool:
        """Take a sample; True when the working set has just passed *total* (a crossing)."""
        self.ws = ws
        if ws is None:
            if self.warning is None:
                why = self.watch.unknown_reason or f"{self.watch.source} gave no value"
                self.warning = f"{why}: admitting by reserved bytes only"
            return False
        crossed = ws > total and not self.over
        self.over = ws > total
        if reserved == 0 or self.baseline is None or ws < self.baseline:
            self.baseline = ws
        self._learn(ws - self.baseline, reserved)
        return crossed

    def _learn(self, used: int, reserved: int) -> None:
        ceiling = self.watch.ceiling
        if not self.watch.learn or reserved == 0 or ceiling is None or reserved * 16 < ceiling:
            self.last_ratio = None
            return
        ratio = used / reserved
        if self.last_ratio is not None:
            self.k = min(MAX_OVERSHOOT, max(self.k, min(ratio, self.last_ratio)))
            self.learned = True
        self.last_ratio = ratio

    def excess(self, reserved: int, nbytes: int) -> int | None:
        """By how much granting *nbytes* would pass the limit (<= 0: it fits); None when unknown."""
        limit, ws = self.watch.limit, self.ws
        if limit is None or ws is None or not self.active:
            return None
        if reserved == 0:
            return ws + nbytes - limit
        k = self.factor
        projected = max(ws, (self.baseline or 0) + k * reserved)
        return int(projected + k * nbytes) - limit
