"""Prometheus text exposition of every node's numbers and of the manager's own health
(prometheus_client does the format).

``oomguard_manager_db_errors_total{kind}`` counts the requests answered 503 because of the
database, by kind (``oomguard.manager.store.health.KINDS``; every kind is present from the start, at 0,
so a rate() over it works before the first failure). When the database cannot be read, /metrics
still answers with these (and ``oomguard_manager_database_up 0``), without the node series.

A node's gauge whose value is unknown (a report without usage, say) has no sample, never NaN or
0; usage and working set are sampled only while the node is online (an offline node's last
reading is history, and Prometheus should see it go stale); archived nodes have no series at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

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


CURRENT_ONLY = ("usage_bytes", "working_set_bytes")  # sampled only while the node is online


class _Nodes:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def collect(self) -> Iterator[Metric]:
        for name, key, doc in GAUGES:
            g = GaugeMetricFamily(name, doc, labels=["node"])
            for r in self.rows:
                v = r[key]
                if key in CURRENT_ONLY and r["status"] != "online":
                    continue  # an offline node's last usage is history, not a reading: no sample
                if v is None and key == "memlock_soft_bytes" and r["effective_bytes"] is not None:
                    v = math.inf
                if v is not None:
                    g.add_metric([r["name"]], float(v))
            yield g
        c = CounterMetricFamily(
            "oomguard_oom_kills",
            "OOM kills reported by the node's supervisor, kept across container restarts.",
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
        for r in self.rows:
            c.add_metric([r["name"]], float(r["oom_kills_total"] or 0))
            stops.add_metric([r["name"]], float(r.get("pressure_stops_total") or 0))
            seen.add_metric([r["name"]], r["last_seen_ms"] / 1000)
            up.add_metric([r["name"]], 1.0 if r["status"] in ("online", "run-only") else 0.0)
        yield c
        yield stops
        yield seen
        yield up


class _Manager:
    def __init__(self, db_errors: dict[str, int], db_up: bool) -> None:
        self.db_errors = db_errors
        self.db_up = db_up

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


def render_metrics(rows: list[dict[str, Any]] | None, db_errors: dict[str, int]) -> tuple[bytes, str]:
    """The exposition: node series from *rows* (None: the database could not be read) and the manager's own."""
    registry = CollectorRegistry()
    if rows is not None:
        registry.register(_Nodes(rows))
    registry.register(_Manager(db_errors, rows is not None))
    return generate_latest(registry), CONTENT_TYPE_LATEST
