"""The fleet's lessons kept between reads (issue 37, item 2): a profile's recommendations are
computed again only when its observations changed, or ``REFRESH_MS`` after they were computed
(the samples' weights age: 48 h of half-life moves them by 0.2 % in 10 minutes).

A profile's *signature* (``signatures``) is what changes when any of its learned observations of
the window does: their count, the largest and the summed row ids, and how many are confirmed
(``store/claims.py``); an exclusion, an inclusion, a confirming exit event, a new observation and
one leaving the window each change it. The signature is read from the database on each use, so a
replica sees another's writes at once; only the computation is kept, in this process.

Before, each scrape of /metrics and each profile page computed every recommendation anew: with
2,000 classes a scrape took the recommender's CPU for seconds, the page answered 503 and /metrics
said the database was down (issue 37).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from sqlalchemy import Connection, case, func, select

from oomguard.manager.db import observations

T = TypeVar("T")
REFRESH_MS = 600_000  # a kept answer is computed again after this long, changed or not
MAX_KEPT = 4096  # answers kept at most (the caps hold far fewer: --max-profiles x pages)

Signature = tuple[int, int, int, int]


def signatures(conn: Connection, since_ms: int, learned: Any, profile: str | None = None) -> dict[str, Signature]:
    """Each profile's signature (module doc) over its observations received from *since_ms* on
    that *learned* (a SQL condition: not excluded) holds; of *profile* only when given."""
    where = [observations.c.received_ms >= since_ms, learned]
    if profile is not None:
        where.append(observations.c.profile == profile)
    rows = conn.execute(
        select(
            observations.c.profile,
            func.count(),
            func.max(observations.c.id),
            func.sum(observations.c.id),
            func.sum(case((observations.c.confirmed, 1), else_=0)),
        )
        .where(*where)
        .group_by(observations.c.profile)
    ).all()
    return {str(p): (int(n), int(m or 0), int(t or 0), int(c or 0)) for p, n, m, t, c in rows}


class Kept:
    """Answers by key, each with the signature and time it was computed at."""

    def __init__(self, refresh_ms: int = REFRESH_MS) -> None:
        self.refresh_ms = refresh_ms
        self._kept: dict[Hashable, tuple[Any, int, Any]] = {}
        self._lock = threading.Lock()
        self.computed = 0  # answers computed (not kept): for the tests and the benchmark

    def get(self, key: Hashable, signature: Any, now_ms: int, compute: Callable[[], T]) -> T:
        """The answer kept under *key* for *signature*, computed within ``refresh_ms`` of
        *now_ms*; else ``compute()``, kept."""
        with self._lock:
            found = self._kept.get(key)
        if found is not None and found[0] == signature and 0 <= now_ms - found[1] < self.refresh_ms:
            return found[2]  # type: ignore[no-any-return]
        value = compute()
        with self._lock:
            if len(self._kept) >= MAX_KEPT:
                self._kept.clear()
            self._kept[key] = (signature, now_ms, value)
            self.computed += 1
        return value
