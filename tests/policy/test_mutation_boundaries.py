"""Boundaries that mutations of the code once survived (issue 19, item 6), each pinned on both
sides so that flipping the comparison fails a test. ``tools/mutate.py`` applies those mutations
to a copy of ``src/`` and runs this file (CONTRIBUTING.md, "A mutation pass by hand").

- v1 ``hierarchical_memory_limit`` against the limit the walk found (``probes/memcg.py``
  ``read_v1``): below it, it binds; equal, the walk's file is named; above it, the walk's limit
  stays. The "below" layout is also a fixture: ``docker_v1_cgroup_parent_limit_below_container``;
- the guard's stop line (``supervisor/guard.py`` ``GuardState``): a working set at exactly
  ``ceiling - margin`` stops, one byte below does not;
- an explicit budget against the hard ceiling (``policy/budget.py``): equal to the limit is not
  above it (no ``budget-exceeds-limit``), one byte more is;
- the manager's offline rule (``manager/alerts.py`` ``node_status``): a node silent for exactly
  three intervals is online, one millisecond later offline (a real SQLite file).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from oomguard import probe
from oomguard.manager.alerts import MISSED_INTERVALS
from oomguard.probes.counters import MemorySample
from oomguard.sources.root import DirRoot
from oomguard.supervisor.guard_state import PRESSURE, STOP, GuardState
from tests.conftest import FIXTURES
from tests.helpers.manager import Clock, ingest, make_store, migrated_db

MiB = 1024**2
GiB = 1024**3

# -- v1: hierarchical_memory_limit against the walked limit ----------------------------------------

BELOW = "docker_v1_cgroup_parent_limit_below_container"  # walk 4 GiB, hierarchical 2 GiB (/batch)
DOCKER_V1 = "docker_v1_cgroupfs_driver"  # docker run -m 1g: walk 1 GiB, hierarchical 1 GiB
STAT = "sys/fs/cgroup/memory/memory.stat"
LIMIT_FILE = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
HIER_FILE = "/sys/fs/cgroup/memory/memory.stat:hierarchical_memory_limit"


def probe_with_hierarchical(tmp_path: Path, case: str, hier: int | None) -> dict[str, Any]:
    """The memory section of *case*'s tree copied (links followed), with memory.stat's
    ``hierarchical_memory_limit`` set to *hier* (None: as the fixture has it)."""
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / case / "root", root, symlinks=False)
    if hier is not None:
        stat = root / STAT
        lines = stat.read_text().splitlines()
        assert any(line.startswith("hierarchical_memory_limit ") for line in lines)
        stat.write_text(
            "".join(
                f"hierarchical_memory_limit {hier}\n" if line.startswith("hierarchical_memory_limit ") else line + "\n"
                for line in lines
            )
        )
    report: dict[str, Any] = probe(root=DirRoot(str(root)))  # type: ignore[assignment]
    return report["memory"]  # type: ignore[no-any-return]


def test_a_hierarchical_limit_below_the_walk_binds(tmp_path: Path) -> None:
    """The parent /batch (2 GiB) is above the mount root: only memory.stat shows it, and the kernel
    charges every page to it too, so the smaller one is the ceiling."""
    mem = probe_with_hierarchical(tmp_path, BELOW, None)
    assert mem["cgroup"]["levels"][0]["max_bytes"] == 4 * GiB  # what the walk saw
    assert (mem["effective_bytes"], mem["limit_file"]) == (2 * GiB, HIER_FILE)
    assert mem["cgroup"]["limit_bytes"] == 2 * GiB


@pytest.mark.parametrize(
    ("hier", "effective", "limit_file"),
    [
        (1 * GiB - 4096, 1 * GiB - 4096, HIER_FILE),  # one page below the walk: it binds
        (1 * GiB, 1 * GiB, LIMIT_FILE),  # equal: the walk's own file is named
        (1 * GiB + 4096, 1 * GiB, LIMIT_FILE),  # one page above: the walk's limit stays
        (2 * GiB, 1 * GiB, LIMIT_FILE),
    ],
)
def test_the_smaller_of_walk_and_hierarchical_limit_wins_either_way(
    tmp_path: Path, hier: int, effective: int, limit_file: str
) -> None:
    """docker run -m 1g: the walk sees 1 GiB. A hierarchical value above it comes from a memory.stat
    read after the limit was raised (``docker update -m``: the two files are not read at one
    instant); either way the documented rule is the minimum of the two (architecture.md, rule 5)."""
    mem = probe_with_hierarchical(tmp_path, DOCKER_V1, hier)
    assert mem["cgroup"]["levels"][0]["max_bytes"] == 1 * GiB
    assert (mem["effective_bytes"], mem["limit_file"]) == (effective, limit_file)
    assert (mem["cgroup"]["limit_bytes"], mem["cgroup"]["limit_file"]) == (effective, limit_file)


# -- an explicit budget at the hard ceiling: above it warns, equal does not -------------------------


@pytest.mark.parametrize(("budget", "warned"), [(1 * GiB - 1, False), (1 * GiB, False), (1 * GiB + 1, True)])
def test_an_explicit_budget_equal_to_the_limit_is_not_above_it(budget: int, warned: bool) -> None:
    report: dict[str, Any] = probe(root=DirRoot(str(FIXTURES / DOCKER_V1 / "root")), budget=str(budget))  # type: ignore[assignment]
    assert report["memory"]["effective_bytes"] == 1 * GiB and report["budget"]["bytes"] == budget
    exceeds = [w for w in report["warnings"] if w["code"] == "budget-exceeds-limit"]
    assert len(exceeds) == warned
    if warned:
        assert "above the hard ceiling 1 GiB (cgroup-v1)" in exceeds[0]["message"]


# -- the guard's stop line: working set >= ceiling - margin ----------------------------------------

CEILING, MARGIN, BUDGET = 512 * MiB, 64 * MiB, 256 * MiB
STOP_LINE = CEILING - MARGIN  # 448 MiB


def guard_state() -> GuardState:
    return GuardState(BUDGET, CEILING, MARGIN, set_high=False, stall_limit=10)


def ws(working_set: int) -> MemorySample:
    return MemorySample(usage=working_set, inactive_file=0, events={}, stall_us=None)


def test_the_stop_line_is_ceiling_minus_margin() -> None:
    assert guard_state().stop_line == STOP_LINE == 469762048


@pytest.mark.parametrize(
    ("working_set", "stops"),
    [(STOP_LINE - 1, False), (STOP_LINE, True), (STOP_LINE + 1, True)],
)
def test_the_stop_line_itself_stops_one_byte_below_does_not(working_set: int, stops: bool) -> None:
    w = guard_state()
    actions = w.step(ws(working_set))
    assert actions == ([PRESSURE, STOP] if stops else [PRESSURE])  # above the budget either way
    if stops:
        assert (w.stop_why or "").endswith("reached the stop line 448 MiB (512 MiB limit - 64 MiB guard margin)")
    else:
        assert w.stop_why is None


def test_one_byte_below_the_line_then_at_it() -> None:
    """The same run: just below, no stop; the next sample exactly at the line, the stop (once)."""
    w = guard_state()
    assert w.step(ws(STOP_LINE - 1)) == [PRESSURE]
    assert w.step(ws(STOP_LINE)) == [STOP]
    assert w.step(ws(STOP_LINE + 1)) == []  # stopped once


# -- the manager: offline after three missed intervals, not at them --------------------------------

T0 = 1_800_000_000_000
INTERVAL_MS = 30_000


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return migrated_db("sqlite", tmp_path, "m_")


@pytest.mark.parametrize("announced", [True, False], ids=["its-own-interval", "the-default-interval"])
def test_offline_one_millisecond_after_three_missed_intervals(sqlite_url: str, announced: bool) -> None:
    """Silent for exactly three intervals: online (the rule is ``silent > 3 * interval``); one
    millisecond later: offline, in the list, the status filter, the cards and the alerts."""
    clock = Clock(T0)
    store = make_store(sqlite_url, clock, default_interval_s=INTERVAL_MS / 1000)
    if announced:
        ingest(store, "edge", interval_s=INTERVAL_MS / 1000)
    else:
        ingest(store, "edge")  # no interval in the envelope: the manager's default
    boundary = T0 + MISSED_INTERVALS * INTERVAL_MS
    assert MISSED_INTERVALS * INTERVAL_MS == 90_000

    def seen() -> tuple[str, list[str], int, list[str]]:
        [node] = store.list_nodes()["nodes"]
        offline = [n["name"] for n in store.list_nodes(status="offline")["nodes"]]
        return node["status"], offline, store.summary()["offline"], [a["kind"] for a in store.alerts()]

    clock.t = boundary - 1
    assert seen() == ("online", [], 0, [])
    clock.t = boundary
    assert seen() == ("online", [], 0, [])
    clock.t = boundary + 1
    assert seen() == ("offline", ["edge"], 1, ["offline"])
