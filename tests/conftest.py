from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# The machine is shared and noisy: no per-example deadline (speed is for bench/, not tests).
settings.register_profile("oomguard", deadline=None)
settings.load_profile("oomguard")

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"


def run_oomguard(*args: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run ``python -m oomguard`` from the checkout, as a user would."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "oomguard", *args], capture_output=True, text=True, env=full_env, timeout=60, **kw
    )  # type: ignore[call-overload,no-any-return]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OOMGUARD_* from the caller's environment leaks into a test."""
    for key in list(os.environ):
        if key.startswith("OOMGUARD_"):
            monkeypatch.delenv(key)
