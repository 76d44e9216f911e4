"""The manager's logs as JSON, one object a line (issue 39, item 5: ``--log-format json``,
``OOMGUARD_LOG_FORMAT``): every line a log shipper reads parses, carries its fields, and masks
secrets as the text lines do."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import httpx
import pytest

from oomguard.manager.logs import JsonFormatter, sayer
from oomguard.manager.redact import Redactor
from tests.helpers.manager import AGENT, VIEWER, ManagerProcess, migrated_db
from tests.helpers.wait import wait_until


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("oomguard.manager.auth", logging.WARNING, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def test_a_record_is_one_json_object_with_its_fields_and_no_secret() -> None:
    form = JsonFormatter(Redactor(["hunter2-secret-token"]))
    record = _record(
        "refused %s token from %s",
        "viewer",
        "10.0.0.7",
        role="viewer",
        client="10.0.0.7",
        node=None,
        reason="hunter2-secret-token was wrong",
        count=3,
        ratio=float("nan"),
    )
    record.created = 1_800_000_000.25
    line = form.format(record)
    assert "\n" not in line and "hunter2" not in line
    out = json.loads(line)
    assert out == {
        "time": "2027-01-15T08:00:00.250Z",
        "level": "warning",
        "logger": "oomguard.manager.auth",
        "message": "refused viewer token from 10.0.0.7",
        "role": "viewer",
        "client": "10.0.0.7",
        "node": None,
        "reason": "*** was wrong",
        "count": 3,
        "ratio": "nan",  # JSON has no NaN: said as text, never an invalid line
    }
    try:
        raise ValueError("postgresql://u:pw-in-url@db/x is down")
    except ValueError:
        failed = _record("the writer failed")
        failed.exc_info = sys.exc_info()
    out = json.loads(form.format(failed))
    assert out["message"] == "the writer failed" and "Traceback" in out["exception"]
    assert "pw-in-url" not in out["exception"] and "ValueError" in out["exception"]


def test_the_manager_s_own_lines_are_json_too(capsys: pytest.CaptureFixture[str]) -> None:
    sayer("json", Redactor(["s3cret-db-pass"]))(
        "oomguard manager: serving (database postgresql://u:s3cret-db-pass@h/d)"
    )
    sayer("text")("oomguard manager: plain")
    err = capsys.readouterr().err.splitlines()
    first = json.loads(err[0])
    assert (first["level"], first["logger"]) == ("info", "oomguard.manager") and "s3cret" not in err[0]
    assert err[1] == "oomguard manager: plain"


def test_a_real_manager_logs_json_lines(tmp_path: Path) -> None:
    manager = ManagerProcess(
        migrated_db("sqlite", tmp_path, "jsonlog_"), env={"OOMGUARD_LOG_FORMAT": "json", "OOMGUARD_DB_WAIT": "0"}
    ).start()
    try:
        refused = httpx.get(f"{manager.url}/api/v1/nodes", headers={"Authorization": "Bearer not-the-viewer-token"})
        assert refused.status_code == 401
        wait_until(lambda: "auth-failure" in manager.log(), what="the refused token's log line")
    finally:
        manager.stop()
    log = manager.log()
    lines = [json.loads(line) for line in log.splitlines() if line.strip()]  # every line is JSON
    assert AGENT not in log and VIEWER not in log and "not-the-viewer-token" not in log
    start = [x for x in lines if x["message"].startswith("oomguard manager: serving http://127.0.0.1:")]
    assert len(start) == 1 and start[0]["level"] == "info" and start[0]["logger"] == "oomguard.manager"
    warned = [x for x in lines if "fleet-wide --agent-token is on" in x["message"]]
    assert len(warned) == 1 and warned[0]["level"] == "warning"
    (auth,) = [x for x in lines if x.get("event") == "auth-failure"]
    assert auth["level"] == "warning" and auth["logger"] == "oomguard.manager.auth"
    assert (auth["role"], auth["client"], auth["node"], auth["reason"]) == (
        "viewer",
        "127.0.0.1",
        None,
        "a wrong token",
    )
    assert all(x["time"].endswith("Z") for x in lines)
