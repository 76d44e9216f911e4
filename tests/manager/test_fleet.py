"""The worker side and the manager together: agent, run --manager, the OpenAPI contract, the extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from sqlalchemy import select

from oomguard.manager.app import create_app
from oomguard.manager.db import make_engine, migrate, reports
from oomguard.manager.settings import Settings
from oomguard.manager.times import parse_iso_ms
from tests.conftest import REPO
from tests.helpers.fuzz import FAST, examples
from tests.helpers.manager import AGENT, VIEWER_H, ManagerProcess, free_port

ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}
ENV.pop("OOMGUARD_BUDGET", None)


def oomguard(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oomguard", *args], capture_output=True, text=True, env=env or ENV, timeout=120
    )


def nodes(url: str) -> dict:  # type: ignore[type-arg]
    import urllib.request

    req = urllib.request.Request(f"{url}/api/v1/nodes", headers=VIEWER_H)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def node(url: str, name: str) -> dict:  # type: ignore[type-arg]
    import urllib.request

    req = urllib.request.Request(f"{url}/api/v1/nodes/{name}", headers=VIEWER_H)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


@pytest.mark.slow
def test_agent_spools_while_the_manager_is_down_then_replays_once(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'fleet.db'}"
    server = ManagerProcess(db)
    spool = tmp_path / "spool"
    args = [
        "agent",
        "--manager",
        server.url,
        "--token",
        AGENT,
        "--node",
        "edge-1",
        "--once",
        "--spool",
        str(spool),
        "--no-gpu",
    ]
    for _ in range(2):  # the manager is down: exit 75, kept on disk
        down = oomguard(*args)
        assert down.returncode == 75, down.stderr
    assert len(list(spool.glob("*-report.json"))) == 2
    server.start()
    try:
        up = oomguard(*args)
        assert up.returncode == 0, up.stderr
        assert not list(spool.glob("*-report.json"))
        detail = node(server.url, "edge-1")
        assert len(detail["history"]) == 3  # two replayed, in order, and the new one; no duplicate
        times = [h["time"] for h in detail["history"]]
        assert times == sorted(times)  # stamped when received
        with make_engine(db).connect() as conn:  # and each keeps the time it was made, as the agent said
            made = list(conn.execute(select(reports.c.agent_ms).order_by(reports.c.id)).scalars())
        assert len(set(made)) == 3 and made == sorted(made) and made[0] < parse_iso_ms(times[0])
        assert detail["latest"]["memory"]["effective_bytes"] > 0
    finally:
        server.stop()


@pytest.mark.slow
def test_run_sends_its_events_to_the_manager(tmp_path: Path) -> None:
    server = ManagerProcess(f"sqlite:///{tmp_path / 'fleet.db'}").start()
    try:
        proc = oomguard(
            "run",
            "--budget",
            "1GiB",
            "--restart",
            "never",
            "--manager",
            server.url,
            "--token",
            AGENT,
            "--node",
            "worker-7",
            "--spool",
            str(tmp_path / "spool"),
            "--",
            "sh",
            "-c",
            "exit 3",
        )
        assert proc.returncode == 3, proc.stderr
        events = node(server.url, "worker-7")["events"]
        assert [e["event"] for e in events] == ["exit", "start"]  # newest first
        assert events[0]["reason"] == "exit" and events[0]["exit_code"] == 3
        assert events[1]["budget_bytes"] == 2**30
    finally:
        server.stop()


def test_manager_without_the_extra_says_what_to_install() -> None:
    code = "import sys; sys.modules['fastapi'] = None\nfrom oomguard.cli import main; sys.exit(main(['manager']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "oomguard: error: manager: the manager extra is not installed (missing fastapi): "
        "pip install 'oomguard[manager]'"
    )


@pytest.mark.slow
def test_manager_refuses_a_public_address_without_tokens(tmp_path: Path) -> None:
    proc = oomguard(
        "manager", "--db", f"sqlite:///{tmp_path / 'x.db'}", "--host", "0.0.0.0", "--port", str(free_port())
    )
    assert proc.returncode == 2 and "refusing to listen on 0.0.0.0" in proc.stderr
    bad_db = oomguard(
        "manager", "--db", "postgresql://nobody@127.0.0.1:1/none", "--port", str(free_port()), "--db-wait", "0"
    )
    assert bad_db.returncode == 2 and bad_db.stderr.startswith(
        "oomguard: error: manager: cannot reach the database postgresql://nobody@127.0.0.1:1/none after 1 tries"
    )


# -- the OpenAPI contract: generated requests never get a 5xx ---------------------------------

_DB = Path(os.environ.get("TMPDIR", "/tmp")) / f"oomguard-schemathesis-{os.getpid()}.db"
migrate(f"sqlite:///{_DB}")
_APP = create_app(
    Settings(db_url=f"sqlite:///{_DB}", allowed_hosts=("testserver", "localhost"))
)  # the test client's Host
schema = schemathesis.openapi.from_asgi("/openapi.json", _APP)
# The coverage phase (every boundary case the schema defines) is built at collection, in every
# xdist worker: a third of the quick loop's collection time. The quick loop keeps the fuzzing
# phase (a tenth of the examples); make test and CI run both.
schema.config.phases.coverage.enabled = not FAST


@schema.parametrize()
@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.slow
def test_api_never_answers_5xx(case: schemathesis.Case[Any]) -> None:
    case.call_and_validate(checks=[not_a_server_error])


@pytest.fixture(scope="module", autouse=True)
def _cleanup_schemathesis_db() -> object:
    yield None
    for suffix in ("", "-wal", "-shm"):
        Path(f"{_DB}{suffix}").unlink(missing_ok=True)
