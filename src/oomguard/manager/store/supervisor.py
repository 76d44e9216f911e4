"""The supervisor's state on one node, derived from the events already stored (docs/run.md):

- ``running``: the latest event is a ``start``: ``jobs`` of the ``planned`` (the latest report's
  plan, else the most a start of the recent events gave); ``stepped_down`` when fewer, with
  ``why`` (the message of the restart before that start: "after an OOM kill: concurrency 3 -> 2");
- ``exited``: an ``exit`` is the latest (the supervisor decides what next);
- ``restarting``: a ``restart``, ``restart_in_s`` from now (its ``delay_s`` after it arrived; 0
  once due);
- ``gave-up``: a ``give-up``, ``after`` saying why (its reason and message);
- ``stopped``: a ``stop`` (an operator's signal: no restart);
- ``refused``: a failed ``gate`` (the entrypoint's gate: nothing started).

``last_exit``: the latest exit's reason, receive time, exit code and message. ``current``: whether
the supervisor is still heard from (its node's status is not offline); else the state is the last
known. Bounded: only the node's ``RECENT`` latest events are read (one index range).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, select

from oomguard.manager.db import events
from oomguard.manager.times import iso_ms

RECENT = 100
STATES = {"start": "running", "exit": "exited", "restart": "restarting", "give-up": "gave-up", "stop": "stopped"}


def recent_events(conn: Connection, node_id: int, limit: int = RECENT) -> list[tuple[int, dict[str, Any]]]:
    """(receive time, event) of the node's latest *limit* events, newest first."""
    rows = conn.execute(
        select(events.c.received_ms, events.c.body)
        .where(events.c.node_id == node_id)
        .order_by(events.c.received_ms.desc(), events.c.id.desc())
        .limit(limit)
    ).all()
    return [(int(t), json.loads(body)) for t, body in rows]


def _jobs(e: dict[str, Any]) -> int | None:
    n = e.get("concurrency")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def state(
    recent: list[tuple[int, dict[str, Any]]], now: int, planned: int | None, current: bool
) -> dict[str, Any] | None:
    """The supervisor's state from its *recent* events (newest first), against the *planned* jobs
    (the latest report's plan, or None); None when the node has no supervisor events."""
    kinds = [(t, e) for t, e in recent if e.get("event") in STATES or e.get("event") == "gate"]
    if not kinds:
        return None
    t, latest = kinds[0]
    name = "refused" if latest.get("event") == "gate" and latest.get("passed") is False else STATES.get(latest["event"])
    if name is None:  # a passed gate: the start comes next
        name = "starting"
    starts = [e for _, e in kinds if e.get("event") == "start" and _jobs(e) is not None]
    most = max((_jobs(e) or 0 for e in starts), default=None)
    plan = planned if planned is not None else most
    out: dict[str, Any] = {"state": name, "since": iso_ms(t), "current": current, "planned": plan, "jobs": None}
    if name == "running":
        jobs = _jobs(latest)
        out["jobs"] = jobs
        out["stepped_down"] = jobs is not None and plan is not None and jobs < plan
        before = next((e for tt, e in kinds if tt <= t and e.get("event") == "restart"), None)
        out["why"] = before.get("message") if out["stepped_down"] and before else None
    if name == "restarting":
        delay = latest.get("delay_s")
        due = t + int((delay if isinstance(delay, int | float) else 0) * 1000)
        out["restart_in_s"] = max(0.0, (due - now) / 1000)
    if name in ("gave-up", "stopped", "exited", "restarting"):
        out["after"] = {"reason": latest.get("reason"), "message": latest.get("message")}
    exit_ = next(((tt, e) for tt, e in kinds if e.get("event") == "exit"), None)
    out["last_exit"] = (
        None
        if exit_ is None
        else {
            "reason": exit_[1].get("reason"),
            "time": iso_ms(exit_[0]),
            "exit_code": exit_[1].get("exit_code"),
            "signal": exit_[1].get("signal"),
            "message": exit_[1].get("message"),
        }
    )
    return out
