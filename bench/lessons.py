"""The fleet's lessons at the caps (issue 37, item 2): /metrics and a profile's page with the
manager's default caps filled (``--max-profiles`` 200, ``--max-classes`` 100), in process on a
real SQLite file.

The fleet: 200 profiles; each has ``--samples`` observations (2,000: the recommender's
``MAX_SAMPLES``) in the window, spread over 100 classes of node and ``--nodes`` nodes (1,000), 5 %
of them OOM kills (confirmed, with their exit events); 400,000 observations in all. Measured:

- ``/metrics``, its first scrape (cold: every shown pair computed: ``CLASSES_SHOWN``, 500 pairs), then
  ``--requests`` scrapes in a row (kept: ``store/kept.py``), then a scrape after one new
  observation (its profile computed again, the others kept);
- a profile's page (2,000 samples in 100 classes), ``--requests`` times.

Each request's wall time (``time.perf_counter``); p50 and p99 (nearest rank). ``--no-kept``
measures the same without the kept answers and the fleet scope's memo (the code before issue 37's
item 2: every scrape and page computes every answer anew).

Usage: python bench/lessons.py [--profiles 200] [--classes 100] [--samples 2000] [--nodes 1000]
                               [--requests 20] [--no-kept]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlalchemy import insert, select  # noqa: E402
from tests.helpers.manager import AGENT_H, VIEWER, VIEWER_H, Clock, local_client, make_store  # noqa: E402

from oomguard.manager import learning  # noqa: E402
from oomguard.manager.app import create_app  # noqa: E402
from oomguard.manager.db import make_engine, migrate, nodes, observations  # noqa: E402
from oomguard.manager.settings import Settings  # noqa: E402

GiB = 1 << 30
NOW = 1_800_000_000_000


def fill(url: str, n_profiles: int, n_classes: int, per_profile: int, n_nodes: int) -> None:
    """The fleet above, written straight into the tables (the API's quotas would take hours)."""
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(
            insert(nodes), [{"name": f"n{i:05d}", "first_seen_ms": NOW, "last_seen_ms": NOW} for i in range(n_nodes)]
        )
        ids = {str(name): int(i) for i, name in conn.execute(select(nodes.c.id, nodes.c.name))}
        rows = []
        for p in range(n_profiles):
            for k in range(per_profile):
                node = (p * 7 + k) % n_nodes
                failed = k % 20 == 0
                rows.append(
                    {
                        "node_id": ids[f"n{node:05d}"],
                        "ingest_id": uuid.uuid4().hex,
                        "received_ms": NOW - k * 300_000,  # one every 5 minutes: 7 days
                        "observed": "2027-01-15T08:00:00Z",
                        "profile": f"profile-{p:03d}",
                        "node_class": f"class-{node % n_classes:03d}",
                        "declared_per_job_bytes": 14 * GiB,
                        "peak_per_job_bytes": int((8 + (k * 37 % 40) / 10) * GiB),
                        "declared_baseline_bytes": 40 * GiB,
                        "peak_baseline_bytes": 30 * GiB,
                        "concurrency": 4,
                        "outcome": "oom-kill" if failed else "ok",
                        "confirmed": True,
                    }
                )
            if len(rows) >= 50_000:
                conn.execute(insert(observations), rows)
                rows = []
        if rows:
            conn.execute(insert(observations), rows)
    engine.dispose()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", type=int, default=200)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--samples", type=int, default=learning.MAX_SAMPLES)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--no-kept", action="store_true", help="every answer computed anew, as before issue 37")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/lessons.db"
        migrate(url)
        t0 = time.perf_counter()
        fill(url, args.profiles, args.classes, args.samples, args.nodes)
        print(f"filled {args.profiles * args.samples} observations in {time.perf_counter() - t0:.1f} s")
        store = make_store(url, Clock(NOW))
        if args.no_kept:
            before = learning.recommend

            def plain(*a: Any, **kw: Any) -> Any:
                kw.pop("memo", None)
                return before(*a, **kw)

            learning.recommend = plain
            store.lessons = None  # type: ignore[assignment]
        settings = Settings(db_url=url, agent_token="agent-secret-token", viewer_token=VIEWER, request_timeout_s=600)
        with local_client(create_app(settings, store)) as c:
            cold, r = timed(lambda: c.get("/metrics", headers=VIEWER_H))
            assert r.status_code == 200 and "oomguard_manager_recommendations_up 1.0" in r.text, r.text[-500:]
            warm = [timed(lambda: c.get("/metrics", headers=VIEWER_H))[0] for _ in range(args.requests)]
            body = {
                "node": "n00001",
                "id": uuid.uuid4().hex,
                "observation": {
                    "profile": "profile-000",
                    "node_class": "class-001",  # its own: n00001 has no report nor label yet
                    "declared_per_job_bytes": 14 * GiB,
                    "peak_per_job_bytes": 9 * GiB,
                    "declared_baseline_bytes": 40 * GiB,
                    "concurrency": 4,
                    "outcome": "ok",
                    "time": "2027-01-15T09:00:00Z",
                },
            }
            assert c.post("/api/v1/observations", json=body, headers=AGENT_H).status_code == 200
            after, _ = timed(lambda: c.get("/metrics", headers=VIEWER_H))
            page = []
            for _ in range(args.requests):
                ms, r = timed(lambda: c.get("/profiles/profile-000", headers=VIEWER_H))
                assert r.status_code == 200, r.status_code
                page.append(ms)
        mode = "without kept answers" if args.no_kept else "kept"
        print(
            f"/metrics ({mode}): cold {cold:.0f} ms; warm p50 {pct(warm, 0.5):.0f} ms, p99 {pct(warm, 0.99):.0f} ms "
            f"({args.requests}); after one new observation {after:.0f} ms"
        )
        print(
            f"profile page (2,000 samples, {args.classes} classes): p50 {pct(page, 0.5):.0f} ms, "
            f"p99 {pct(page, 0.99):.0f} ms ({args.requests})"
        )


if __name__ == "__main__":
    main()
