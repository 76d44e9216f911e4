from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.helpers.fuzz import DEFAULT, FAST, examples

# The machine is shared and noisy: no per-example deadline (speed is for bench/, not tests).
settings.register_profile("oomguard", deadline=None)
settings.register_profile("oomguard-fast", deadline=None, max_examples=examples(DEFAULT))  # make test-fast
settings.load_profile("oomguard-fast" if FAST else "oomguard")

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
pytest_plugins = ["tests.helpers.dashboard", "tests.helpers.fleet"]  # shared fixtures: browser, fleet, big

# Markers for the parts that need more than this checkout and Python (pyproject.toml registers
# them; CONTRIBUTING.md lists them; `make test-fast` deselects all four). Given here, by what a
# test uses, so a new test is marked by the fixture it asks for, not by remembering a decorator.
BROWSER_FIXTURES = frozenset({"browser"})  # headless Chromium (tests/helpers/dashboard.py)
POSTGRES_FIXTURES = frozenset({"pg", "own_pg", "frozen_pg"})  # a real PostgreSQL server (tests/helpers/pg.py)


def _markers(item: pytest.Item) -> list[str]:
    rel = Path(str(item.fspath)).resolve().relative_to(REPO).as_posix()
    found = []
    if rel.startswith("tests/integration/vm/"):
        found.append("vm")
    if rel == "tests/integration/test_runtimes.py":
        found.append("runtimes")
    names = set(getattr(item, "fixturenames", ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    if names & POSTGRES_FIXTURES or "postgresql" in params.values():
        found.append("postgres")
    if names & BROWSER_FIXTURES:
        found.append("browser")
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in _markers(item):
            item.add_marker(name)
            if name == "postgres":
                # Under coverage (make test COV=1, make cov) the PostgreSQL variants run unmeasured (pytest-cov's
                # no_cover): they run the SQLite variants' code but for the dialect branches, and
                # tracing costs much (test_manager_fuzz.py's SQLite half: 41 s bare, 71 s traced).
                item.add_marker("no_cover")


# One more marker is given by hand, ``timing`` (pyproject.toml): a test whose subject is a duration
# (guard latency, connection fairness, writer bounds) and that compares it with a reference it
# measured itself, on the same machine, with a wide factor. `make test` runs those serially (-n 0)
# after the parallel run; every other test waits for events (tests/helpers/wait.py), never a clock.
# The fifth marker, ``slow``, is given by hand to a test that takes over SLOW_S on its own here
# (`make test-fast` leaves those out). Which tests those are drifts as the suite changes: a quick
# run lists at its end the tests that took twice that and that it ran (none of the
# five markers): a list, never a failure (speed is measured by bench/, not asserted by tests).
SLOW_S = 1.5
FAST_LEAVES_OUT = ("vm", "runtimes", "postgres", "browser", "slow")  # the Makefile's test-fast -m
_unmarked_s: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not any(m in report.keywords for m in FAST_LEAVES_OUT):  # setup, call and teardown, summed
        _unmarked_s[report.nodeid] = _unmarked_s.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if LANE in ("worker", "manager"):  # counted here: under xdist the workers collect, not this process
        other = "manager" if WORKER_LANE else "worker"
        tests = Path(__file__).parent
        left = [p for p in tests.rglob("test_*.py") if "vm" not in p.relative_to(tests).parts and _other_side(p)]
        terminalreporter.write_line(f"{LANE} lane: {len(left)} test modules of the {other} side left out")
    if not FAST:  # the full suite's property tests run ten times the examples: their times say nothing here
        return
    over = sorted(((s, n) for n, s in _unmarked_s.items() if s > 2 * SLOW_S), reverse=True)
    if over:
        terminalreporter.section(f"over {2 * SLOW_S:g} s and in make test-fast: mark them slow (pyproject.toml)")
        for seconds, nodeid in over:
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")


def run_oomguard(*args: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``python -m oomguard`` from the checkout, as a user would (*kw*: more of subprocess.run's)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    proc: subprocess.CompletedProcess[str] = subprocess.run(
        [sys.executable, "-m", "oomguard", *args], capture_output=True, text=True, env=full_env, timeout=60, **kw
    )
    return proc


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OOMGUARD_* from the caller's environment leaks into a test."""
    for key in list(os.environ):
        if key.startswith("OOMGUARD_"):
            monkeypatch.delenv(key)


@pytest.fixture(autouse=True, scope="module")
def _release_databases() -> Any:
    """At each test module's end, the connections its tests left open to the shared PostgreSQL
    (``tests.helpers.manager.release_databases``); nothing where no test used it."""
    yield
    helpers = sys.modules.get("tests.helpers.manager")
    if helpers is not None:
        helpers.release_databases()


# The worker side's own lane (`make test-py310`, CONTRIBUTING.md): on its floor, Python 3.10, with
# only what the worker side needs (pytest, hypothesis, jsonschema; no manager extra), a test module
# that imports the manager, its libraries or a helper built on them is not collected, and the run
# says how many. Where the manager's libraries are installed this changes nothing.
# `make test-newest` is the other way round (OOMGUARD_TEST_LANE=manager): only those modules.
LANE = os.environ.get("OOMGUARD_TEST_LANE")
WORKER_LANE = LANE == "worker"
MANAGER_SIDE = re.compile(
    r"^\s*(?:from|import) (?:oomguard\.manager|fastapi|starlette|sqlalchemy|alembic|httpx|schemathesis|"
    r"prometheus_client|playwright|yaml|promql_parser|"
    r"tests\.helpers\.(?:manager|pg|agent_fake|fleet|miniature|dashboard|hostile|wire))\b",
    re.MULTILINE,
)


def _other_side(path: Path) -> bool:
    """True for a test module this lane leaves out: the manager side's in the worker lane, the
    worker side's in the manager lane."""
    if LANE not in ("worker", "manager") or path.suffix != ".py" or not path.name.startswith("test_"):
        return False
    return (MANAGER_SIDE.search(path.read_text(encoding="utf-8")) is not None) == WORKER_LANE


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    return True if _other_side(collection_path) else None


def pytest_report_header(config: pytest.Config) -> str | None:
    return f"{LANE} lane: only the test modules of the {LANE} side are collected" if LANE else None
