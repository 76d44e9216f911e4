"""The manager waits for its database at start (issue 39, item 4): a database it cannot reach is
tried again with backoff (1, 2, 4, 8 s, then 8 s) and a line per try, for ``--db-wait``; then exit 2
in one line. One that comes while it waits is used: here a SQLite file whose directory (a volume
mounted late) appears during the wait."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.manager import free_port
from tests.helpers.wait import wait_until


def test_an_unreachable_database_is_retried_then_refused_in_one_line() -> None:
    url = f"postgresql://nobody@127.0.0.1:{free_port()}/none"  # nothing listens there
    proc = subprocess.run(
        [sys.executable, "-m", "oomguard", "manager", "--db", url, "--db-wait", "2.5s", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines[0].startswith(f"oomguard manager: cannot reach the database {url} (try 1): ")
    assert lines[0].endswith("; trying again in 1.0 s (--db-wait 2.5s)")  # the first wait of the backoff
    for n, line in enumerate(lines[:-1], 1):  # a line per try, each within what --db-wait leaves
        assert re.fullmatch(rf"oomguard manager: cannot reach .* \(try {n}\): .*; trying again in \d+\.\d s .*", line)
    assert lines[-1].startswith(f"oomguard: error: manager: cannot reach the database {url} after {len(lines)} tries")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_database_that_comes_during_the_wait_is_used(tmp_path: Path) -> None:
    later = tmp_path / "volume"  # not there yet: SQLite cannot open a file in it (OperationalError)
    port = free_port()
    log = tmp_path / "manager.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "oomguard", "manager", "--db", f"sqlite:///{later / 'm.db'}", "--port", str(port)],
            stderr=err,
        )
    try:
        wait_until(lambda: "cannot reach the database" in log.read_text(), what="a retry line")
        later.mkdir()
        alive = lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=2).status == 200  # noqa: E731
        wait_until(lambda: _quiet(alive), what="the manager to serve once its database came")
        assert "applied revision 0001" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _quiet(check: object) -> bool:
    try:
        return bool(check())  # type: ignore[operator]
    except OSError:
        return False
