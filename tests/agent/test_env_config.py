"""Configuration by the environment (issue 39, item 6): ``oomguard agent`` takes ``OOMGUARD_MANAGER``
and ``OOMGUARD_NODE`` (only the entrypoint read them before) and ``OOMGUARD_AGENT_TOKEN_FILE`` (a
mounted secret); the manager ``OOMGUARD_DB`` (or ``OOMGUARD_DB_FILE``) and ``<VARIABLE>_FILE`` for
every secret. A flag beats its variable; a file that cannot be read is one line naming the variable."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from oomguard.errors import UsageError
from tests.conftest import run_oomguard
from tests.helpers.agent_fake import FakeManager


def test_the_agent_reads_its_manager_node_and_token_file_from_the_environment(
    manager: FakeManager, tmp_path: Path
) -> None:
    secret = tmp_path / "agent-token"
    secret.write_text("token-from-a-mounted-file\n")
    env = {"OOMGUARD_MANAGER": manager.url, "OOMGUARD_NODE": "env-node", "OOMGUARD_AGENT_TOKEN_FILE": str(secret)}
    env["OOMGUARD_AGENT_TOKEN"] = ""
    proc = run_oomguard("agent", "--once", "--no-gpu", "--spool", str(tmp_path / "spool"), env=env)
    assert proc.returncode == 0, proc.stderr
    (sent,) = manager.requests
    assert sent["body"]["node"] == "env-node" and sent["auth"] == "Bearer token-from-a-mounted-file"
    beaten = run_oomguard(
        "agent", "--once", "--no-gpu", "--node", "flag-node", "--spool", str(tmp_path / "s2"), env=env
    )
    assert beaten.returncode == 0 and manager.requests[-1]["body"]["node"] == "flag-node"  # a flag beats its variable
    none = {**env, "OOMGUARD_MANAGER": ""}
    missing = run_oomguard("agent", "--once", "--no-gpu", "--spool", str(tmp_path / "s3"), env=none)
    assert missing.returncode == 2 and "--manager URL (or OOMGUARD_MANAGER) is required" in missing.stderr
    gone = {**env, "OOMGUARD_AGENT_TOKEN_FILE": str(tmp_path / "nope")}
    unread = run_oomguard("agent", "--once", "--no-gpu", "--spool", str(tmp_path / "s4"), env=gone)
    assert unread.returncode == 2 and unread.stderr.count("\n") == 1
    assert "OOMGUARD_AGENT_TOKEN_FILE: cannot read" in unread.stderr


def manager_args(*argv: str) -> argparse.Namespace:
    from oomguard.commands import manager as command

    parser = argparse.ArgumentParser()
    command.configure(parser)
    return parser.parse_args(list(argv))


def test_the_manager_reads_its_database_and_secrets_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fastapi")
    from oomguard.manager.settings import settings_from

    for key in list(os.environ):
        if key.startswith("OOMGUARD_"):
            monkeypatch.delenv(key)
    files = {
        "OOMGUARD_DB_FILE": "postgresql://oomguard:s3cret@db/oomguard",
        "OOMGUARD_VIEWER_TOKEN_FILE": "viewer-token-from-a-file-0123456789",
        "OOMGUARD_FLEET_SECRETS_FILE": "fleet-secret-from-a-file-0123456789,an-older-fleet-secret-0123456",
        "OOMGUARD_ADMIN_TOKEN_FILE": "admin-token-from-a-file-0123456789",
    }
    for variable, content in files.items():
        path = tmp_path / variable
        path.write_text(content + "\n")
        monkeypatch.setenv(variable, str(path))
    s = settings_from(manager_args())
    assert s.db_url == files["OOMGUARD_DB_FILE"] and s.viewer_token == files["OOMGUARD_VIEWER_TOKEN_FILE"]
    assert s.fleet_secrets == tuple(files["OOMGUARD_FLEET_SECRETS_FILE"].split(","))
    assert s.admin_token == files["OOMGUARD_ADMIN_TOKEN_FILE"]
    monkeypatch.setenv("OOMGUARD_DB", "sqlite:///from-the-variable.db")
    assert settings_from(manager_args()).db_url == "sqlite:///from-the-variable.db"  # the variable beats its file
    assert settings_from(manager_args("--db", "sqlite:///flag.db")).db_url == "sqlite:///flag.db"  # the flag both
    (tmp_path / "OOMGUARD_VIEWER_TOKEN_FILE").write_text("  \n")
    with pytest.raises(UsageError, match=r"^OOMGUARD_VIEWER_TOKEN_FILE: '.*' is empty$"):
        settings_from(manager_args())
