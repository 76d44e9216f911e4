"""The room ``run --guard`` keeps under its stop line for the worker's graceful stop: pure, no I/O.

The grace is the larger of ``--grace-bytes`` (given) and what this supervisor learned from the
worker's earlier stops: how far its working set rose between the stop signal and its exit
(``grown_after_stop_bytes`` of their exit events, ``guard_state.py``).

- **A stop that ended** (the worker exited by itself, or by SIGKILL at ``--stop-timeout``): its
  growth, plus 15%, is enough for the next one. The 15% is the Kubernetes Vertical Pod
  Autoscaler's safety margin over its memory recommendation (``recommender/logic/recommender.go``,
  ``--recommendation-margin-fraction`` 0.15); a stop's growth varies from one stop to the next.
- **A stop the kernel's OOM killer ended**: its growth is only a lower bound, since the kill cut it
  short. The next grace is at least double it, and one guard margin more, so a growth seen as
  nearly nothing still moves the line: the need is unknown, and doubling finds an unknown bound
  in as many steps as its logarithm (an exponential search), where VPA's 1.2x OOM bump
  (``model/container.go``, for the whole container's memory) would take many more for the smaller
  quantity a graceful stop costs.
- **Capped**: a learned grace takes at most half of the room under the ceiling (ceiling - guard
  margin), so the worker always has the other half to work in; the stop message says when the
  cap binds. A given ``--grace-bytes`` is not capped (too large a one turns the guard off, said
  in one line, ``guard.make_guard``).

An OOM kill in a guard stop teaches this alone: the supervisor keeps the budget and the plan
(``adapt.lesson``), since the stop line is the ceiling's, and a smaller budget would not give the
shutdown more room under it. What is learned lives as long as the supervisor; the next
``oomguard run`` starts from ``--grace-bytes`` again.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ENDED_MARGIN", "Grace", "GraceLearning"]

ENDED_MARGIN = 0.15  # VPA's recommendation margin fraction


class Grace(NamedTuple):
    """The grace of one start: *bytes* kept under the stop line, *source* "given", "learned" or
    None (no grace), and whether the learned one was *capped* at half the room."""

    bytes: int
    source: str | None
    capped: bool = False


class GraceLearning:
    """The grace across one supervisor's starts: ``--grace-bytes`` and the stops seen so far."""

    def __init__(self, given: int) -> None:
        self.given = given
        self.learned = 0
        self.stops = 0  # the stops learned from

    def learn(self, grown: int | None, *, oom_killed: bool, margin: int) -> None:
        """After a guard stop: *grown* bytes after the signal; *oom_killed* when the kernel ended it."""
        if grown is None:
            return
        self.stops += 1
        need = max(2 * grown, grown + margin) if oom_killed else grown + int(grown * ENDED_MARGIN)
        self.learned = max(self.learned, need)

    def for_start(self, ceiling: int, margin: int) -> Grace:
        """The grace of the next start under *ceiling* with this guard *margin*."""
        cap = max(0, (ceiling - margin) // 2)
        learned, capped = (cap, True) if self.learned > cap else (self.learned, False)
        if learned > self.given:
            return Grace(learned, "learned", capped)
        return Grace(self.given, "given" if self.given else None)
