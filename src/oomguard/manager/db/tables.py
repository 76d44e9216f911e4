"""The database's tables (SQLAlchemy Core), as the head Alembic revision leaves them.

Times are integer epoch milliseconds (``*_ms``), so hour buckets are integer division on both
databases. An ingest id (``ingest_id``: the agent's idempotency key) is unique per node, not across
the fleet (revision 0011). The tables are created and upgraded only by the revisions in ``migrations/``; these
declarations mirror the head revision for queries, every column in its table's one declaration
(the revision that added it noted beside it).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
)

metadata = MetaData()

# The row id of the tables that grow with every report and event (revision 0008): PostgreSQL's
# bigint; on SQLite the INTEGER PRIMARY KEY, which is the 64-bit rowid.
ROW_ID = BigInteger().with_variant(Integer(), "sqlite")

nodes = Table(
    "nodes",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("first_seen_ms", BigInteger, nullable=False),
    Column("last_seen_ms", BigInteger, nullable=False),
    Column("interval_ms", BigInteger),
    # Unused since revision 0005, always NULL: the latest report lives in ``latest_reports``, so a
    # node row stays small and a scan of 10,000 of them stays fast (kept for the older revisions).
    Column("latest_report", Text),
    Column("effective_bytes", BigInteger),
    Column("host_total_bytes", BigInteger),
    Column("budget_bytes", BigInteger),
    Column("limited_by", String(16)),
    Column("runtime", String(32)),
    Column("memlock_soft_bytes", BigInteger),
    Column("warnings", Text),  # JSON list of warning codes of the latest report; NULL: no report ever
    Column("gpus", Text),  # JSON list of {index, name, memory_total_bytes, memory_free_bytes}
    Column("concurrency", Integer),  # the plan's concurrency, when the agent plans
    # Revision 0004: the agent's time minus the receive time, of the node's latest report.
    Column("clock_skew_ms", BigInteger),
    # Revision 0005: the latest report's usage and working set (NULL: unknown, never 0) ...
    Column("usage_bytes", BigInteger),
    Column("working_set_bytes", BigInteger),
    # ... when the retention pass archived the node (NULL: not archived; --forget-after) ...
    Column("archived_ms", BigInteger),
    # ... and its supervisor's last sign of life: the receive time of its latest event or
    # heartbeat, and the heartbeat interval the supervisor announced (NULL: the default, 60 s).
    Column("last_event_ms", BigInteger),
    Column("heartbeat_interval_ms", BigInteger),
    # Revision 0006: the first of the consecutive reports whose working set is at or above the
    # line (NULL: the latest is below it); the entrypoint gate's refusal (``refused_ms`` NULL: not
    # refused), its step, exit code and one line; the latest labels (JSON object, sorted keys).
    Column("ws_high_since_ms", BigInteger),
    Column("refused_ms", BigInteger),
    Column("refused_step", String(16)),
    Column("refused_exit_code", Integer),
    Column("refused_message", Text),
    Column("labels", Text),
    Column("cap_ipc_lock", Boolean),  # ... and whether the latest report holds CAP_IPC_LOCK (NULL: unknown)
    # Revision 0009: the latest report's ``consumers`` as kept (JSON list of {name, budget_bytes,
    # used_bytes, available_bytes}; NULL: none sent), and the largest budget among them (NULL: none
    # known), which the ``consumer-budget-above-limit`` alert compares with the effective limit.
    Column("consumers", Text),
    Column("consumer_budget_bytes", BigInteger),
    # Revision 0011: the node's exit events of these reasons ever received, counted as each is
    # stored (/metrics' counters: they never go down, while the events expire at --retention).
    Column("oom_kills_total", BigInteger, nullable=False, server_default="0"),
    Column("pressure_stops_total", BigInteger, nullable=False, server_default="0"),
    # Revision 0013 (issue 38): the kernel's oom_kill counter of the node's group as its latest
    # report read it (NULL: unknown), the counter's file (a new one: a new group, counted from 0),
    # and the kills its rises add up to (store/kernel_ooms.py); the supervisor's lifecycle state by
    # its latest start, exit, restart, give-up, stop or gate event (NULL: no supervisor heard of).
    Column("kernel_oom_kill", BigInteger),
    Column("kernel_oom_source", String(512)),
    Column("kernel_oom_kills_total", BigInteger, nullable=False, server_default="0"),
    Column("supervisor_state", String(16)),
    Index("ix_nodes_archived", "archived_ms"),
)

node_labels = Table(  # revision 0006: the latest labels again, one row each, for ``label=KEY=VALUE``
    "node_labels",
    metadata,
    Column("node_id", Integer, ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True),
    Column("key", String(63), primary_key=True),
    Column("value", String(256), nullable=False),
    Index("ix_node_labels_key_value", "key", "value"),
)

latest_reports = Table(  # revision 0005: each node's latest report, whole (the node page's "latest")
    "latest_reports",
    metadata,
    Column("node_id", Integer, ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True),
    Column("received_ms", BigInteger, nullable=False),
    Column("report", Text, nullable=False),
)

reports = Table(
    "reports",
    metadata,
    Column("id", ROW_ID, primary_key=True),  # revision 0008: 64-bit
    Column("node_id", Integer, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("ingest_id", String(128), nullable=False),
    Column("received_ms", BigInteger, nullable=False),
    # Revision 0004: the time the agent put on the report (its ``time``), as reported; ``received_ms``
    # is the manager's own clock when the report arrived.
    Column("agent_ms", BigInteger),
    Column("effective_bytes", BigInteger),
    Column("budget_bytes", BigInteger),
    Column("usage_bytes", BigInteger),
    Column("working_set_bytes", BigInteger),
    Index("ix_reports_node_time", "node_id", "received_ms"),
    UniqueConstraint("node_id", "ingest_id", name="uq_reports_node_ingest"),  # revision 0011: ids by node
)

events = Table(
    "events",
    metadata,
    Column("id", ROW_ID, primary_key=True),  # revision 0008: 64-bit
    Column("node_id", Integer, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("ingest_id", String(128), nullable=False),
    Column("received_ms", BigInteger, nullable=False),
    Column("time", String(64)),
    Column("kind", String(16), nullable=False),
    Column("reason", String(16)),
    Column("exit_code", Integer),
    Column("signal", Integer),
    Column("budget_bytes", BigInteger),
    Column("concurrency", Integer),
    Column("peak_bytes", BigInteger),
    Column("duration_s", Float),
    Column("kills", BigInteger),  # revision 0013: a kernel-oom row's kills (the counter's rise)
    Column("body", Text, nullable=False),
    Index("ix_events_node_time", "node_id", "received_ms"),
    Index("ix_events_reason_time", "reason", "received_ms"),
    Index("ix_events_node_agent_time", "node_id", "time"),  # revision 0012: an exit confirms a failed run
    UniqueConstraint("node_id", "ingest_id", name="uq_events_node_ingest"),  # revision 0011: ids by node
)

# Revision 0007: what each run of a profiled worker really used (``POST /api/v1/observations``),
# which ``oomguard.manager.learning`` learns from. ``node_class``: the operator's label, or the class
# derived from the node's latest report when the observation was stored; ``observed``: the agent's
# time, as reported. Revision 0010: ``excluded``, set by an operator (``POST
# /api/v1/observations/{node}/{id}/exclude``): kept and shown, but not learned from.
observations = Table(
    "observations",
    metadata,
    Column("id", ROW_ID, primary_key=True),  # revision 0008: 64-bit
    Column("node_id", Integer, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("ingest_id", String(128), nullable=False),
    Column("received_ms", BigInteger, nullable=False),
    Column("observed", String(64), nullable=False),
    Column("profile", String(128), nullable=False),
    Column("node_class", String(64), nullable=False),
    Column("declared_per_job_bytes", BigInteger, nullable=False),
    Column("peak_per_job_bytes", BigInteger, nullable=False),
    Column("declared_baseline_bytes", BigInteger, nullable=False),
    Column("peak_baseline_bytes", BigInteger),
    Column("concurrency", Integer, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("excluded", Boolean, nullable=False, server_default=false()),  # revision 0010
    # Revision 0012: a failed run (oom-kill, pressure-stop) that an exit event of the node's own
    # supervisor shows (store/claims.py); only a confirmed failure raises its class's floor.
    Column("confirmed", Boolean, nullable=False, server_default=false()),
    Index("ix_observations_profile_time", "profile", "received_ms"),
    Index("ix_observations_class_time", "profile", "node_class", "received_ms"),
    Index("ix_observations_node_time", "node_id", "received_ms"),
    Index("ix_observations_node_observed", "node_id", "observed"),  # revision 0012
    UniqueConstraint("node_id", "ingest_id", name="uq_observations_node_ingest"),  # revision 0011: ids by node
)

# Revision 0014 (issue 39, item 7): nodes whose tokens are revoked: every write of such a node, and
# a read with its token, is 403 on every replica (each reads this table every second: web.deps.Revoked),
# without rotating the fleet secret. Not a foreign key: a node forgotten (its rows deleted) stays revoked.
revoked_nodes = Table(
    "revoked_nodes",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("revoked_ms", BigInteger, nullable=False),
    Column("reason", String(500)),
)

# Revision 0004: ``thinned_below``, the one-hour line of the last retention pass that completed.
retention_state = Table(
    "retention_state",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("value_ms", BigInteger, nullable=False),
)
