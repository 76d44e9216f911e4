"""The fleets the dashboard tests look at, and what each node was sent (issue 14).

A pytest plugin (``tests/conftest.py`` lists it in ``pytest_plugins``): the module-scoped
``fleet`` (20 nodes of 8 GPUs through the API, and one known only from a supervisor's events) and
``big`` (10,000 nodes written straight into the database) are shared by name, never imported.
Every number a test checks is computed from the data posted, with the functions here
(``working_set``/``pct_text``, ``big_working_set``/``big_exits``), not read back from the manager."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.dashboard import api
from tests.helpers.manager import ManagerProcess, fixture_report, write_latest

GiB = 1 << 30
WIDE = {"viewport": {"width": 1280, "height": 900}}
PHONE = {"viewport": {"width": 390, "height": 844}}


def eight_gpus() -> list[dict[str, Any]]:
    return [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GiB, "memory_free_bytes": 79 * GiB}
        for i in range(8)
    ]


MiB = 1 << 20
LIMIT = 512 * MiB  # the fixture's cgroup limit, every node's effective limit
NO_WORKING_SET = 11  # node-11 reports no working set: "unknown", never 0%


def working_set(i: int) -> int | None:
    """node-i's working set: 40 MiB + 23 MiB a node; node-02 above its limit (600 MiB)."""
    return None if i == NO_WORKING_SET else 600 * MiB if i == 2 else (40 + 23 * i) * MiB


def pct_text(i: int) -> str:
    ws = working_set(i)
    return "unknown" if ws is None else f"{ws * 100 / LIMIT:.1f}%"


# The twenty report with a one-hour interval: online for three hours, so a module's tests see them
# online however slowly a loaded host runs them (at the default 30 s, 90 s later they went offline).
FLEET_INTERVAL_S = 3600


def seed_twenty(s: ManagerProcess) -> None:
    """20 nodes of 8 GPUs: node-00 fits 0 jobs, node-01's budget is above its limit, node-02 uses
    more than its limit, node-03..09 sized from the host (one alert kind with 7 nodes), OOM kills
    (node-05: 2, each also followed by a restart event that repeats the reason), pressure stops
    (node-05: 1, node-12: 2); every node's usage and working set as ``working_set`` says."""
    for i in range(20):
        report = fixture_report("docker_v2_private_ns_limit_512m", **({"budget": "500GiB"} if 1 <= i <= 9 else {}))
        report["gpus"] = eight_gpus()
        report["plan"] = {"concurrency": 0 if i == 0 else 4}
        ws = working_set(i)
        report["memory"].update(working_set_bytes=ws, usage_bytes=None if ws is None else ws + 30 * MiB)
        if i == 5:  # RLIMIT_MEMLOCK unlimited
            report["memlock"].update(soft_bytes=None, hard_bytes=None)
        if i == 2:
            report["warnings"].append({"code": "usage-above-limit", "message": "usage is above the limit"})
        envelope = {"node": f"node-{i:02d}", "id": uuid.uuid4().hex, "report": report, "interval_s": FLEET_INTERVAL_S}
        api(s, "/api/v1/reports", envelope)
    for _ in range(2):
        for event in (
            {"event": "exit", "reason": "oom-kill", "signal": 9},
            {"event": "restart", "reason": "oom-kill", "delay_s": 1.0},  # the same kill: not counted again
        ):
            api(s, "/api/v1/events", {"node": "node-05", "id": uuid.uuid4().hex, "event": event})
    for node, n in (("node-05", 1), ("node-12", 2)):
        for _ in range(n):
            event = {
                "event": "exit",
                "reason": "pressure-stop",
                "exit_code": 0,
                "working_set_peak_bytes": 461 * MiB,
                "guard_margin_bytes": 64 * MiB,
            }
            api(s, "/api/v1/events", {"node": node, "id": uuid.uuid4().hex, "event": event})


RUN_ONLY = "runner-01"  # known only from run --manager events: no agent


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    """The 20 nodes, and one more known only from a supervisor's events (run-only)."""
    s = ManagerProcess(f"sqlite:///{tmp_path_factory.mktemp('fleet') / 'fleet.db'}").start()
    seed_twenty(s)
    api(s, "/api/v1/events", {"node": RUN_ONLY, "id": uuid.uuid4().hex, "event": {"event": "start", "concurrency": 2}})
    yield s
    s.stop()


BIG = 10_000
BIG_RUN_ONLY = 3  # runner-0..2: no agent, a supervisor's recent event


def big_working_set(i: int) -> int | None:
    """Distinct ratios (7919 is prime to 10,000: a permutation of 0..9999 hundredths of a
    percent); every 13th node reports none."""
    return None if i % 13 == 0 else LIMIT_BIG * (i * 7919 % 10_000) // 10_000


def big_exits(i: int) -> tuple[int, int]:
    """(OOM kills, pressure stops) of node i in the last day."""
    return (3 if i == 4321 else 1 if i % 1000 == 7 else 0, 2 if i % 500 == 250 else 0)


LIMIT_BIG = 342 * GiB


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    """10,000 nodes written straight into the database (the API would take minutes)."""
    from sqlalchemy import insert, select

    from oomguard.manager.db import events, make_engine, migrate, nodes

    url = f"sqlite:///{tmp_path_factory.mktemp('big') / 'fleet.db'}"
    migrate(url)
    now = int(time.time() * 1000)
    gpu_json = json.dumps(eight_gpus())
    latest = json.dumps(fixture_report())
    row = {"effective_bytes": LIMIT_BIG, "host_total_bytes": 503 * GiB, "limited_by": "cgroup-v2", "runtime": "docker"}

    def node_row(i: int) -> dict[str, Any]:
        ws = big_working_set(i)
        return {
            **row,
            "name": f"node-{i:05d}",
            "first_seen_ms": now,
            "last_seen_ms": now - (0 if i % 100 else 3_600_000),
            "budget_bytes": (332 if i % 50 else 500) * GiB,
            "memlock_soft_bytes": 8 << 20,
            "warnings": "[]",
            "gpus": gpu_json,
            "concurrency": 0 if i % 97 == 0 else 18,
            "working_set_bytes": ws,
            "usage_bytes": None if ws is None else ws + GiB,
        }

    with make_engine(url).begin() as conn:
        conn.execute(insert(nodes), [node_row(i) for i in range(BIG)])
        runners = [{"name": f"runner-{i}", "first_seen_ms": now, "last_seen_ms": now} for i in range(BIG_RUN_ONLY)]
        conn.execute(insert(nodes), runners)
        ids = dict(conn.execute(select(nodes.c.name, nodes.c.id)).all())
        write_latest(conn, (ids[f"node-{i:05d}"] for i in range(BIG)), now, latest)
        conn.execute(
            insert(events),
            [
                {
                    "node_id": ids[f"node-{i:05d}"],
                    "ingest_id": f"e-{i}-{reason}-{k}",
                    "received_ms": now - (k + 1) * 600_000,
                    "kind": "exit",
                    "reason": reason,
                    "body": json.dumps({"event": "exit", "reason": reason}),
                }
                for i in range(BIG)
                for reason, n in zip(("oom-kill", "pressure-stop"), big_exits(i), strict=True)
                for k in range(n)
            ],
        )
    s = ManagerProcess(url).start()
    yield s
    s.stop()
