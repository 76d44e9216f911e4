"""Where things are in the checkout, for tests at any depth under tests/ (and bench/, tools/)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
FIXTURES = TESTS / "fixtures"
FAKES = TESTS / "fakes"
SRC = REPO / "src"
