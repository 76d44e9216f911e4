"""What one node may send a minute: its events (a heartbeat included) and its observations, each
counted apart (issue 37, item 3: one node's token wrote ~150 observations a second, ~3 GB a day).

Each node has a token bucket per kind (``NodeQuota``): ``per_minute`` items at once, refilled at
``per_minute`` a minute. Past it the route answers 429 with ``Retry-After`` (the seconds until
the bucket holds one again) and one line naming the flag; the agent keeps a refused event or
observation in its spool and sends it when the minute has room (a heartbeat is dropped: the next
one comes), so a backlog after an outage drains at the quota's pace. Only what would be written
counts: a body refused (401, 403, 422) costs nothing.

The defaults (``settings.EVENTS_PER_NODE``: 300, ``settings.OBSERVATIONS_PER_NODE``: 120) are far
above real use: a supervisor sends a heartbeat a minute and three events a restart (exit, restart,
start), its restarts back off from 1 s doubling; an observation is one worker's run ending. Even 16
supervisors on one node crash-looping together send 240 events and 80 observations in their first
minute, fewer after. At the defaults one node adds at most about 430,000 events and 170,000
observations a day, which ``--retention`` then bounds (``retention``), where 150 observations a
second made 13 million. The buckets are this process's: replicas behind one address each allow the
quota. At most ``MAX_NODES`` buckets are kept per kind, the least recently used dropped first (a
dropped bucket starts full again).

The first refusal of a node's episode is logged (one line: node, kind, quota); the rest of the
episode is counted only, in ``refused`` (/metrics: ``oomguard_manager_quota_refusals_total{kind}``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict

MAX_NODES = 200_000
log = logging.getLogger("oomguard.manager.quotas")


class NodeQuota:
    """*per_minute* items of *kind* per node a minute, in a token bucket of that size."""

    def __init__(self, kind: str, per_minute: int, flag: str) -> None:
        self.kind = kind
        self.per_minute = per_minute
        self.flag = flag
        self.refill_s = 60.0 / per_minute  # one more item after this many seconds
        self.refused = 0
        self._buckets: OrderedDict[str, tuple[float, float, bool]] = OrderedDict()  # node -> (tokens, at, refusing)
        self._lock = threading.Lock()

    def take(self, node: str, now: float | None = None) -> int:
        """Count one item of *node* at *now* (seconds; the routes give the store's clock, default
        the monotonic one): 0 when its minute had room, else the seconds until it has. A clock
        that steps back refills nothing."""
        t = time.monotonic() if now is None else now
        with self._lock:
            tokens, at, refusing = self._buckets.pop(node, (float(self.per_minute), t, False))
            tokens = min(float(self.per_minute), tokens + max(0.0, t - at) / self.refill_s)
            wait = 0 if tokens >= 1 else max(1, math.ceil((1 - tokens) * self.refill_s))
            first = wait > 0 and not refusing
            self._buckets[node] = (tokens - 1 if not wait else tokens, t, wait > 0)
            while len(self._buckets) > MAX_NODES:
                self._buckets.popitem(last=False)
            self.refused += wait > 0
        if first:
            log.warning(
                "oomguard manager: node %s is over its quota of %d %s a minute (%s); answering 429",
                node,
                self.per_minute,
                self.kind,
                self.flag,
                extra={"event": "node-quota", "node": node, "kind": self.kind, "per_minute": self.per_minute},
            )
        return wait

    def reason(self) -> str:
        """The 429's one line (no input echoed)."""
        return (
            f"this node may send at most {self.per_minute} {self.kind} a minute ({self.flag}); "
            "try again after Retry-After"
        )


class Quotas:
    """The manager's per-node quotas, by kind: ``events`` and ``observations``."""

    def __init__(self, events_per_minute: int, observations_per_minute: int) -> None:
        self.events = NodeQuota("events", events_per_minute, "--max-events-per-node")
        self.observations = NodeQuota("observations", observations_per_minute, "--max-observations-per-node")

    def refused(self) -> dict[str, int]:
        """The 429s answered so far, by kind (a counter)."""
        return {q.kind: q.refused for q in (self.events, self.observations)}
