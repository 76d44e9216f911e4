"""OOM kills outside ``run`` (issue 38, item 1): the kernel's ``oom_kill`` counter of the node's
group, which every agent report carries (``memory.oom.oom_kill``, read from ``memory.events`` on
cgroup v2 or ``memory.oom_control`` on v1: Documentation/admin-guide/cgroup-v2.rst, "oom_kill: The
number of processes belonging to this cgroup killed by any kind of OOM killer"; cgroup-v1/memory.rst,
``oom_kill``), counted by the manager as it rises:

- a rise between two reports of one counter file is that many kills, dated by the later report
  (the agent's time when it sent one, else the receive time): a ``kernel-oom`` row in ``events``
  (``kills`` the rise), counted in ``nodes.kernel_oom_kills_total``;
- the first report of a node, or a counter of another file (a new group: the node's container was
  replaced), or a counter below the last (a group created anew at the same path) counts the
  counter itself: the kills of that group so far, dated by that report ("by then");
- an unknown counter (``null``: a v1 kernel before 4.13, or the file unreadable) counts nothing,
  and the last known value stays the base.

Kept apart from the supervised kills (``nodes.oom_kills_total``: ``run``'s exit events), which a
process of the same group also raises in the counter: the two are shown side by side, never summed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, select, update

from oomguard.manager.db import events, nodes
from oomguard.manager.times import iso_ms

KIND = "kernel-oom"  # the events row of a rise


class Seen(NamedTuple):
    """One stored report's counter: its node id, receive time, agent time, ingest id, file, value."""

    node_id: int
    t: int
    agent_ms: int | None
    ingest_id: str
    source: str | None
    counter: int | None


def oom_counter(report: dict[str, Any]) -> tuple[str | None, int | None]:
    """(The counter's file, its value) of a report (None, None: not known)."""
    memory = report.get("memory")
    oom = memory.get("oom") if isinstance(memory, dict) else None
    if not isinstance(oom, dict):
        return None, None
    source, value = oom.get("source"), oom.get("oom_kill")
    known = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return (source[:512] if isinstance(source, str) else None), (value if known else None)


def rise(before: tuple[str | None, int | None], now: tuple[str | None, int | None]) -> int:
    """The kills between the counter *before* (file, value; value None: never read) and *now*."""
    source, value = now
    if value is None:
        return 0
    last_source, last = before
    if last is None or source != last_source or value < last:
        return value  # a first reading, or a new group: its kills so far
    return value - last


def count(conn: Connection, seen: Sequence[Seen]) -> None:
    """Count the rises of the stored reports *seen* (any order) against their nodes' last counters:
    the nodes' columns and one ``kernel-oom`` events row per rise."""
    if not seen:
        return
    ids = sorted({s.node_id for s in seen})
    held = {
        int(r.id): (r.kernel_oom_source, r.kernel_oom_kill, int(r.kernel_oom_kills_total))
        for r in conn.execute(
            select(
                nodes.c.id, nodes.c.kernel_oom_source, nodes.c.kernel_oom_kill, nodes.c.kernel_oom_kills_total
            ).where(nodes.c.id.in_(ids))
        )
    }
    rows: list[dict[str, Any]] = []
    for node_id in ids:
        if node_id not in held:
            continue
        source, last, total = held[node_id]
        for s in sorted((s for s in seen if s.node_id == node_id), key=lambda s: (s.t, s.agent_ms or 0)):
            kills = rise((source, last), (s.source, s.counter))
            if s.counter is not None:
                source, last = s.source, s.counter
            if kills > 0:
                total += kills
                rows.append(_row(s, kills))
        conn.execute(
            update(nodes)
            .where(nodes.c.id == node_id)
            .values(kernel_oom_source=source, kernel_oom_kill=last, kernel_oom_kills_total=total)
        )
    if rows:
        conn.execute(events.insert(), rows)


def _row(s: Seen, kills: int) -> dict[str, Any]:
    when = iso_ms(s.agent_ms) if s.agent_ms is not None else iso_ms(s.t)
    body = {"event": KIND, "time": when, "kills": kills, "counter": s.counter, "source": s.source}
    return {
        "node_id": s.node_id,
        # one row per report: its id's digest (a report's id may be 128 characters already)
        "ingest_id": KIND + ":" + hashlib.sha256(s.ingest_id.encode()).hexdigest()[:40],
        "received_ms": s.t,
        "time": when,
        "kind": KIND,
        "reason": "oom-kill",
        "kills": kills,
        "body": json.dumps(body),
    }
