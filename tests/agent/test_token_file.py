"""``--token-file FILE`` (issue 37): the token reaches the manager as the bearer token, its line
ending stripped, and never the command line (``/proc/PID/cmdline``) nor the worker's environment."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from oomguard.errors import EXIT_OK
from tests.conftest import run_oomguard
from tests.helpers.agent_fake import TOKEN, FakeManager

PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def _token_file(tmp_path: Path) -> Path:
    path = tmp_path / "agent-token"
    path.write_text(TOKEN + "\n")  # as `echo TOKEN > file`, or a Kubernetes secret with a newline
    path.chmod(0o600)
    return path


def test_agent_sends_the_token_from_the_file(manager: FakeManager, tmp_path: Path) -> None:
    path = _token_file(tmp_path)
    proc = run_oomguard(
        "agent",
        *("--once", "--no-gpu", "--manager", manager.url, "--token-file", str(path), "--spool", str(tmp_path / "s")),
        env={"OOMGUARD_AGENT_TOKEN": "the-variable-loses"},
    )
    assert proc.returncode == EXIT_OK, proc.stderr
    assert [r["auth"] for r in manager.requests] == [f"Bearer {TOKEN}"]


def test_run_sends_its_events_with_the_token_from_the_file(manager: FakeManager, tmp_path: Path) -> None:
    path = _token_file(tmp_path)
    proc = run_oomguard(
        "run",
        *("--budget", "1GiB", "--restart", "never", "--manager", manager.url, "--token-file", str(path)),
        *("--spool", str(tmp_path / "s"), "--node", "n1", "--", sys.executable, "-c", PRINT_ENV),
    )
    assert proc.returncode == EXIT_OK, proc.stderr
    events = [r for r in manager.requests if r["path"].endswith("/events")]
    assert events and {r["auth"] for r in events} == {f"Bearer {TOKEN}"}
    worker_env = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not any(TOKEN in value for value in worker_env.values())
