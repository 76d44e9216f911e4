"""pytest plugin for the guest run: each test's outcome and message, as JSON, for the host.

Written to the file named by VMTEST_RESULTS (in the share the host reads back); without
that variable it does nothing (the host's collection run loads it too).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

RESULTS: dict[str, dict[str, Any]] = {}
RANK = {"passed": 0, "xpassed": 1, "skipped": 2, "xfailed": 3, "failed": 4, "error": 5}


def _outcome(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed" if report.passed else "failed"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    return report.outcome


def _message(report: pytest.TestReport, outcome: str) -> str:
    if outcome in ("xfailed", "xpassed"):
        return str(getattr(report, "wasxfail", ""))
    if outcome == "skipped" and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    return report.longreprtext if outcome in ("failed", "error") else ""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    outcome = _outcome(report)
    if report.when != "call" and outcome == "passed":
        return
    entry = RESULTS.setdefault(report.nodeid, {"outcome": "passed", "message": "", "duration_s": 0.0})
    entry["duration_s"] += report.duration
    if RANK[outcome] > RANK[entry["outcome"]]:
        entry["outcome"], entry["message"] = outcome, _message(report, outcome)
    if report.capstderr and outcome in ("failed", "error"):
        entry["message"] += "\n--- captured stderr ---\n" + report.capstderr[-4000:]
    _write(None)  # after every test: a guest killed by its timeout still leaves what it did


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        RESULTS[report.nodeid or "<collection>"] = {
            "outcome": "error",
            "message": report.longreprtext,
            "duration_s": 0.0,
        }


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _write(int(exitstatus))


def _write(exitstatus: int | None) -> None:
    path = os.environ.get("VMTEST_RESULTS")
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump({"exitstatus": exitstatus, "tests": RESULTS}, f, indent=1)
        os.replace(path + ".tmp", path)
