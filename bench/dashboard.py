"""Dashboard at fleet scale: 10,000 nodes with 30 days of history at the default 30 s interval,
thinned by retention (every report of the last hour, then one per hour: 839 per node, 8.4 M rows).
Measures the server time (the manager's own Server-Timing header) of the first page, sorted by risk
(the default: OOM kills in 24 h, then working set / limit, then alerts), and of node pages (goals:
under 150 ms and under 100 ms).

The fleet is made online just before measuring (every node seen within 6 s), then every node
offline for an hour for one more line: the first page in an outage (10,000 offline alerts).
PostgreSQL is ANALYZEd after the load, as autovacuum would (``--no-analyze``: measured as loaded).

Usage: python bench/dashboard.py [--nodes 10000] [--db sqlite|postgresql] [--runs 20] [--no-analyze]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import BigInteger, insert, literal, text, update  # noqa: E402
from tests.manager_helpers import fixture_report, write_history, write_latest  # noqa: E402
from tests.pg import PostgresServer  # noqa: E402

from oomguard.manager.app import create_app  # noqa: E402
from oomguard.manager.db import events, make_engine, migrate, nodes  # noqa: E402
from oomguard.manager.settings import Settings  # noqa: E402
from oomguard.manager.store import Store  # noqa: E402

HOUR = 3_600_000


def arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def populate(url: str, n_nodes: int) -> float:
    migrate(url)
    engine = make_engine(url)
    report = fixture_report()
    latest = json.dumps(report)
    gpus = json.dumps([{"index": g, "name": "H100", "memory_total_bytes": 80 << 30} for g in range(8)])
    now = int(time.time() * 1000)
    times = [now - i * 30_000 for i in range(120)] + [now - HOUR - i * HOUR for i in range(719)]
    t0 = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(
            insert(nodes),
            [
                {
                    "name": f"node-{i:05d}",
                    "first_seen_ms": now - 30 * 24 * HOUR,
                    "last_seen_ms": now - (i % 7) * 1000,
                    "interval_ms": 30_000,
                    "effective_bytes": 342 << 30,
                    "host_total_bytes": 503 << 30,
                    "budget_bytes": (332 if i % 50 else 500) << 30,
                    "limited_by": "cgroup-v2",
                    "runtime": "docker",
                    "memlock_soft_bytes": 8 << 20,
                    "warnings": "[]",
                    "gpus": gpus,
                    "concurrency": 0 if i % 97 == 0 else 18,
                    "usage_bytes": None if i % 13 == 0 else (150 << 30) + (i * 7919 % 10_000) * (19 << 20),
                    "working_set_bytes": None if i % 13 == 0 else (100 << 30) + (i * 7919 % 10_000) * (19 << 20),
                }
                for i in range(n_nodes)
            ],
        )
        write_latest(conn, range(1, n_nodes + 1), now, latest)  # the node page's (migration 0005)
    write_history(engine, n_nodes, lambda node_id: times, batch=500)
    with engine.begin() as conn:
        conn.execute(
            insert(events),
            [
                {
                    "node_id": i,
                    "ingest_id": f"e-{i}-{k}-{reason}",
                    "received_ms": now - k * 7 * HOUR,
                    "kind": "exit",
                    "reason": reason,
                    "signal": 9 if reason == "oom-kill" else None,
                    "body": json.dumps({"event": "exit", "reason": reason}),
                }
                for i in range(1, n_nodes + 1, 10)
                for k in range(3)
                for reason in (("oom-kill", "pressure-stop") if i % 50 == 1 else ("oom-kill",))
            ],
        )
    return time.perf_counter() - t0


def server_ms(client: TestClient, path: str) -> float:
    r = client.get(path)
    assert r.status_code == 200, (path, r.status_code)
    return float(r.headers["server-timing"].split("dur=")[1])


def seen(url: str, ago_ms: int) -> None:
    """Every node last seen *ago_ms* (plus 0-6 s) before now. Populating takes minutes, longer than
    three report intervals (90 s): without this the fleet is online after a fast load and offline
    after a slow one, and the pages measure different fleets (10,000 offline alerts, or none)."""
    now = int(time.time() * 1000)
    with make_engine(url).begin() as conn:
        last_seen = literal(now - ago_ms, BigInteger) - (nodes.c.id - 1) % 7 * 1000
        conn.execute(update(nodes).values(last_seen_ms=last_seen))


def analyze(url: str) -> None:
    """PostgreSQL: ANALYZE after the bulk load, as autovacuum does on a live manager (a bulk load
    can be measured before autovacuum gets to it). SQLite: nothing (it never analyzes by itself)."""
    if url.startswith("postgresql"):
        with make_engine(url).begin() as conn:
            conn.execute(text("ANALYZE"))


def measure_pages(url: str, n_nodes: int, runs: int) -> list[tuple[str, list[float], float | None]]:
    """The pages' server times: the fleet online (as a live fleet is), then every node offline
    for an hour (an outage: 10,000 offline alerts on the first page)."""
    store = Store(make_engine(url))
    seen(url, 0)
    with TestClient(create_app(Settings(db_url=url), store), base_url="http://localhost") as client:
        for path in ("/", "/nodes/node-00042"):
            server_ms(client, path)  # warm
        assert "riskiest first" in client.get("/").text  # the first page is the risk sort
        first = [server_ms(client, "/") for _ in range(runs)]
        sorted_page = [server_ms(client, "/?sort=-oom_kills_24h") for _ in range(runs)]
        by_name = [server_ms(client, "/?sort=name") for _ in range(runs)]
        by_ws = [server_ms(client, "/?sort=-working_set_pct") for _ in range(runs)]
        node = [server_ms(client, f"/nodes/node-{(i * 37) % n_nodes:05d}") for i in range(runs)]
        api = [server_ms(client, "/api/v1/nodes?limit=50") for _ in range(runs)]
        seen(url, HOUR)
        server_ms(client, "/")  # warm
        assert "no report since" in client.get("/").text
        offline = [server_ms(client, "/") for _ in range(runs)]
    return [
        ("first page / (sort: risk)", first, 150),
        ("/?sort=-oom_kills_24h", sorted_page, 150),
        ("/?sort=name", by_name, 150),
        ("/?sort=-working_set_pct", by_ws, 150),
        ("node page /nodes/NAME", node, 100),
        ("API /api/v1/nodes?limit=50", api, None),
        ("first page, all offline", offline, 150),
    ]


def measure(url: str, n_nodes: int, runs: int, label: str) -> None:
    seconds = populate(url, n_nodes)
    if "--no-analyze" not in sys.argv:
        analyze(url)
    lines = measure_pages(url, n_nodes, runs)
    print(
        f"{label}: {n_nodes} nodes, {n_nodes * 839} history rows, {n_nodes // 10 * 3} OOM events, "
        f"{n_nodes // 50 * 3} pressure stops (populated in {seconds:.0f} s)"
    )
    for name, xs, goal in lines:
        med = statistics.median(xs)
        verdict = "" if goal is None else f"   goal < {goal} ms: {'met' if med < goal else 'NOT met'}"
        print(f"  {name:<28} median {med:7.1f} ms, max {max(xs):7.1f} ms{verdict}")


def main() -> None:
    n = int(arg("--nodes", "10000"))
    runs = int(arg("--runs", "20"))
    db = arg("--db", "sqlite")
    if db == "sqlite":
        with tempfile.TemporaryDirectory() as d:
            measure(f"sqlite:///{d}/fleet.db", n, runs, "SQLite")
    else:
        pg = PostgresServer()
        pg.start()
        try:
            measure(pg.create_db("dash"), n, runs, "PostgreSQL")
        finally:
            pg.stop()


if __name__ == "__main__":
    main()
