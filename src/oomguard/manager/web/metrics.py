"""Prometheus text exposition of every node's numbers and of the manager's own health
(prometheus_client does the format).

``oomguard_manager_db_errors_total{kind}`` counts the requests answered 503 because of the
database, by kind (``oomguard.manager.store.health.KINDS``; every kind is present from the start, at 0,
so a rate() over it works before the first failure); ``oomguard_manager_quota_refusals_total{kind}``
the events and observations answered 429 by their node's quota a minute (``web.quotas``; both
kinds at 0 from the start); ``oomguard_manager_cap_refusals_total`` the observations answered 429
by a cap on distinct profiles or classes (``store/claims.py``); ``oomguard_manager_recommendations_up``
is 0 when the ``oomguard_profile_*`` series were not computed within the request's time (the
recommender's CPU: the database is not blamed for it; ``store/kept.py`` keeps the answer for the
next scrape). When the database cannot be read, /metrics
still answers with these (and ``oomguard_manager_database_up 0``), without the node series.

A node's gauge whose value is unknown (a report without usage, say) has no sample, never NaN or
0; usage, working set and its ratio to the limit are sampled only while the node's latest report
is current (an offline node's last reading is history, and Prometheus should see it go stale);
archived nodes have no series at all.

Names follow https://prometheus.io/docs/practices/naming/: base units, ``_bytes``, ``_ratio``
for a ratio of 0 to 1 (``oomguard_memory_working_set_ratio``), ``_total`` for counters.
``oomguard_nodes{state}`` counts the nodes by status (every status there, at 0 when none, so an
alert on ``state="refused"`` works before the first refusal). The node's labels are on one series
only, ``oomguard_node_info{node, ...} 1`` (the info-metric pattern: "a metric with a constant
value of 1 and the labels as its labels", https://prometheus.io/docs/concepts/metric_types/ and
OpenMetrics' Info type), joined where wanted with ``* on (node) group_left(...)``; never on every
series, which would multiply the cardinality. A label named ``node`` is exported as
``exported_node``, as Prometheus itself renames a target's label that clashes
(https://prometheus.io/docs/prometheus/latest/configuration/configuration/#scrape_config,
``honor_labels``). ``oomguard_memory_working_set_high_since_timestamp_seconds{node}`` is the
manager's own ``working-set-high`` alert (its line, its budget rule, since when), on the nodes
that have it only, so the Prometheus rule asks the manager's question rather than a copy of it;
``oomguard_manager_working_set_line_ratio`` is the line. ``oomguard_profile_*{profile,
node_class}``: what the fleet has learned of each profile per class of node, as a new node of
the class would be told (``store/learned.py``; at most 500 pairs, the most observed first).
``oomguard_consumer_budget_bytes{node, consumer}`` and ``oomguard_consumer_used_bytes{node,
consumer}``: a memory consumer's own view of its budget (CuZK's, ``agent --cuzk-status``), from the
node's latest report; no sample where the consumer's value is unknown (its status could not be
read) and none for a node whose latest report sent no consumers; the used bytes, a reading, only
while the report is current, as usage is. The ``consumer-budget-above-limit`` alert compares the
budget with ``oomguard_memory_effective_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from oomguard.manager.alerts import DEFAULT_LINE, working_set_ratio
from oomguard.manager.store import text

GAUGES = (
    ("oomguard_memory_effective_bytes", "effective_bytes", "The hard memory ceiling of the node's worker."),
    ("oomguard_memory_host_total_bytes", "host_total_bytes", "MemTotal seen by the node (the host's RAM)."),
    ("oomguard_budget_bytes", "budget_bytes", "The memory budget the node computed."),
    ("oomguard_memlock_soft_bytes", "memlock_soft_bytes", "RLIMIT_MEMLOCK soft limit (+Inf: unlimited)."),
    (
        "oomguard_memory_usage_bytes",
        "usage_bytes",
        "memory.current (v2) or memory.usage_in_bytes (v1) of the node's group, latest report; page cache included.",
    ),
    (
        "oomguard_memory_working_set_bytes",
        "working_set_bytes",
        "Working set of the node's group, latest report: usage minus inactive_file (as the kubelet computes it).",
    ),
)


CURRENT_ONLY = ("usage_bytes", "working_set_bytes")  # sampled only while the latest report is current
STATES = ("online", "offline", "run-only", "refused")  # oomguard_nodes{state}: the statuses but archived


def node_info(rows: list[dict[str, Any]]) -> Metric:
    """``oomguard_node_info{node, <labels>} 1``: each node's latest labels, on this one series."""
    info = Metric("oomguard_node_info", "The node's latest labels (value 1), to join on node.", "gauge")
    for r in rows:
        labels = text.loads(r["labels"]) if r.get("labels") else {}  # text an older manager kept too
        named = {("exported_node" if k == "node" else k): str(v) for k, v in labels.items()}
        info.add_sample("oomguard_node_info", {"node": r["name"], **named}, 1.0)
    return info


CONSUMER_GAUGES = (
    (
        "oomguard_consumer_budget_bytes",
        "budget_bytes",
        "A memory consumer's own budget, as it said (CuZK: memory.total_bytes of GET /status); none when unknown.",
    ),
    (
        "oomguard_consumer_used_bytes",
        "used_bytes",
        "What a memory consumer has reserved from its own budget (CuZK: memory.used_bytes), while the latest "
        "report is current; none when unknown.",
    ),
)


def consumer_gauges(rows: list[dict[str, Any]]) -> Iterator[Metric]:
    """``CONSUMER_GAUGES`` by node and consumer, from each row's kept ``consumers`` list (JSON)."""
    for name, key, doc in CONSUMER_GAUGES:
        g = GaugeMetricFamily(name, doc, labels=["node", "consumer"])
        for r in rows:
            if key == "used_bytes" and not r.get("current"):
                continue  # an offline node's last reading is history: no sample
            items = text.loads(r["consumers"]) if r.get("consumers") else []
            seen: set[str] = set()  # one series per consumer name: the first of a report's entries
            for c in items if isinstance(items, list) else []:
                named = isinstance(c, dict) and isinstance(c.get("name"), str) and c["name"] not in seen
                v = c.get(key) if named else None
                if named:
                    seen.add(c["name"])
                if isinstance(v, int) and not isinstance(v, bool):
                    g.add_metric([r["name"], c["name"]], float(v))
        yield g


class _Nodes:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def collect(self) -> Iterator[Metric]:
        for name, key, doc in GAUGES:
            g = GaugeMetricFamily(name, doc, labels=["node"])
            for r in self.rows:
                v = r[key]
                if key in CURRENT_ONLY and not r.get("current", r["status"] == "online"):
                    continue  # an offline node's last usage is history, not a reading: no sample
                if v is None and key == "memlock_soft_bytes" and r["effective_bytes"] is not None:
                    # A report's null soft limit is unlimited; a run-only node sent none: unknown, no sample.
                    v = None if r.get("run_only") else math.inf
                if v is not None:
                    g.add_metric([r["name"]], float(v))
            yield g
        ratio = GaugeMetricFamily(
            "oomguard_memory_working_set_ratio",
            "Working set over the effective limit (0 to 1; above 1 past it), while the latest report is current.",
            labels=["node"],
        )
        for r in self.rows:
            value = working_set_ratio(r["working_set_bytes"], r["effective_bytes"])
            if value is not None and r.get("current"):
                ratio.add_metric([r["name"]], value)
        yield ratio
        since = GaugeMetricFamily(
            "oomguard_memory_working_set_high_since_timestamp_seconds",
            "When the node's working-set-high alert began (at or above the manager's line, or above the budget);"
            " only nodes that have it.",
            labels=["node"],
        )
        for r in self.rows:
            if r.get("ws_high_since_ms") is not None:
                since.add_metric([r["name"]], r["ws_high_since_ms"] / 1000)
        yield since
        states = GaugeMetricFamily("oomguard_nodes", "Nodes by status (archived ones left out).", labels=["state"])
        for state in STATES:
            states.add_metric([state], float(sum(1 for r in self.rows if r["status"] == state)))
        yield states
        yield node_info(self.rows)
        yield from consumer_gauges(self.rows)
        c = CounterMetricFamily(
            "oomguard_oom_kills",
            "OOM kills reported by the node's supervisor (run's exit events), kept across container restarts.",
            labels=["node"],
        )
        stops = CounterMetricFamily(
            "oomguard_pressure_stops",
            "Graceful stops by run --guard before the kernel's OOM killer acted (not OOM kills).",
            labels=["node"],
        )
        seen = GaugeMetricFamily(
            "oomguard_node_last_seen_timestamp_seconds",
            "Time of the node's last report (a run-only node's: its supervisor's last event or heartbeat).",
            labels=["node"],
        )
        up = GaugeMetricFamily(
            "oomguard_node_up",
            "1 while the node reports (or, run-only, its supervisor's heartbeat arrives), 0 once it is offline.",
            labels=["node"],
        )
        kernel = CounterMetricFamily(
            "oomguard_kernel_oom_kills",
            "OOM kills of any process in the node's group, by the kernel's oom_kill counter its agent reports "
            "(the counter's rises, summed; kept apart from the supervised ones, never added to them).",
            labels=["node"],
        )
        supervisor = GaugeMetricFamily(
            "oomguard_supervisor_state",
            "1 for the node's supervisor's state (lost: no event or heartbeat for 3 heartbeat intervals); "
            "nodes without a supervisor have no sample.",
            labels=["node", "state"],
        )
        for r in self.rows:
            c.add_metric([r["name"]], float(r["oom_kills_total"] or 0))
            if not r.get("run_only"):  # a node whose agent reports: its kernel counter is known
                kernel.add_metric([r["name"]], float(r.get("kernel_oom_kills_total") or 0))
            if r.get("supervisor"):
                supervisor.add_metric([r["name"], str(r["supervisor"])], 1.0)
            stops.add_metric([r["name"]], float(r.get("pressure_stops_total") or 0))
            seen.add_metric([r["name"]], r["last_seen_ms"] / 1000)
            up.add_metric([r["name"]], 1.0 if r["status"] in ("online", "run-only") else 0.0)
        yield c
        yield kernel
        yield supervisor
        yield stops
        yield seen
        yield up


class _Learned:
    """What the fleet has learned, per (profile, class of node): for a new node of the class."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def collect(self) -> Iterator[Metric]:
        labels = ["profile", "node_class"]
        size = GaugeMetricFamily(
            "oomguard_profile_recommended_per_job_bytes",
            "The per-job size a new node of the class is told to plan the profile's jobs at (none: nothing learned).",
            labels=labels,
        )
        floor = GaugeMetricFamily(
            "oomguard_profile_floor_per_job_bytes",
            "The per-job floor the class's OOM kills and pressure stops of the last 14 days raised (0: none).",
            labels=labels,
        )
        p95 = GaugeMetricFamily(
            "oomguard_profile_job_peak_p95_bytes",
            "One job's peak at its 95th percentile, a forecast from the class's runs, else the fleet's "
            "(none: fewer than 10 runs ended well).",
            labels=labels,
        )
        samples = GaugeMetricFamily(
            "oomguard_profile_samples",
            "The observations the recommendation came from (0: the declared size).",
            labels=labels,
        )
        for r in self.rows:
            key, answer = [r["profile"], r["node_class"]], r["answer"]
            if answer.per_job_bytes is not None:
                size.add_metric(key, float(answer.per_job_bytes))
            floor.add_metric(key, float(answer.floor_bytes))
            if answer.peak_p95_per_job_bytes is not None:
                p95.add_metric(key, float(answer.peak_p95_per_job_bytes))
            samples.add_metric(key, float(answer.samples))
        yield size
        yield floor
        yield p95
        yield samples


class _Manager:
    def __init__(
        self,
        db_errors: dict[str, int],
        db_up: bool,
        line: float,
        refusals: dict[str, int],
        *,
        learned_up: bool,
        cap_refusals: int,
    ) -> None:
        self.db_errors = db_errors
        self.db_up = db_up
        self.line = line
        self.refusals = refusals
        self.learned_up = learned_up
        self.cap_refusals = cap_refusals

    def collect(self) -> Iterator[Metric]:
        errors = CounterMetricFamily(
            "oomguard_manager_db_errors",
            "Requests answered 503 because of the database, by kind of failure.",
            labels=["kind"],
        )
        for kind, count in self.db_errors.items():
            errors.add_metric([kind], float(count))
        yield errors
        yield GaugeMetricFamily(
            "oomguard_manager_database_up", "1 when this scrape could read the database.", value=float(self.db_up)
        )
        yield GaugeMetricFamily(
            "oomguard_manager_working_set_line_ratio",
            "The working-set alert's line, a share of the effective limit (--working-set-line).",
            value=self.line,
        )
        refused = CounterMetricFamily(
            "oomguard_manager_quota_refusals",
            "Events and observations answered 429 because their node was over its quota a minute, by kind.",
            labels=["kind"],
        )
        for kind, count in self.refusals.items():
            refused.add_metric([kind], float(count))
        yield refused
        yield CounterMetricFamily(
            "oomguard_manager_cap_refusals",
            "Observations answered 429 because a new profile or class would pass a cap (--max-profiles and the like).",
            value=float(self.cap_refusals),
        )
        yield GaugeMetricFamily(
            "oomguard_manager_recommendations_up",
            "1 when this scrape's oomguard_profile_* series were computed within the request's time "
            "(0: the recommender's CPU, not the database; its answer is kept for the next scrape).",
            value=float(self.learned_up),
        )


def render_metrics(
    rows: list[dict[str, Any]] | None,
    db_errors: dict[str, int],
    line: float = DEFAULT_LINE,
    learned: list[dict[str, Any]] | None = None,
    refusals: dict[str, int] | None = None,
    *,
    cap_refusals: int = 0,
    own: list[Any] | None = None,
) -> tuple[bytes, str]:
    """The exposition: node series from *rows* (None: the database could not be read), what the
    fleet has learned (*learned*: ``Store.class_recommendations``; None: not computed in time) and
    the manager's own (with *refusals*: the per-node quotas' 429s by kind, ``web.quotas``;
    *cap_refusals*: the caps' on distinct profiles and classes, ``store/claims.py``)."""
    registry = CollectorRegistry()
    if rows is not None:
        registry.register(_Nodes(rows))
        registry.register(_Learned(learned or []))
    up = rows is not None and learned is not None
    registry.register(
        _Manager(db_errors, rows is not None, line, refusals or {}, learned_up=up, cap_refusals=cap_refusals)
    )
    for collector in own or []:  # the manager's own: failed tokens, HTTP, process, build (web.observed)
        registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST
