"""The manager's database, as the routes use it: ``Store`` reads and writes (on the tables of
``oomguard.manager.db``); SQLAlchemy Core, bound parameters only.

- ``writer``: reports and events in, on one writer thread with group commit (``commit``): each
  write returns only after the commit that holds it, and writes that arrive together share one;
  the writes held at once are bounded in bytes (*write_queue_bytes*; beyond it a write is a 503
  at once), and one whose request timed out (503) before the writer took it is withdrawn;
  every row is stamped with the manager's receive time, the agent's time kept beside it;
- ``queries``: the node list, a node's detail, the dashboard's cards, metric rows; ``history``:
  a node's history, downsampled for charts or a page at a time;
- the policies beside it: ``oomguard.manager.alerts`` (statuses, alerts) and
  ``oomguard.manager.retention`` (what history is kept, which silent nodes are archived: its own
  connection, small batches, one replica at a time on PostgreSQL);
- ``forget_node``: a node and all its rows deleted, on the writer thread (the admin token is the
  caller's to check); ``set_excluded``: an observation excluded from what the fleet learns, or
  included again, likewise;
- ``health``: database failures seen by the routes: their kinds, each outage episode logged once;
- ``growth``: how many nodes were created in the last hour (the new-node cap, shared by replicas);
- ``overview``: the dashboard overview's answer, kept a few seconds where it is slow to compute;
- ``learned``: what the fleet has learned of a profile (``oomguard.manager.learning``'s rule on
  the observations);
- ``text``: stored JSON read back whatever text it holds (a lone surrogate comes back as its escape).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine

from oomguard.manager.bodies import EventEnvelope, ObservationEnvelope, ReportEnvelope
from oomguard.manager.db import fleet_read
from oomguard.manager.retention import Retention
from oomguard.manager.settings import Settings
from oomguard.manager.store import alerting, learned, profiles, queries, revoked
from oomguard.manager.store.claims import Caps, Refused
from oomguard.manager.store.commit import DEFAULT_MAX_BYTES as DEFAULT_WRITE_QUEUE_BYTES
from oomguard.manager.store.history import CURSOR_PATTERN as HISTORY_CURSOR_PATTERN
from oomguard.manager.store.history import parse_cursor
from oomguard.manager.store.kept import Kept
from oomguard.manager.store.overview import Overview
from oomguard.manager.store.queries import DEFAULT_SORT, SORT_KEYS
from oomguard.manager.store.writer import Writer
from oomguard.manager.times import iso_ms, now_ms

HISTORY_POINTS = 500  # the most entries a node's detail carries in ``history`` (a chart's worth)


def fleet_size(overview: dict[str, Any]) -> int:
    """The nodes an overview's answer covers: its cards' counts, every status."""
    cards = overview["summary"]
    return sum(int(cards[k]) for k in ("online", "offline", "run_only", "refused", "archived"))


class Store:
    """Reads open their own connection; writes go through the one writer thread; retention has its own."""

    def __init__(
        self,
        engine: Engine,
        *,
        default_interval_s: float = Settings.interval_s,
        retention_s: float = Settings.retention_s,
        forget_after_s: float | None = Settings.forget_after_s,
        working_set_line: float = Settings.working_set_line,
        clock: Callable[[], int] = now_ms,
        write_queue_bytes: int = DEFAULT_WRITE_QUEUE_BYTES,
        caps: Caps | None = None,
    ) -> None:
        self.engine = engine
        self.default_interval_ms = int(default_interval_s * 1000)
        self.retention_ms = int(retention_s * 1000)
        self.line = working_set_line  # the working-set alert's line, a share of the effective limit
        self.clock = clock
        self._writer = Writer(engine, clock, working_set_line, write_queue_bytes, caps)
        self.caps = self._writer.caps  # distinct profiles and classes (claims.Caps): set by the app's settings
        self.overview_kept = Overview(clock, fleet_size)
        self.lessons = Kept()  # /metrics' recommendations, kept while their profile's observations hold
        forget_ms = int(forget_after_s * 1000) if forget_after_s else None
        self.retention = Retention(
            engine, self.retention_ms, forget_after_ms=forget_ms, default_interval_ms=self.default_interval_ms
        )

    # -- writes --------------------------------------------------------------------------------
    async def ingest_report_async(self, env: ReportEnvelope, report_json: str, sent_ms: int | None = None) -> bool:
        """Store a report (received now; *sent_ms*: the agent's own time, kept as reported); False when
        its id was stored before (nothing changes then)."""
        return await self._writer.report(env, report_json, sent_ms)

    async def ingest_event_async(self, env: EventEnvelope, body_json: str) -> bool:
        """Store an event (received now); False when its id was stored before."""
        return await self._writer.event(env, body_json)

    async def ingest_observation_async(self, env: ObservationEnvelope) -> bool | Refused:
        """Store an observation (received now); False when its id was stored before; ``Refused``
        where its node may not post it (``claims``)."""
        return await self._writer.observation(env)

    async def warm(self, limit: int) -> list[str]:
        """The names of up to *limit* nodes, their ids cached for the writer (``Writer.warm``)."""
        return await self._writer.warm(limit)

    async def forget_node(self, name: str) -> bool:
        """Delete the node *name* and all its rows (reports, events); False when there is no such
        node. A later report or event from it starts it anew. The caller checks the admin token."""
        forgotten = await self._writer.forget(name)
        self.overview_kept.clear()  # this replica's overview lists it no more
        return forgotten

    async def revoke(self, node: str, reason: str | None = None) -> bool:
        """Revoke *node*'s token (``revoked``); False when it was revoked already. The caller
        checks the admin token."""
        now = self.clock()
        return bool(await self._writer.committer.submit_async(lambda conn: revoked.revoke(conn, node, now, reason)))

    async def unrevoke(self, node: str) -> bool:
        """Take *node* off the revoked list; False when it was not on it."""
        return bool(await self._writer.committer.submit_async(lambda conn: revoked.unrevoke(conn, node)))

    def revoked_nodes(self) -> list[dict[str, Any]]:
        """Every revoked node (``revoked.listed``): each replica reads it every second (``web.deps.Revoked``)."""
        with self.engine.connect() as conn:
            return revoked.listed(conn)

    async def set_excluded(self, node: str, ingest_id: str, excluded: bool, profile: str | None = None) -> bool:
        """Exclude the observation *ingest_id* of *node* (of *profile*, when given) from what the
        fleet learns, or include it again (``Writer.set_excluded``); False when there is no such
        observation. The caller checks the admin token."""
        return await self._writer.set_excluded(node, ingest_id, excluded, profile)

    def thin(self, now: int | None = None) -> dict[str, int]:
        """One retention pass (see ``oomguard.manager.retention``): the rows it removed, by kind,
        the nodes it archived (``archived_nodes``), its ``batches``, and ``skipped`` (1 when
        another replica's pass holds the lock)."""
        return self.retention.run(self.clock() if now is None else now)

    # -- reads ---------------------------------------------------------------------------------
    @contextmanager
    def _fleet(self) -> Iterator[Connection]:
        """A connection for a read over the whole fleet: planned as ``db.fleet_read`` says."""
        with self.engine.connect() as conn:
            yield fleet_read(conn)

    def list_nodes(
        self,
        *,
        status: str | None = None,
        q: str | None = None,
        limit: int = 100,
        offset: int = 0,
        sort: str = "name",
        label: tuple[str, str] | None = None,
        supervisor: str | None = None,
    ) -> dict[str, Any]:
        """A page of node summaries: *status* one of ``alerts.STATUSES`` (None: every node not
        archived), *q* a part of the name, *label* a (key, value) the node's latest labels hold,
        *supervisor* a supervisor state (``alerts.SUPERVISOR_STATES``), *sort* a key of
        ``SORT_KEYS`` (``-`` for descending)."""
        with self._fleet() as conn:
            query = {"status": status, "q": q, "limit": limit, "offset": offset, "sort": sort, "label": label}
            query["supervisor"] = supervisor
            return self._listing(conn, self.clock(), **query)

    def _listing(self, conn: Connection, now: int, **query: Any) -> dict[str, Any]:
        return queries.list_nodes(conn, now, self.default_interval_ms, line=self.line, **query)

    def node_detail(
        self,
        name: str,
        *,
        events_limit: int = 500,
        history_points: int = HISTORY_POINTS,
        history_since_ms: int | None = None,
        timeline: tuple[int, int] | None = None,
    ) -> dict[str, Any] | None:
        """The node's summary, open alerts, latest report, its latest *events_limit* events
        (``node_events`` pages through all), and ``history``: at most *history_points* entries
        (downsampled past that; ``history_count`` says how many reports it covers), of the reports
        received from *history_since_ms* (epoch ms) on, or of all when None. *timeline* (limit,
        offset): also ``timeline``, that page of ``node_events``, read in the same connection."""
        with self.engine.connect() as conn:
            return queries.node_detail(
                conn,
                self.clock(),
                self.default_interval_ms,
                name,
                events_limit=events_limit,
                history_points=max(2, history_points),
                history_since_ms=history_since_ms,
                line=self.line,
                timeline=timeline,
            )

    def node_events(self, name: str, *, limit: int = 25, offset: int = 0) -> dict[str, Any] | None:
        """A page of the node's events, newest first: ``{node, events, total, limit, offset}``;
        None for no such node."""
        with self.engine.connect() as conn:
            return queries.node_events(conn, name, limit, offset)

    def node_history(self, name: str, *, limit: int = 500, before: str | None = None) -> dict[str, Any] | None:
        """A page of the node's stored reports, newest first: ``{node, history, next}``; pass ``next``
        as *before* for the following page (ValueError for a malformed one); None for no such node."""
        cursor = parse_cursor(before)
        with self.engine.connect() as conn:
            return queries.node_history(conn, name, max(1, limit), cursor)

    def alerts(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Every open alert (at most *limit*), the riskiest nodes first: ``alerting.fleet_alerts``."""
        with self._fleet() as conn:
            return alerting.fleet_alerts(conn, self.clock(), self.default_interval_ms, limit, self.line)

    def alert_groups(self, shown: int, show_all: str = "", start: int = 0, page: int = 500) -> dict[str, Any]:
        """The overview's alerts: the count of each kind and its first *shown* alerts (the kind
        *show_all*: *page* of them from *start*), ``alerting.alert_groups``."""
        with self._fleet() as conn:
            query = {"shown": shown, "show_all": show_all, "start": start, "page": page}
            return self._alert_groups(conn, self.clock(), **query)

    def _alert_groups(self, conn: Connection, now: int, **query: Any) -> dict[str, Any]:
        return alerting.alert_groups(conn, now, self.default_interval_ms, line=self.line, **query)

    def overview(self, listing: dict[str, Any], alerts: dict[str, Any]) -> dict[str, Any]:
        """The dashboard overview, read at one time on one connection: ``listing`` (``list_nodes``
        of the keywords *listing*), ``alerts`` (``alert_groups`` of the keywords *alerts*),
        ``summary``; and ``kept``: None when it is the database as it is now, else when it was
        computed and its age (``overview``: slow answers are kept a few seconds)."""
        key = (tuple(sorted(listing.items())), tuple(sorted(alerts.items())))

        def compute() -> dict[str, Any]:
            now = self.clock()
            with self._fleet() as conn:  # the cards, the alert counts and the page's ids: one pass
                cards, counts, nodes = queries.overview(conn, now, self.default_interval_ms, self.line, **listing)
                return {
                    "listing": nodes,
                    "alerts": self._alert_groups(conn, now, **alerts, counts=counts),
                    "summary": cards,
                }

        value, kept = self.overview_kept.read(key, compute)
        if kept is not None:
            kept = {"as_of": iso_ms(kept["computed_ms"]), "age_s": kept["age_s"], "took_s": kept["took_s"]}
        return {**value, "kept": kept}

    def recommendation(
        self, profile: str, node: str | None = None, node_class: str | None = None, budget: int | None = None
    ) -> dict[str, Any]:
        """What the fleet has learned of *profile* for *node* of *node_class*, for a run of *budget*
        bytes (``learned``)."""
        with self.engine.connect() as conn:
            return learned.recommendation(conn, self.clock(), profile, node, node_class, budget=budget)

    def profiles_index(self) -> list[dict[str, Any]]:
        """The profiles observed in the window, the most observed first (``profiles``)."""
        with self.engine.connect() as conn:
            return profiles.profiles_index(conn, self.clock())

    def profile_view(self, profile: str, offset: int = 0) -> dict[str, Any] | None:
        """What the fleet learned of *profile*, for its page, with a page of its observations from
        *offset* (``profiles.profile_view``)."""
        with self.engine.connect() as conn:
            return profiles.profile_view(conn, self.clock(), profile, offset)

    def reported_limit(self, node: str) -> int | None:
        """The effective limit of *node*'s latest report; None: no report, or no limit known in it
        (``learned.reported_limit``)."""
        with self.engine.connect() as conn:
            return learned.reported_limit(conn, node)

    def class_recommendations(self) -> list[dict[str, Any]]:
        """Each observed (profile, class)'s recommendation for a new node of it (``learned.by_class``)."""
        with self.engine.connect() as conn:
            return learned.by_class(conn, self.clock(), self.lessons)

    def summary(self) -> dict[str, int]:
        with self._fleet() as conn:
            return queries.summary(conn, self.clock(), self.default_interval_ms)

    def metric_rows(self) -> list[dict[str, Any]]:
        with self._fleet() as conn:
            return queries.metric_rows(conn, self.clock(), self.default_interval_ms, self.line)


__all__ = [
    "DEFAULT_SORT",
    "DEFAULT_WRITE_QUEUE_BYTES",
    "HISTORY_CURSOR_PATTERN",
    "HISTORY_POINTS",
    "SORT_KEYS",
    "Store",
]
