"""What a node may say of the fleet's lessons (issue 37, items 1 and 2): only of its own class, an
OOM kill only as its own supervisor saw it, and of a bounded number of profiles and classes.

- **Its class** (``own_class``): the ``node_class`` label its own reports and events last carried
  (``nodes.labels``: ``--node-class``, ``OOMGUARD_NODE_CLASS``), else the class derived from its
  latest report (``learning.derive_class``). An observation that names another class, in its
  ``node_class`` or its envelope's labels, is refused (422 naming the field): before, one node
  could post for any class and set that class's plan. Only a node the manager has neither a
  labelled report or event nor a report of (a run-only node's first word) names its class in the
  observation, which then becomes its label.
- **Its kills** (``confirmed``): an ``oom-kill`` or ``pressure-stop`` observation raises its
  class's floor only when an exit event of the same node, reason and time (``run`` sends the
  observation with its exit event's ``time``) is stored, before it or after it (the event's ingest
  confirms the observations it matches). Until then it is an *unconfirmed* failure: a sample like
  any other, bounded as every node's are (``learning.bounded``), not a floor.
- **How much** (``Caps``): distinct profiles and classes among the observations of the window
  (``learning.WINDOW_MS``), per node and over the fleet: a new one past a cap is refused (429
  with the reason). 2,000 class names from one node had made every page of the fleet's lessons
  compute 2,000 recommendations (issue 37: the profile page 503, /metrics blind).

The caps' counts are kept on the writer thread (one per manager): read from the database on
first use and again, at most every ``RECOUNT_MS``, before a refusal (rows past the window drop
out then); between two recounts another replica's new profiles are unseen, so a fleet of R
replicas holds at most R - 1 times a cap's new names beyond it until the next recount.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection, and_, select, update

from oomguard._types import FAILURES
from oomguard.manager import learning
from oomguard.manager.db import events, nodes, observations
from oomguard.manager.settings import MAX_CLASSES, MAX_CLASSES_PER_NODE, MAX_PROFILES, MAX_PROFILES_PER_NODE
from oomguard.manager.store import text
from oomguard.manager.store.learned import labelled_class

CAP_RETRY_AFTER_S = 86_400  # a cap's 429: Retry-After a day, which the agent takes as lasting (client.LASTING_S)
RECOUNT_MS = 60_000  # a cap's count is read again at most this often, before it refuses


@dataclass(frozen=True)
class Refused:
    """An observation the node may not post: *status* (422 or 429) and the one line why. A value,
    not an exception: raised inside the group commit, it would roll back the writes beside it."""

    status: int
    reason: str


def own_class(conn: Connection, node_id: int, claimed: str | None, where: str) -> tuple[str, bool] | Refused:
    """(The class the node's observation is stored with, whether *claimed* becomes its label):
    the module's rule. *claimed*: the class the observation names (*where*: the field that named
    it); ``Refused`` (422) where it names another than the node's own."""
    row = conn.execute(
        select(nodes.c.labels, nodes.c.gpus, nodes.c.host_total_bytes, nodes.c.warnings).where(nodes.c.id == node_id)
    ).first()
    labelled = None if row is None else labelled_class(row.labels)
    reported = row is not None and row.warnings is not None  # a report sets warnings (never NULL after one)
    if labelled is None and not reported:
        return (claimed, True) if claimed is not None else (learning.derive_class([], None), False)
    mine = labelled
    if mine is None:
        mine = learning.derive_class(text.loads(row.gpus) if row.gpus else [], row.host_total_bytes)  # type: ignore[union-attr]
    if claimed is not None and claimed != mine:
        how = "its node_class label" if labelled is not None else "derived from its latest report"
        return Refused(
            422,
            f"{where}: this node's class is {mine} ({how}); a node posts observations only for its own class "
            '(docs/manager.md, "The fleet learns")',
        )
    return mine, False


def confirmed(conn: Connection, node_id: int, outcome: str, observed: str) -> bool:
    """Whether a failed run's observation (*outcome*, at *observed*, the agent's time) is shown by
    an exit event of the node's own supervisor: same node, reason and time. An ``ok`` run needs none."""
    if outcome not in FAILURES:
        return True
    found = conn.execute(
        select(events.c.id)
        .where(
            events.c.node_id == node_id, events.c.kind == "exit", events.c.reason == outcome, events.c.time == observed
        )
        .limit(1)
    ).first()
    return found is not None


def confirm(conn: Connection, node_id: int, reason: str | None, time: str | None) -> int:
    """Confirm the node's observations that an exit event of *reason* at *time* shows (stored
    before the event); how many."""
    if reason not in FAILURES or not time:
        return 0
    where = and_(
        observations.c.node_id == node_id,
        observations.c.outcome == reason,
        observations.c.observed == time,
        observations.c.confirmed.is_(False),
    )
    return int(conn.execute(update(observations).where(where).values(confirmed=True)).rowcount or 0)


@dataclass
class Caps:
    """The distinct profiles and classes allowed in the window, over the fleet and per node."""

    profiles: int = MAX_PROFILES
    classes: int = MAX_CLASSES
    profiles_per_node: int = MAX_PROFILES_PER_NODE
    classes_per_node: int = MAX_CLASSES_PER_NODE
    refused: int = 0  # observations refused by a cap, for /metrics
    _fleet: tuple[set[str], set[str]] | None = field(default=None, repr=False)
    _fleet_ms: int = 0
    _nodes: dict[int, tuple[set[str], set[str], int]] = field(default_factory=dict, repr=False)

    def admit(self, conn: Connection, now: int, node_id: int, profile: str, node_class: str) -> Refused | None:
        """Count (*profile*, *node_class*) for *node_id*, or ``Refused`` (429) past a cap."""
        since = now - learning.WINDOW_MS
        if self._fleet is None:
            self._fleet, self._fleet_ms = _fleet_names(conn, since), now
        if node_id not in self._nodes:
            self._nodes[node_id] = (*_node_names(conn, node_id, since), now)
        problem = self._problem(node_id, profile, node_class)
        if problem is not None and now - min(self._fleet_ms, self._nodes[node_id][2]) >= RECOUNT_MS:
            self._fleet, self._fleet_ms = _fleet_names(conn, since), now  # names past the window drop out
            self._nodes[node_id] = (*_node_names(conn, node_id, since), now)
            problem = self._problem(node_id, profile, node_class)
        if problem is not None:
            self.refused += 1
            return Refused(429, problem)
        profiles, classes = self._fleet
        mine = self._nodes[node_id]
        profiles.add(profile)
        classes.add(node_class)
        mine[0].add(profile)
        mine[1].add(node_class)
        return None

    def set_limits(self, *, profiles: int, classes: int, profiles_per_node: int, classes_per_node: int) -> None:
        """The caps (``Settings.caps``)."""
        self.profiles, self.classes = profiles, classes
        self.profiles_per_node, self.classes_per_node = profiles_per_node, classes_per_node

    def forget(self, node_id: int) -> None:
        """Drop a forgotten node's counts (its rows are gone); the fleet's are recounted."""
        self._nodes.pop(node_id, None)
        self._fleet = None

    def reset(self) -> None:
        """Recount from the database at the next observation (a rolled-back batch)."""
        self._fleet, self._nodes = None, {}

    def _problem(self, node_id: int, profile: str, node_class: str) -> str | None:
        assert self._fleet is not None
        profiles, classes = self._fleet
        mine_profiles, mine_classes, _ = self._nodes[node_id]
        checks = (
            (profile, mine_profiles, self.profiles_per_node, "profiles of this node", "--max-profiles-per-node"),
            (node_class, mine_classes, self.classes_per_node, "classes of this node", "--max-classes-per-node"),
            (profile, profiles, self.profiles, "profiles in the fleet", "--max-profiles"),
            (node_class, classes, self.classes, "classes in the fleet", "--max-classes"),
        )
        for name, seen, cap, what, flag in checks:
            if name not in seen and len(seen) >= cap:
                return (
                    f"observation: {len(seen)} {what} in the last 14 days, the cap ({flag} {cap}); "
                    "a new one is refused until older ones leave the window"
                )
        return None


def _fleet_names(conn: Connection, since: int) -> tuple[set[str], set[str]]:
    """The distinct profiles and classes observed from *since* on, over the fleet."""
    recent = observations.c.received_ms >= since
    profiles = {str(p) for (p,) in conn.execute(select(observations.c.profile).where(recent).distinct())}
    classes = {str(c) for (c,) in conn.execute(select(observations.c.node_class).where(recent).distinct())}
    return profiles, classes


def _node_names(conn: Connection, node_id: int, since: int) -> tuple[set[str], set[str]]:
    """The distinct profiles and classes of *node_id*'s observations from *since* on."""
    rows = conn.execute(
        select(observations.c.profile, observations.c.node_class)
        .where(observations.c.node_id == node_id, observations.c.received_ms >= since)
        .distinct()
    ).all()
    return {str(p) for p, _ in rows}, {str(c) for _, c in rows}
