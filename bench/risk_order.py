"""The riskiest first, at fleet scale (issue 38, item 3: "the first page of alerts is the riskiest at
100,000 nodes"): a fleet of N nodes (100,000 by default), every one online, with working sets drawn
over 50-100 % of the limit (1 in 13 unknown), 1 in 50 with a budget above its limit, kernel and
supervised OOM kills on some. For every alert group of the overview, the nodes it shows first
(``alerting.alert_groups``, 5 a group) must be the first of that group by risk as this script
computes it from the values it wrote (working set over limit, highest first and unknown last; then
the kernel's kills kept, the supervised ones, the name); so must the first page of a group shown in
full (``?alerts=KIND``, 500). Then the time of each, ``--runs`` times: the overview's alert groups
and the first page of the largest group.

Only the node rows are written (no history: the alerts read the node rows and the last day's exit
events), so 100,000 nodes load in seconds on SQLite.

Usage: python bench/risk_order.py [--nodes 100000] [--db sqlite|postgresql] [--runs 10] [--seed 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlalchemy import insert  # noqa: E402
from tests.helpers.pg import PostgresServer  # noqa: E402

from oomguard.manager.db import make_engine, migrate, nodes  # noqa: E402
from oomguard.manager.store import Store  # noqa: E402

LIMIT = 342 << 30
SHOWN = 5
PAGE = 500


def fleet(n: int, seed: int) -> list[dict[str, Any]]:
    """The node rows: numbers drawn from *seed*, every node seen now."""
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    rows = []
    for i in range(n):
        ws = None if i % 13 == 0 else int(LIMIT * rng.uniform(0.5, 1.0))
        rows.append(
            {
                "name": f"node-{i:06d}",
                "first_seen_ms": now - 86_400_000,
                "last_seen_ms": now,
                "interval_ms": 30_000,
                "effective_bytes": LIMIT,
                "host_total_bytes": 503 << 30,
                "budget_bytes": (400 if i % 50 == 0 else 300) << 30,
                "limited_by": "cgroup-v2",
                "runtime": "docker",
                "warnings": "[]",
                "working_set_bytes": ws,
                "usage_bytes": None if ws is None else ws + (1 << 30),
                "kernel_oom_kills_total": rng.choice((0, 0, 0, 1, 2)),
                "oom_kills_total": rng.choice((0, 0, 1)),
            }
        )
    return rows


def risk_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """The order ``alerting.risk_order`` promises, computed here from the row as written."""
    ws = row["working_set_bytes"]
    ratio = ws / row["effective_bytes"] if ws is not None else None
    return (ratio is None, -(ratio or 0.0), -row["kernel_oom_kills_total"], -row["oom_kills_total"], row["name"])


def check(store: Store, by_name: dict[str, dict[str, Any]]) -> list[str]:
    """Each group's shown alerts against its members in risk order; the lines to print."""
    lines, groups = [], store.alert_groups(shown=SHOWN)["groups"]
    for group in groups:
        kind, count = group["kind"], group["count"]
        members: list[str] = []
        while len(members) < count:  # every member of the kind, a page at a time
            got = store.alert_groups(shown=SHOWN, show_all=kind, start=len(members), page=PAGE)
            (full,) = [g for g in got["groups"] if g["kind"] == kind]
            if not full["alerts"]:
                break
            members += [a["node"] for a in full["alerts"]]
        assert len(members) == count, (kind, len(members), count)
        ranked = sorted(members, key=lambda name: risk_key(by_name[name]))
        shown = [a["node"] for a in group["alerts"]]
        assert shown == ranked[:SHOWN], (kind, shown, ranked[:SHOWN])
        assert members[:PAGE] == ranked[:PAGE], kind  # the first page shown in full
        top = by_name[shown[0]]
        pct = "unknown" if top["working_set_bytes"] is None else f"{top['working_set_bytes'] * 100 / LIMIT:.2f} %"
        lines.append(f"  {kind}: {count} nodes; the {len(shown)} shown are its riskiest (the first at {pct})")
    return lines


def timed(run: Any, runs: int) -> tuple[float, float]:
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        took.append((time.perf_counter() - t0) * 1000)
    return statistics.median(took), max(took)


def measure(url: str, what: str, opts: argparse.Namespace) -> None:
    migrate(url)
    rows = fleet(opts.nodes, opts.seed)
    t0 = time.perf_counter()
    with make_engine(url, timeout_s=600).begin() as conn:
        conn.execute(insert(nodes), rows)
    print(f"{what}: {opts.nodes} nodes written in {time.perf_counter() - t0:.1f} s (seed {opts.seed})")
    store = Store(make_engine(url, timeout_s=60))
    for line in check(store, {r["name"]: r for r in rows}):
        print(line)
    groups = store.alert_groups(shown=SHOWN)["groups"]
    largest = max(groups, key=lambda g: g["count"])["kind"]
    med, top = timed(lambda: store.alert_groups(shown=SHOWN), opts.runs)
    print(f"  the overview's alert groups ({SHOWN} a group): median {med:.1f} ms, max {top:.1f} ms ({opts.runs} runs)")
    med, top = timed(lambda: store.alert_groups(shown=SHOWN, show_all=largest, page=PAGE), opts.runs)
    print(f"  ?alerts={largest}, its first {PAGE}: median {med:.1f} ms, max {top:.1f} ms ({opts.runs} runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    opts = parser.parse_args()
    if opts.db == "sqlite":
        with tempfile.TemporaryDirectory() as d:
            measure(f"sqlite:///{d}/fleet.db", "SQLite", opts)
        return
    pg = PostgresServer()
    pg.start()
    try:
        measure(pg.create_db("risk"), "PostgreSQL", opts)
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
