"""The overview's alert groups (``Store.alert_groups``: counts per kind in SQL, the first few of each
worded in Python) against the full alert list (``Store.alerts``), on a real SQLite file and a real
PostgreSQL, for fleets built around the boundaries where SQL and Python could disagree:

- the host's ballpark (``eff < 0.8 * host``, ``budget >= 0.5 * host``): integers near the products,
  and near 2**53 and 2**63 where a double's spacing is 2 to 2,048 bytes;
- the memlock code in the warning list, in other cases and as part of longer codes (SQLite's LIKE
  ignores ASCII case: https://sqlite.org/lang_expr.html#like);
- the working-set line (``ws >= line * eff``, or ``ws > budget``): working sets near the product
  and the budget, for two lines, with the report just current and just not;
- NULL host, budget or limit; offline, run-only, refused and archived nodes; OOM kills and pressure
  stops just inside and on the one-hour line;
- a consumer's own budget (``consumer_budget_bytes``) one byte either side of the limit, at it, and
  NULL, with and without the kept ``consumers`` list its message names.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from oomguard.manager import alerts
from oomguard.manager.alerts import HOUR_MS, KINDS
from oomguard.manager.app import create_app
from oomguard.manager.db import events, make_engine, node_labels, nodes
from oomguard.manager.settings import Settings
from oomguard.manager.store import Store
from oomguard.manager.store.queries import SORT_KEYS
from oomguard.manager.web.formatting import ALERTS_PAGE
from tests.helpers.manager import AGENT, VIEWER, VIEWER_H, local_client, migrated_db

NOW = 1_800_000_000_000
BIG = 2**63 - 1
INTERVAL = 30_000


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "g_")


def near(x: float) -> set[int]:
    """Byte counts around *x*: a few integers either side, and a few doubles' spacings either side."""
    step = math.ulp(x) if x else 1.0
    out = {int(x) + d for d in range(-2, 3)} | {int(x + k * step) for k in (-2, -1, 1, 2)}
    out |= {int(x + step / 2), int(x - step / 2)}
    return {v for v in out if 0 <= v <= BIG}


HOSTS = [0, 1, 5, 10, 503 << 30, 2**53 - 1, 2**53 + 1, 2**60 + 3, 5 * 2**60 + 7, BIG]


def budget_rows() -> list[tuple[int | None, int | None, int | None]]:
    """(effective, host, budget) around both ballpark lines, and with NULLs."""
    rows: list[tuple[int | None, int | None, int | None]] = []
    for host in HOSTS:
        for eff in near(0.8 * host) | {host * 4 // 5}:  # the limit around 80 % of the host, budget above
            rows += [(eff, host, min(BIG, max(eff + 1, host))), (eff, host, min(BIG, eff + 1))]
        for budget in near(0.5 * host) | {host // 2}:  # the budget around 50 % of the host, the limit below
            rows += [(max(0, budget - 1), host, budget), (budget // 2, host, budget)]
    rows += [(100, None, 200), (None, 100, 200), (100, 200, None), (100, 200, 100), (None, None, None)]
    return rows


WARNINGS = [
    "[]",
    '["memlock-too-low"]',
    '["MEMLOCK-TOO-LOW"]',
    '["Memlock-too-low"]',
    '["x-memlock-too-low"]',
    '["memlock-too-low-x"]',
    '["cgroup-unreadable", "memlock-too-low"]',
]


LINES = (0.9, 0.75)


def working_sets(eff: int | None, budget: int | None) -> list[int | None]:
    """Working sets around each line of *eff* and around *budget*, and none."""
    out: set[int] = {0}
    for line in LINES:
        if eff:
            out |= near(line * eff)
    if budget is not None:
        out |= {v for v in (budget - 1, budget, budget + 1) if 0 <= v <= BIG}
    return [None, *sorted(out)]


def consumer_columns(eff: int | None, rnd: random.Random) -> dict[str, Any]:
    """A consumer's budget around *eff* (or none), with its kept list or without (the message's fallback)."""
    budgets = [None] if eff is None else [None, max(0, eff - 1), eff, min(BIG, eff + 1), BIG]
    budget = rnd.choice(budgets)
    listed = [{"name": "cuzk", "budget_bytes": budget, "used_bytes": None, "available_bytes": None}]
    return {"consumer_budget_bytes": budget, "consumers": rnd.choice([None, json.dumps(listed)])}


def build_fleet(url: str, seed: int) -> None:
    """Nodes with the budget rows above, random statuses, warnings, working sets, refusals and
    recent exits (by *seed*)."""
    rnd = random.Random(seed)
    more = random.Random(-seed)  # the runtimes and labels: drawn apart, the rest stays as it was
    consumer = random.Random(seed + 1000)  # the consumers' budgets: apart too
    sup = random.Random(seed + 2000)  # the supervisors' states and the kernel counters' kills (issue 38): apart too
    node_rows, event_rows, label_rows = [], [], []
    for i, (eff, host, budget) in enumerate(budget_rows()):
        name = rnd.choice(["n", "N", "a", "Z", "m_", "m-", "m.", "0"]) + f"{i:04d}-{rnd.randrange(10**6)}"
        reported = rnd.random() > 0.1
        refused = rnd.random() < 0.05
        node_rows.append(
            {
                "id": i + 1,
                "name": name,
                "first_seen_ms": NOW - 10 * HOUR_MS,
                "last_seen_ms": NOW - rnd.choice([0, 3 * INTERVAL, 3 * INTERVAL + 1, HOUR_MS]),
                "interval_ms": INTERVAL,
                "effective_bytes": eff,
                "host_total_bytes": host,
                "budget_bytes": budget,
                "warnings": rnd.choice(WARNINGS) if reported else None,
                "archived_ms": NOW - HOUR_MS if rnd.random() < 0.05 else None,
                "working_set_bytes": rnd.choice(working_sets(eff, budget)),
                "ws_high_since_ms": rnd.choice([None, NOW - HOUR_MS]),
                "last_event_ms": rnd.choice([None, NOW, NOW - 10 * HOUR_MS]),
                "refused_ms": NOW - 5 * INTERVAL if refused else None,
                "refused_step": "plan" if refused else None,
                "refused_exit_code": 3 if refused else None,
                "refused_message": "plan: 0 jobs of 24 GiB fit the 16 GiB budget" if refused else None,
                "runtime": more.choice([None, "docker", "kubernetes", "podman"]),
                **consumer_columns(eff, consumer),
                "supervisor_state": sup.choice(
                    [None, None, "running", "restarting", "starting", "exited", "gave-up", "stopped"]
                ),
                "heartbeat_interval_ms": sup.choice([None, 10_000, 3_600_000]),
                "kernel_oom_kills_total": sup.choice([0, 0, 1, 7]),
            }
        )
        if sup.random() < 0.3:  # a rise of the kernel's counter, within the hour or not
            event_rows.append(
                {
                    "node_id": i + 1,
                    "ingest_id": f"k-{i}",
                    "received_ms": NOW - sup.choice([0, HOUR_MS - 1, HOUR_MS, 2 * HOUR_MS]),
                    "kind": "kernel-oom",
                    "reason": "oom-kill",
                    "kills": sup.choice([1, 3]),
                    "body": json.dumps({"event": "kernel-oom", "kills": 1}),
                }
            )
        if more.random() < 0.6:
            label_rows.append({"node_id": i + 1, "key": "pool", "value": more.choice(["a", "b"])})
        for k in range(rnd.choice([0, 0, 1, 2])):
            reason = rnd.choice(["oom-kill", "pressure-stop"])
            event_rows.append(
                {
                    "node_id": i + 1,
                    "ingest_id": f"e-{i}-{k}",
                    "received_ms": NOW - rnd.choice([0, HOUR_MS - 1, HOUR_MS, 2 * HOUR_MS]),
                    "kind": rnd.choice(["exit", "exit", "exit", "restart"]),
                    "reason": reason,
                    "kills": None,
                    "body": json.dumps({"event": "exit", "reason": reason}),
                }
            )
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(insert(nodes), node_rows)
        if event_rows:
            conn.execute(insert(events), event_rows)
        conn.execute(insert(node_labels), label_rows)
    engine.dispose()


def reference(alerts: list[dict[str, Any]], shown: int, show_all: str, start: int, page: int) -> dict[str, Any]:
    """The overview's groups as the dashboard built them from the full list before
    ``alert_groups`` (formatting.group_alerts), the kind *show_all* paged."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for a in alerts:
        by_kind.setdefault(a["kind"], []).append(a)
    groups: list[dict[str, Any]] = [
        {
            "kind": kind,
            "severity": "critical" if any(a["severity"] == "critical" for a in items) else "warning",
            "count": len(items),
            "start": start if kind == show_all else 0,
            "alerts": items[start : start + page] if kind == show_all else items[:shown],
        }
        for kind, items in by_kind.items()
    ]
    groups.sort(key=lambda g: (g["severity"] != "critical", -g["count"], g["kind"]))
    return {"total": len(alerts), "groups": groups}


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "line"), [(1, LINES[0]), (2, LINES[1])])
def test_groups_and_alerts_column_agree_with_the_full_list(db_url: str, seed: int, line: float) -> None:
    build_fleet(db_url, seed)
    store = Store(make_engine(db_url), clock=lambda: NOW, default_interval_s=INTERVAL / 1000, working_set_line=line)
    full = store.alerts()
    kinds = Counter(a["kind"] for a in full)
    assert set(kinds) == set(KINDS), kinds  # the fleet reaches every kind ...
    assert all(n > 5 for n in kinds.values()), kinds  # ... each more than a group lists
    for shown, show_all, start, page in [(5, "", 0, 500), (3, "offline", 0, 7), (5, "offline", 20, 7)]:
        assert store.alert_groups(shown, show_all, start, page) == reference(full, shown, show_all, start, page)
    # the overview counts the cards, the kinds and the pager's total in one pass: the same numbers
    cards = store.summary()
    assert sum(cards[s] for s in ("online", "offline", "run_only", "refused", "archived")) > 0
    shown_query = {"shown": 3, "show_all": "offline", "start": 0, "page": 7}
    filters = ((None, None), ("1", None), (None, ("pool", "a")), ("2", ("pool", "b")), (None, ("pool", "c")))
    for status in (None, "online", "offline", "run-only", "refused", "archived", "bogus"):
        for (q, label), sort in itertools.product(filters, ("risk", "-risk", "name", "-oom_kills_24h")):
            query: dict[str, Any] = {"status": status, "q": q, "limit": 7, "offset": 3, "sort": sort, "label": label}
            view = store.overview(query, shown_query)
            assert view["summary"] == cards and view["kept"] is None
            assert view["alerts"] == reference(full, 3, "offline", 0, 7)
            alone = store.list_nodes(**query)
            assert view["listing"] == alone, (status, q, label, sort)
            assert status in ("bogus", "run-only") or q or label or alone["total"] > 0, status  # each status is there
    for sort in SORT_KEYS:  # every sort, both ways, from the overview's pass as from the list's
        for key in (sort, f"-{sort}"):
            query = {"status": None, "q": None, "limit": 9, "offset": 4, "sort": key, "label": None}
            assert store.overview(query, shown_query)["listing"] == store.list_nodes(**query), key
    for kind in KINDS:  # every kind, paged to its end and past it
        for start in (0, kinds[kind] - 2, kinds[kind] + 3):
            got = store.alert_groups(5, kind, max(0, start), 4)
            assert got == reference(full, 5, kind, max(0, start), 4), (kind, start)
    per_node = Counter(a["node"] for a in full)
    listed = store.list_nodes(limit=10_000)["nodes"]
    assert {n["name"]: n["alerts"] for n in listed if n["alerts"]} == dict(per_node)
    # the node page's alerts: the same words, on the first nodes of each kind and some with none
    # (a node page builds its query in Python: every node would be most of this test's time)
    sample = {a["node"] for kind in KINDS for a in [a for a in full if a["kind"] == kind][:4]}
    sample |= {n["name"] for n in [n for n in listed if not n["alerts"]][:8]}
    assert len(sample) > len(KINDS), sample
    for n in (n for n in listed if n["name"] in sample):
        detail = store.node_detail(n["name"], events_limit=1)
        assert detail is not None and detail["open_alerts"] == [a for a in full if a["node"] == n["name"]]
    # the Python side of the line, on every working set the SQL side saw
    high = {a["node"] for a in full if a["kind"] == "working-set-high"}
    assert high and all(n["current"] for n in listed if n["name"] in high)


def test_ballpark_in_floating_point_both_sides(db_url: str) -> None:
    """Above 2**53 a limit one byte under 80 % of the host rounds to it: not below it, in Python as
    in SQL (before, Python compared the exact integer and called it sized from the host)."""
    host = 2**60 + 3
    line = 0.8 * host
    eff = int(line) - 1
    assert eff < line and not float(eff) < line  # the integer is below; its double is not
    engine = make_engine(db_url)
    with engine.begin() as conn:
        base = {"first_seen_ms": NOW, "last_seen_ms": NOW, "interval_ms": INTERVAL, "warnings": "[]"}
        conn.execute(
            insert(nodes),
            [
                {**base, "name": "edge", "effective_bytes": eff, "host_total_bytes": host, "budget_bytes": host},
                {**base, "name": "under", "effective_bytes": 10, "host_total_bytes": 20, "budget_bytes": 15},
            ],
        )
    store = Store(engine, clock=lambda: NOW)
    assert [(a["node"], a["kind"]) for a in store.alerts()] == [
        ("edge", "budget-above-limit"),
        ("under", "budget-from-host"),
    ]
    assert [(g["kind"], g["count"]) for g in store.alert_groups(5)["groups"]] == [
        ("budget-above-limit", 1),
        ("budget-from-host", 1),
    ]


def test_show_all_is_paged_on_the_dashboard(db_url: str) -> None:
    """``?alerts=KIND`` lists ``ALERTS_PAGE`` alerts of the kind at a time, with links either way."""
    n = 2 * ALERTS_PAGE + 30
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            insert(nodes),
            [
                {
                    "name": f"node-{i:05d}",
                    "first_seen_ms": NOW - HOUR_MS,
                    "last_seen_ms": NOW - HOUR_MS,
                    "warnings": "[]",
                }
                for i in range(n)
            ],
        )
    settings = Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER)
    with local_client(create_app(settings, Store(engine, clock=lambda: NOW))) as c:

        def listed(path: str) -> tuple[list[str], str]:
            page = c.get(path, headers=VIEWER_H)
            assert page.status_code == 200
            alerts = page.text.split('id="alerts"')[1].split("</section>")[0]
            return re.findall(r'<div class="alert warning"><a href="/nodes/([^"]+)"', alerts), alerts

        shown, html = listed("/")
        assert shown == [f"node-{i:05d}" for i in range(5)] and f"show all {n}" in html
        assert f'<span class="big">{n}</span><span>open alerts</span>' in c.get("/", headers=VIEWER_H).text
        shown, html = listed("/?alerts=offline")
        assert shown == [f"node-{i:05d}" for i in range(ALERTS_PAGE)]
        assert f"1-{ALERTS_PAGE} of {n}" in html and f"alerts_offset={ALERTS_PAGE}#alerts" in html
        assert "previous" not in html
        shown, html = listed(f"/?alerts=offline&alerts_offset={2 * ALERTS_PAGE}")
        assert shown == [f"node-{i:05d}" for i in range(2 * ALERTS_PAGE, n)]
        assert f"alerts_offset={ALERTS_PAGE}#alerts" in html and "previous" in html and "next" not in html
        shown, html = listed("/?alerts=offline&alerts_offset=99999")  # past the end: said, and a way back
        assert shown == [] and f"none past {n}" in html and f"alerts_offset={n - ALERTS_PAGE}#alerts" in html
        shown, html = listed("/?alerts=offline&alerts_offset=junk")  # a bad offset is the first page
        assert len(shown) == ALERTS_PAGE and shown[0] == "node-00000"


def test_a_new_alert_kind_is_one_entry(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One ``AlertKind`` added to ``ALERTS`` (its SQL beside its Python) reaches the full list, the
    overview's groups and the list's ``alerts`` column, with nothing else written for it."""
    planted = alerts.AlertKind(
        "budget-over-100",
        "warning",
        lambda seen: nodes.c.budget_bytes > 100,
        lambda r: f"budget {r['budget_bytes']}" if (r["budget_bytes"] or 0) > 100 else None,
    )
    monkeypatch.setattr(alerts, "ALERTS", (*alerts.ALERTS, planted))
    engine = make_engine(db_url)
    with engine.begin() as conn:
        base = {"first_seen_ms": NOW, "last_seen_ms": NOW, "interval_ms": INTERVAL, "warnings": "[]"}
        conn.execute(
            insert(nodes),
            [
                {**base, "name": "big", "effective_bytes": 1000, "budget_bytes": 500},
                {**base, "name": "small", "effective_bytes": 1000, "budget_bytes": 50},
            ],
        )
    store = Store(engine, clock=lambda: NOW)
    big = {"node": "big", "kind": "budget-over-100", "severity": "warning", "message": "budget 500", "since": None}
    assert store.alerts() == [big]
    groups = store.alert_groups(5)
    assert groups["total"] == 1 and [(g["kind"], g["severity"], g["count"]) for g in groups["groups"]] == [
        ("budget-over-100", "warning", 1)
    ]
    assert {n["name"]: n["alerts"] for n in store.list_nodes()["nodes"]} == {"big": 1, "small": 0}
