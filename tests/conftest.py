from __future__ import annotations

import os
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
POSTGRES_FIXTURES = frozenset({"pg", "own_pg", "frozen_pg"})  # a real PostgreSQL server (tests/pg.py)


def _markers(item: pytest.Item) -> list[str]:
    rel = Path(str(item.fspath)).resolve().relative_to(REPO).as_posix()
    found = []
    if rel.startswith("tests/vm/"):
        found.append("vm")
    if rel == "tests/test_runtimes.py":
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
