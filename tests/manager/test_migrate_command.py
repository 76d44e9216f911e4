"""Migrations as a step (issue 39, item 3), on a real SQLite file and a real PostgreSQL:
``oomguard manager migrate`` upgrades a database made by an older release's schema with a line per
revision and keeps its rows; ``--check`` exits 3 while it is behind and 0 once it is not; a
database ahead of this manager (a revision it does not carry) is refused, by ``migrate`` and by
the server's start alike, in one line with exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from oomguard.manager.db import current_revision, head_revision, make_engine, migrate
from tests.helpers.manager import db_url_of, free_port

OLD = "0011"  # the schema of the release before this one's revisions (0012, 0013)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return db_url_of(request.param, tmp_path, "mig_")


def manager(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oomguard", "manager", *args], capture_output=True, text=True, timeout=120
    )


def test_migrate_upgrades_an_older_database_a_line_per_revision(db_url: str) -> None:
    migrate(db_url, OLD)
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO nodes (name, first_seen_ms, last_seen_ms) VALUES ('old-node', 1, 2)"))
    behind = manager("migrate", "--check", "--db", db_url)
    assert behind.returncode == 3, behind.stderr
    newer = int(head_revision()) - int(OLD)  # revisions since OLD
    assert (
        f"the database is at revision {OLD}, behind this manager's {head_revision()}: {newer} to apply" in behind.stderr
    )
    assert current_revision(engine) == OLD  # --check changed nothing
    done = manager("migrate", "--db", db_url)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["oomguard manager"] * 2
    assert lines[0].startswith("oomguard manager: applied revision 0012: A node speaks only for itself")
    assert lines[1].startswith("oomguard manager: applied revision 0013: Every OOM kill")
    at_head = f"oomguard manager: the database is at revision {head_revision()}, this manager's head"
    assert lines[-1] == f"{at_head} ({newer} applied)" and len(lines) == newer + 1
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name, kernel_oom_kills_total FROM nodes")).all() == [("old-node", 0)]
    assert manager("migrate", "--check", "--db", db_url).returncode == 0
    engine.dispose()


def test_a_database_ahead_of_this_manager_is_refused(db_url: str) -> None:
    migrate(db_url)
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    for args in (("migrate",), ("migrate", "--check"), ("--port", str(free_port()))):
        refused = manager(*args, "--db", db_url)
        assert refused.returncode == 2, (args, refused.stderr)
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert "the database is at revision 9999, which this manager (head" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_check_goes_with_migrate() -> None:
    wrong = manager("--check")
    assert wrong.returncode == 2 and wrong.stderr.strip() == (
        "oomguard: error: manager: --check goes with 'migrate': oomguard manager migrate --check"
    ), wrong.stderr
