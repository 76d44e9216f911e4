"""The dashboard overview's fleet-wide answer, kept a few seconds where it is slow to compute.

The overview (``/``: the cards, the alerts by kind, the page of nodes riskiest first) reads every
node: at 100,000 nodes on PostgreSQL that is 0.15-0.18 s of a page's time (docs/benchmarks-history.md).
An answer is kept only for a fleet of ``KEEP_FROM`` nodes or more, and only when it took
``SLOW_S`` or longer: a smaller fleet always sees its database as it is (whatever the machine's
load), and so does a large one whose database answers quickly. Such an answer is kept per
question (the query string's filters, sort and offsets) and served, saying its age, while it is
at most ``FRESH_S`` old; from then until ``STALE_S`` it is still served (with its age) while one
background thread computes the next; older than that, the request computes it itself.
Prometheus evaluates its rules on an interval in the same spirit
(https://prometheus.io/docs/prometheus/latest/configuration/recording_rules/): an answer a few
seconds old, said to be, beats a page that takes a second.

Each replica keeps its own; forgetting a node on this replica drops what it kept (another
replica's overview may list the node until its answer is ``FRESH_S`` old). The API's reads are
never kept: a script asking ``/api/v1/nodes`` gets the database as it is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("oomguard.manager")

KEEP_FROM = 10_000  # nodes (every status counted): a fleet below this is never served a kept answer
SLOW_S = 0.1  # an answer that took this long (the overview's goal: issue 21) is kept
FRESH_S = 5.0  # served as it is until this old
STALE_S = 30.0  # served while the next is computed in the background until this old
KEPT = 64  # questions kept at once (the least recently asked goes first)
REFRESH_THREAD = "oomguard-overview-refresh"


@dataclass(frozen=True)
class Kept:
    value: Any
    computed_ms: int  # when it was computed (the manager's clock, epoch ms), for the page to say
    took_s: float  # how long computing it took
    at: float  # when it was computed (monotonic seconds), for its age


class Overview:
    """``read(key, compute)``: *compute*'s answer (*fleet_size* says how many nodes it covers), or
    one kept (see the module's rules); with it, None when it is fresh from the database, or what
    was kept: ``computed_ms`` (when, epoch ms on *clock_ms*), ``age_s`` and ``took_s`` (how long
    computing it took)."""

    def __init__(
        self,
        clock_ms: Callable[[], int],
        fleet_size: Callable[[Any], int],
        *,
        keep_from: int = KEEP_FROM,
        slow_s: float = SLOW_S,
        fresh_s: float = FRESH_S,
        stale_s: float = STALE_S,
        kept: int = KEPT,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock_ms, self.fleet_size, self.keep_from = clock_ms, fleet_size, keep_from
        self.slow_s, self.fresh_s, self.stale_s, self.size = slow_s, fresh_s, stale_s, kept
        self.monotonic = monotonic
        self._kept: OrderedDict[Hashable, Kept] = OrderedDict()
        self._refreshing: set[Hashable] = set()
        self._lock = threading.Lock()

    def read(self, key: Hashable, compute: Callable[[], Any]) -> tuple[Any, dict[str, Any] | None]:
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
            age = None if kept is None else self.monotonic() - kept.at
            background = age is not None and self.fresh_s < age <= self.stale_s and key not in self._refreshing
            if background:
                self._refreshing.add(key)
        if kept is not None and age is not None and age <= self.stale_s:
            if background:
                threading.Thread(target=self._refresh, args=(key, compute), name=REFRESH_THREAD, daemon=True).start()
            said = {"computed_ms": kept.computed_ms, "age_s": round(age, 1), "took_s": round(kept.took_s, 2)}
            return kept.value, said
        return self._compute(key, compute), None

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    def _compute(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        start, computed_ms = self.monotonic(), self.clock_ms()
        value = compute()
        took = self.monotonic() - start
        with self._lock:
            if took >= self.slow_s and self.fleet_size(value) >= self.keep_from:
                self._kept[key] = Kept(value, computed_ms, took, start)
                self._kept.move_to_end(key)
                while len(self._kept) > self.size:
                    self._kept.popitem(last=False)
            else:  # quick or small (the database warmed up, the fleet shrank): not kept
                self._kept.pop(key, None)
        return value

    def _refresh(self, key: Hashable, compute: Callable[[], Any]) -> None:
        try:
            self._compute(key, compute)
        except Exception as exc:  # the next request past STALE_S computes it and sees the error itself
            log.warning("the overview's background refresh failed: %s", type(exc).__name__)
        finally:
            with self._lock:
                self._refreshing.discard(key)
