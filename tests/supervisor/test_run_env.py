"""``oomguard run`` keeps oomguard's own secrets from its worker: a real run whose worker prints
its environment, and the rule (``supervisor/config.py`` ``is_secret_variable``) against every
secret variable named anywhere in src/oomguard."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from oomguard.supervisor.config import (
    SECRET_VARIABLES,
    SECRET_WORDS,
    WORKER_VARIABLES,
    is_secret_variable,
    worker_environ,
)
from tests.conftest import REPO, run_oomguard
from tests.helpers.agent_fake import FakeManager, running_manager

SECRETS = {
    "OOMGUARD_AGENT_TOKEN": "agent-secret-1",
    "OOMGUARD_VIEWER_TOKEN": "viewer-secret-2",
    "OOMGUARD_ADMIN_TOKEN": "admin-secret-3",
    "OOMGUARD_FLEET_SECRET": "fleet-secret-4",
    "OOMGUARD_FLEET_SECRETS": "fleet-secret-5,fleet-secret-6",
    "OOMGUARD_SOMETHING_NEW_KEY": "key-secret-7",  # one added later, caught by the rule
    "OOMGUARD_DB_PASSWORD": "db-secret-8",
    # issue 37: a secret's word anywhere in the name, in any case
    "OOMGUARD_Secret": "mixed-case-secret-9",
    "oomguard_agent_token": "lower-case-secret-10",
    "OOMGUARD_CREDENTIALS": "credentials-secret-11",
    "OOMGUARD_AUTH_HEADER": "auth-secret-12",
    "OOMGUARD_TOKEN_FOR_X": "token-secret-13",
    "OOMGUARD_PASSWORD_OLD": "password-secret-14",
    "OOMGUARD_API_KEYS": "keys-secret-15",
    "Oomguard_Basic_Auth": "auth-secret-16",
    "OOMGUARD_AGENT_TOKEN_FILE": "/run/secrets/agent-token",  # the way to the token: none of the worker's business
}
KEPT = {
    "OOMGUARD_LABELS": "zone=eu1",
    "OOMGUARD_SPOOL": "/var/lib/oomguard/spool",
    "OOMGUARD_NODE_CLASS": "h200",
    "MY_APP_TOKEN": "the-worker-s-own",  # not oomguard's: the worker's business
    "HF_TOKEN": "the-worker-s-own-2",
    "AWS_SECRET_ACCESS_KEY": "the-worker-s-own-3",
    "my_oomguard_secret": "the-worker-s-own-4",  # oomguard's are OOMGUARD_*, not *OOMGUARD*
}
PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def _worker_env(*flags: str, env: dict[str, str]) -> dict[str, str]:
    proc = run_oomguard(
        "run", "--budget", "1GiB", "--restart", "never", *flags, "--", sys.executable, "-c", PRINT_ENV, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    printed: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return printed


def _no_secret_in(env: dict[str, str]) -> None:
    for name, secret in SECRETS.items():
        assert name not in env
        for part in secret.split(","):
            assert not any(part in value for value in env.values()), name


def test_the_worker_gets_no_secret_of_oomguard_and_everything_else() -> None:
    env = _worker_env(env={**SECRETS, **KEPT})
    _no_secret_in(env)
    for name, value in KEPT.items():
        assert env[name] == value
    assert env["OOMGUARD_BUDGET"] == "1GiB" and env["OOMGUARD_BUDGET_BYTES"] == str(1 << 30)


def test_the_variables_oomguard_gives_its_worker_are_never_secrets(clean_env: None) -> None:
    """Every OOMGUARD_* variable ``run`` sets for its worker reaches it (plan flags: all of them),
    and none of them is one the scrub drops (``WORKER_VARIABLES``)."""
    # clean_env: no OOMGUARD_* of the caller (a CI lane's OOMGUARD_TEST_LANE) is counted as run's own.
    env = _worker_env("--per-job", "64MiB", "--max-jobs", "2", env={**SECRETS, **KEPT})
    _no_secret_in(env)
    given = {name for name in env if name.startswith("OOMGUARD_")} - set(KEPT)
    assert given == WORKER_VARIABLES, given
    assert not any(is_secret_variable(name) for name in WORKER_VARIABLES)


def test_run_manager_still_speaks_with_the_token_its_worker_never_sees(tmp_path: Path) -> None:
    """The token reaches the manager in run's events, and not the worker."""
    manager: FakeManager
    for manager in running_manager():
        env = _worker_env("--manager", manager.url, "--spool", str(tmp_path / "spool"), "--node", "n1", env=SECRETS)
        _no_secret_in(env)
        events = [r for r in manager.requests if r["path"].endswith("/events")]
        assert events, manager.requests
        assert {r["auth"] for r in events} == {"Bearer " + SECRETS["OOMGUARD_AGENT_TOKEN"]}


def test_every_secret_variable_named_in_the_source_is_one() -> None:
    """A token or secret variable added anywhere (the manager's too) is kept from the worker."""
    words = "|".join(SECRET_WORDS)
    pattern = re.compile(rf"\bOOMGUARD_\w*(?:{words})\w*\b", re.IGNORECASE)
    found = {m for path in (REPO / "src" / "oomguard").rglob("*.py") for m in pattern.findall(path.read_text())}
    assert {"OOMGUARD_AGENT_TOKEN", "OOMGUARD_VIEWER_TOKEN", "OOMGUARD_ADMIN_TOKEN"} <= found
    assert all(is_secret_variable(name) for name in found | SECRET_VARIABLES), found


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OOMGUARD_AGENT_TOKEN", True),
        ("OOMGUARD_X_TOKENS", True),
        ("OOMGUARD_X_SECRET", True),
        ("OOMGUARD_X_KEY", True),
        ("OOMGUARD_BUDGET", False),
        ("OOMGUARD_BUDGET_BYTES", False),
        ("OOMGUARD_JOBS_BUDGET_BYTES", False),
        ("OOMGUARD_LABELS", False),
        ("AGENT_TOKEN", False),
        ("HF_TOKEN", False),
        ("MY_OOMGUARD_SECRET", False),
        # issue 37: in any case, a secret's word anywhere in an OOMGUARD_* name
        ("OOMGUARD_Secret", True),
        ("oomguard_agent_token", True),
        ("Oomguard_Token", True),
        ("OOMGUARD_CREDENTIALS", True),
        ("OOMGUARD_GCP_CREDENTIAL_FILE", True),
        ("OOMGUARD_AUTH", True),
        ("OOMGUARD_BASIC_AUTH_USER", True),
        ("OOMGUARD_AUTHORIZATION", True),
        ("OOMGUARD_TOKEN_X", True),
        ("OOMGUARD_PASSWORD_FILE", True),
        ("OOMGUARD_DB_PASSWD", True),
        ("OOMGUARD_KEY_PASSPHRASE", True),
        ("OOMGUARD_SESSION_COOKIE", True),
        ("OOMGUARD_AGENT_TOKEN_FILE", True),  # the way to the token
        ("OOMGUARD_KEYBOARD", True),  # a false alarm costs the worker a variable of oomguard's, no more
    ],
)
def test_the_rule(name: str, secret: bool) -> None:
    assert is_secret_variable(name) is secret
    assert (name in worker_environ({name: "x", "PATH": "/bin"})) is not secret


def test_run_help_names_every_secret_word() -> None:
    from oomguard.commands.run import EPILOG

    text = " ".join(EPILOG.split())
    assert all(word in text for word in SECRET_WORDS), text
