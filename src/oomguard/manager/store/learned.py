"""The fleet's lessons read back: the samples of a profile the recommender needs, and its answer
(``oomguard.manager.learning``: the rule). Computed on each read from the ``observations`` table
and the time, so every replica on one database gives the same answer at the same time.

An observation an operator excluded (``observations.excluded``, revision 0010: ``POST
/api/v1/observations/{node}/{id}/exclude``) is no sample: every read here leaves it out.

Bounded reads, each the newest ``learning.MAX_SAMPLES`` of the window: the fleet's (by the index
on profile and time), then the node's own and its class's (on node and time, profile, class and
time) only when the fleet's did not hold the whole window.
The node's class: the one asked for, else the operator's (the node's ``node_class`` label:
``--node-class``, ``OOMGUARD_NODE_CLASS``), else the class of the node's newest observation (of
this profile, else of any), else the one derived from its latest report; unknown for a node the
manager has never heard of.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from sqlalchemy import Connection, false, func, select, true

from oomguard.labels import CLASS_LABEL
from oomguard.manager import learning
from oomguard.manager.db import latest_reports, nodes, observations
from oomguard.manager.store import text
from oomguard.manager.store.kept import Kept, signatures
from oomguard.manager.times import iso_ms
from oomguard.nodes import node_class_problem

_COLUMNS = (
    observations.c.id,
    nodes.c.name,
    observations.c.node_class,
    observations.c.received_ms,
    observations.c.declared_per_job_bytes,
    observations.c.peak_per_job_bytes,
    observations.c.declared_baseline_bytes,
    observations.c.peak_baseline_bytes,
    observations.c.concurrency,
    observations.c.outcome,
    observations.c.confirmed,
)

LEARNED = observations.c.excluded == false()  # an observation the rule learns from: not excluded


def samples_of(conn: Connection, profile: str, since_ms: int, *where: Any) -> dict[int, learning.Sample]:
    """The newest ``learning.MAX_SAMPLES`` samples of *profile* received from *since_ms* on (and
    *where*), excluded observations left out, by row id."""
    query = (
        select(*_COLUMNS)
        .select_from(observations.join(nodes, nodes.c.id == observations.c.node_id))
        .where(observations.c.profile == profile, observations.c.received_ms >= since_ms, LEARNED, *where)
        .order_by(observations.c.received_ms.desc(), observations.c.id.desc())
        .limit(learning.MAX_SAMPLES)
    )
    return {
        int(r[0]): learning.Sample(
            node=str(r[1]),
            node_class=str(r[2]),
            received_ms=int(r[3]),
            declared_per_job=int(r[4]),
            peak_per_job=int(r[5]),
            declared_baseline=int(r[6]),
            peak_baseline=None if r[7] is None else int(r[7]),
            concurrency=int(r[8]),
            outcome=str(r[9]),
            confirmed=bool(r[10]),
        )
        for r in conn.execute(query).all()
    }


def _scope(
    conn: Connection,
    fleet: dict[int, learning.Sample],
    since_ms: int,
    *,
    profile: str,
    node: tuple[int, str] | None = None,
    node_class: str | None = None,
) -> dict[int, learning.Sample]:
    """The newest samples of one node (*node*: its id and name) or one class: picked from the
    *fleet*'s read when that holds the whole window (fewer than ``MAX_SAMPLES``), else read."""
    if len(fleet) < learning.MAX_SAMPLES:
        if node is not None:
            return {i: s for i, s in fleet.items() if s.node == node[1]}
        return {i: s for i, s in fleet.items() if s.node_class == node_class}
    where = observations.c.node_id == node[0] if node is not None else observations.c.node_class == node_class
    return samples_of(conn, profile, since_ms, where)


def reported_limit(conn: Connection, node: str) -> int | None:
    """The effective limit of *node*'s latest report (``nodes.effective_bytes``, which a report
    sets); None where the node has no report (unknown, or run-only: a start event's limit is not
    its report's) or its report knew no limit."""
    found = conn.execute(
        select(nodes.c.effective_bytes)
        .select_from(nodes.join(latest_reports, latest_reports.c.node_id == nodes.c.id))
        .where(nodes.c.name == node)
    ).scalar()
    return None if found is None else int(found)


def labelled_class(labels_json: str | None) -> str | None:
    """The operator's class in a node's labels (the ``labels`` column), when it follows the rule."""
    if not labels_json:
        return None
    try:
        value = json.loads(labels_json).get(CLASS_LABEL)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and node_class_problem(value) is None else None


def node_class_of(conn: Connection, profile: str, node_id: int) -> str | None:
    """The operator's class of the node (its label), else the class the node's newest observation
    was stored with (of *profile*, else of any), else the one derived from its latest report."""
    labelled = labelled_class(conn.execute(select(nodes.c.labels).where(nodes.c.id == node_id)).scalar())
    if labelled is not None:
        return labelled
    for only in (observations.c.profile == profile, true()):
        found = conn.execute(
            select(observations.c.node_class)
            .where(observations.c.node_id == node_id, only)
            .order_by(observations.c.received_ms.desc(), observations.c.id.desc())
            .limit(1)
        ).scalar()
        if found is not None:
            return str(found)
    row = conn.execute(select(nodes.c.gpus, nodes.c.host_total_bytes).where(nodes.c.id == node_id)).first()
    if row is None:
        return None
    return learning.derive_class(text.loads(row.gpus) if row.gpus else [], row.host_total_bytes)


def recommendation(
    conn: Connection, now: int, profile: str, node: str | None, node_class: str | None, *, budget: int | None = None
) -> dict[str, Any]:
    """The recommendation of *profile* for *node* (or None: no node, the class's or the fleet's),
    of *node_class* (None: the node's), for a run of *budget* bytes (None: any), as the API
    answers it."""
    node_id = None if node is None else conn.execute(select(nodes.c.id).where(nodes.c.name == node)).scalar()
    if node_class is None and node_id is not None:
        node_class = node_class_of(conn, profile, int(node_id))
    since = now - learning.WINDOW_MS
    found = fleet = samples_of(conn, profile, since)
    if node_id is not None and node is not None:
        found = found | _scope(conn, fleet, since, profile=profile, node=(int(node_id), node))
    if node_class is not None:
        found = found | _scope(conn, fleet, since, profile=profile, node_class=node_class)
    answer = learning.recommend(now, node, node_class, list(found.values()), iso_ms, budget=budget)
    return {
        "profile": profile,
        "node": node,
        "node_known": node_id is not None,
        "node_class": node_class,
        "budget_bytes": budget,
        **answer.as_json(iso_ms),
    }


CLASSES_SHOWN = 500  # the most (profile, class) pairs /metrics carries, most observed first


def by_class(conn: Connection, now: int, kept: Kept | None = None) -> list[dict[str, Any]]:
    """For each (profile, class) observed in the window (at most ``CLASSES_SHOWN``, the most
    observed first): what a new node of the class would be told (no node's own samples), for
    /metrics. A profile's answers are computed once for all its classes (``learning.recommend``'s
    memo), and kept in *kept* while its observations do not change (``store/kept.py``)."""
    since = now - learning.WINDOW_MS
    pairs = conn.execute(
        select(observations.c.profile, observations.c.node_class, func.count())
        .where(observations.c.received_ms >= since, LEARNED)
        .group_by(observations.c.profile, observations.c.node_class)
        .order_by(func.count().desc(), observations.c.profile, observations.c.node_class)
        .limit(CLASSES_SHOWN)
    ).all()
    classes: dict[str, list[str]] = {}
    for profile, node_class, _ in pairs:
        classes.setdefault(str(profile), []).append(str(node_class))
    marks = signatures(conn, since, LEARNED) if kept is not None else {}

    def answers(profile: str) -> dict[str, learning.Recommendation]:
        found = fleet = samples_of(conn, profile, since)
        for node_class in classes[profile]:  # a class's older samples, where the fleet's read did not hold them
            found = found | _scope(conn, fleet, since, profile=profile, node_class=node_class)
        memo: dict[str, Any] = {}
        samples = list(found.values())
        return {c: learning.recommend(now, None, c, samples, iso_ms, memo=memo) for c in classes[profile]}

    out: list[dict[str, Any]] = []
    for profile, names in classes.items():
        key = ("by_class", profile, tuple(names))
        compute = functools.partial(answers, profile)
        told = compute() if kept is None else kept.get(key, marks.get(profile), now, compute)
        out.extend({"profile": profile, "node_class": c, "answer": told[c]} for c in names)
    order = {(str(p), str(c)): i for i, (p, c, _) in enumerate(pairs)}
    return sorted(out, key=lambda r: order[(r["profile"], r["node_class"])])
