"""What the fleet learned of a profile, for its page (issue 23, item 4): declared against observed,
the recommendation per class of node, the OOM kills and pressure stops at each size, and what
applying the recommendation changes.

- **Observed**: the profile's samples of the window (``learning.WINDOW_MS``, the newest
  ``learning.MAX_SAMPLES``: the ones the recommender reads), newest first.
- **Per class**: for each class that ran the profile, what a new node of it is told
  (``learning.recommend`` without a node: its class's samples, else the fleet's), with its floor,
  its failures and its nodes.
- **What applying it changes**: for each node that ran the profile and has a budget, the jobs that
  fit at the newest declared size, ``floor((budget - baseline) / per_job)`` (0 when the baseline
  does not fit), against the jobs at what its class tells a new node of that budget (the size and
  baseline of ``learning.recommend`` with ``budget``: what ``plan --learned`` there would get);
  summed per class and over the fleet. A node without a known budget counts in neither sum and
  is said.
- **Observations**: the window's observations, excluded ones too (an operator's choice,
  ``observations.excluded``: shown, marked, but no sample), newest first, a page at a time,
  each with what identifies it to ``POST /api/v1/observations/{node}/{id}/exclude``.

The index and the figures above count only what the rule learns from: excluded observations are
left out (``learned.LEARNED``); a profile whose observations in the window are all excluded still
has its page, for its list.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, case, func, select

from oomguard._types import FAILURES
from oomguard.manager import learning
from oomguard.manager.db import nodes, observations
from oomguard.manager.store.learned import LEARNED, samples_of
from oomguard.manager.times import iso_ms

PROFILES_SHOWN = 200  # the most profiles the index lists, the most observed first
FAILURES_SHOWN = 50  # the newest OOM kills and pressure stops listed
OBSERVATIONS_PAGE = 50  # the observations listed a page, newest first


def jobs_at(budget: int | None, per_job: int | None, baseline: int | None) -> int | None:
    """Jobs of *per_job* that fit *budget* beside *baseline*; None when a number is unknown."""
    if budget is None or per_job is None or per_job <= 0 or baseline is None:
        return None
    return max(0, (budget - baseline) // per_job)


def profiles_index(conn: Connection, now: int) -> list[dict[str, Any]]:
    """Each profile observed in the window: its samples, nodes, failures and newest sample."""
    since = now - learning.WINDOW_MS
    failed = func.sum(case((observations.c.outcome != "ok", 1), else_=0))
    rows = conn.execute(
        select(
            observations.c.profile,
            func.count(),
            func.count(func.distinct(observations.c.node_id)),
            failed,
            func.max(observations.c.received_ms),
        )
        .where(observations.c.received_ms >= since, LEARNED)
        .group_by(observations.c.profile)
        .order_by(func.count().desc(), observations.c.profile)
        .limit(PROFILES_SHOWN)
    ).all()
    return [
        {"profile": p, "samples": int(n), "nodes": int(k), "failures": int(f or 0), "updated": iso_ms(int(t))}
        for p, n, k, f, t in rows
    ]


def observations_page(conn: Connection, profile: str, since_ms: int, offset: int) -> dict[str, Any]:
    """``OBSERVATIONS_PAGE`` of *profile*'s observations received from *since_ms* on, excluded ones
    too, newest first from *offset*: ``{rows, offset, page, more}`` (``more``: an older page exists)."""
    rows = conn.execute(
        select(
            nodes.c.name,
            observations.c.ingest_id,
            observations.c.received_ms,
            observations.c.node_class,
            observations.c.declared_per_job_bytes,
            observations.c.peak_per_job_bytes,
            observations.c.concurrency,
            observations.c.outcome,
            observations.c.excluded,
        )
        .select_from(observations.join(nodes, nodes.c.id == observations.c.node_id))
        .where(observations.c.profile == profile, observations.c.received_ms >= since_ms)
        .order_by(observations.c.received_ms.desc(), observations.c.id.desc())
        .offset(offset)
        .limit(OBSERVATIONS_PAGE + 1)  # one more: whether an older page exists
    ).all()
    listed = [
        {
            "node": r.name,
            "id": r.ingest_id,
            "received": iso_ms(int(r.received_ms)),
            "node_class": r.node_class,
            "declared_per_job_bytes": int(r.declared_per_job_bytes),
            "peak_per_job_bytes": int(r.peak_per_job_bytes),
            "concurrency": int(r.concurrency),
            "outcome": r.outcome,
            "excluded": bool(r.excluded),
        }
        for r in rows[:OBSERVATIONS_PAGE]
    ]
    return {"rows": listed, "offset": offset, "page": OBSERVATIONS_PAGE, "more": len(rows) > OBSERVATIONS_PAGE}


def profile_view(conn: Connection, now: int, profile: str, offset: int = 0) -> dict[str, Any] | None:
    """The page's figures for *profile* (module doc), with the page of its observations from
    *offset*; None when the window holds none of it, excluded or not."""
    since = now - learning.WINDOW_MS
    samples = list(samples_of(conn, profile, since).values())
    listed = observations_page(conn, profile, since, offset)
    if not samples:  # none, or all excluded: then the figures of no sample
        return _nothing_learned(conn, profile, since, listed, now)
    newest = samples[0]  # samples_of: newest first
    budgets = dict(
        conn.execute(
            select(nodes.c.name, nodes.c.budget_bytes).where(nodes.c.name.in_(sorted({s.node for s in samples})))
        ).all()
    )
    memo: dict[str, Any] = {}  # the fleet scope's figures, computed once for every class (learning.recommend)
    fleet = learning.recommend(now, None, None, samples, iso_ms, memo=memo)
    classes = []
    total = {"today": 0, "learned": 0, "nodes": 0, "unknown": 0}
    for node_class in sorted({s.node_class for s in samples}):
        mine = [s for s in samples if s.node_class == node_class]
        answer = learning.recommend(now, None, node_class, samples, iso_ms, memo=memo)
        for_budget: dict[int, learning.Recommendation] = {}  # the nodes of a class share a few budgets
        today = learned = counted = unknown = 0
        for node in sorted({s.node for s in mine}):
            budget = budgets.get(node)
            before = jobs_at(budget, newest.declared_per_job, newest.declared_baseline)
            told = answer
            if budget is not None:
                if budget not in for_budget:
                    for_budget[budget] = learning.recommend(
                        now, None, node_class, samples, iso_ms, budget=budget, memo=memo
                    )
                told = for_budget[budget]
            after = jobs_at(budget, told.per_job_bytes, told.baseline_bytes)
            if before is None or after is None:
                unknown += 1
                continue
            today, learned, counted = today + before, learned + after, counted + 1
        peaks = sorted(s.peak_per_job for s in mine)
        classes.append(
            {
                "node_class": node_class,
                "samples": len(mine),
                "nodes": len({s.node for s in mine}),
                "oom_kills": sum(s.outcome == "oom-kill" for s in mine),
                "pressure_stops": sum(s.outcome == "pressure-stop" for s in mine),
                "peak_max_bytes": peaks[-1],
                "peak_median_bytes": peaks[len(peaks) // 2],
                "answer": answer,
                "jobs_today": today,
                "jobs_learned": learned,
                "nodes_counted": counted,
                "nodes_without_budget": unknown,
            }
        )
        total = {
            "today": total["today"] + today,
            "learned": total["learned"] + learned,
            "nodes": total["nodes"] + counted,
            "unknown": total["unknown"] + unknown,
        }
    failures = [s for s in samples if s.outcome in FAILURES][:FAILURES_SHOWN]
    return {
        "profile": profile,
        "declared_per_job_bytes": newest.declared_per_job,
        "declared_baseline_bytes": newest.declared_baseline,
        "samples": samples,
        "fleet": fleet,
        "classes": classes,
        "failures": [{"sample": s, "received": iso_ms(s.received_ms)} for s in failures],
        "jobs": total,
        "updated": iso_ms(newest.received_ms),
        "observations": listed,
    }


def _nothing_learned(
    conn: Connection, profile: str, since: int, listed: dict[str, Any], now: int
) -> dict[str, Any] | None:
    """The page of a profile whose observations in the window are all excluded: no sample, no
    class, no failure; the declared sizes and time of the newest observation. None when the
    window holds no observation of it at all."""
    newest = conn.execute(
        select(
            observations.c.declared_per_job_bytes, observations.c.declared_baseline_bytes, observations.c.received_ms
        )
        .where(observations.c.profile == profile, observations.c.received_ms >= since)
        .order_by(observations.c.received_ms.desc(), observations.c.id.desc())
        .limit(1)
    ).first()
    if newest is None:
        return None
    return {
        "profile": profile,
        "declared_per_job_bytes": int(newest[0]),
        "declared_baseline_bytes": int(newest[1]),
        "samples": [],
        "fleet": learning.recommend(now, None, None, [], iso_ms),
        "classes": [],
        "failures": [],
        "jobs": {"today": 0, "learned": 0, "nodes": 0, "unknown": 0},
        "updated": iso_ms(int(newest[2])),
        "observations": listed,
    }
