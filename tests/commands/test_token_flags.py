"""The agent's token and the manager's URL on the command line (issue 37): ``agent``, ``run`` and
``plan --learned`` take the token from ``--token``, ``--token-file`` (kept out of ps) or
``OOMGUARD_AGENT_TOKEN``, check it where it is read (visible ASCII, what the manager accepts), and
refuse what cannot be sent, like any URL that cannot be connected to, in one line with exit 2
before anything starts: never a traceback (``agent``), never a sender thread that dies while
``run`` exits 0."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

from oomguard.commands import flags
from oomguard.errors import EXIT_USAGE, UsageError
from tests.conftest import run_oomguard

DEAD = "http://127.0.0.1:9"
RULE = "the token must hold only visible ASCII characters, no spaces"
BAD_TOKENS = ["tök€n", "токен-1234", "emoji-\U0001f600", "a b", "tok\u00e9n"]


def _commands(tmp_path: Path, marker: Path) -> dict[str, list[str]]:
    """Each command that reads the token, against a manager that is never reached."""
    spool = str(tmp_path / "spool")
    worker = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    return {
        "agent": ["agent", "--manager", DEAD, "--once", "--no-gpu", "--spool", spool],
        "run": ["run", "--manager", DEAD, "--spool", spool, "--budget", "1GiB", "--restart", "never", "--", *worker],
        "run --learned": [
            *("run", "--learned", "--profile", "porep-c2-32g", "--manager", DEAD, "--spool", spool),
            *("--budget", "1GiB", "--restart", "never", "--", *worker),
        ],
        "plan --learned": [
            *("plan", "--learned", "--profile", "porep-c2-32g", "--manager", DEAD, "--spool", spool),
            "--no-gpu",
        ],
    }


def _env(**extra: str) -> dict[str, str]:
    """This environment without OOMGUARD_* (nor a proxy), plus *extra*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_") and "proxy" not in k.lower()}
    return env | extra


def _one_error_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    """Runs ``oomguard argv``; asserts exit 2 and one error line, without a traceback; the line."""
    proc = run_oomguard(*argv, env=_env(**(env or {})))
    assert proc.returncode == EXIT_USAGE, (argv, proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("oomguard: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr.removeprefix("oomguard: error: ").rstrip("\n")


@pytest.mark.parametrize("command", ["agent", "run", "run --learned", "plan --learned"])
@pytest.mark.parametrize("source", ["--token", "--token-file", "OOMGUARD_AGENT_TOKEN"])
def test_a_token_that_cannot_travel_in_a_header_is_one_line_and_exit_2(
    command: str, source: str, tmp_path: Path
) -> None:
    """The issue: a non-Latin-1 token was a traceback (agent, exit 1) or a dead sender thread (run, exit 0)."""
    token = BAD_TOKENS[0]
    marker = tmp_path / "worker-ran"
    argv, env = _commands(tmp_path, marker)[command], {}
    if source == "--token":
        argv = [*argv[:1], "--token", token, *argv[1:]]
        where = "--token"
    elif source == "--token-file":
        path = tmp_path / "token"
        path.write_text(token + "\n")
        argv = [*argv[:1], "--token-file", str(path), *argv[1:]]
        where = f"--token-file {path}"
    else:
        env = {"OOMGUARD_AGENT_TOKEN": token}
        where = "OOMGUARD_AGENT_TOKEN"
    line = _one_error_line(argv, env)
    assert line.startswith(f"{where}: {RULE}"), line
    assert token not in line
    assert not marker.exists()  # run: refused before the worker started


@pytest.mark.parametrize("token", BAD_TOKENS[1:])
def test_every_token_outside_visible_ascii_is_refused(token: str, tmp_path: Path) -> None:
    line = _one_error_line(["agent", "--manager", DEAD, "--token", token, "--once", "--no-gpu"])
    assert line.startswith(f"--token: {RULE}") and token not in line


BAD_URLS = [
    ("http://%00/", "the URL's host must be a name"),  # the issue: http.client's InvalidURL, exit 1
    ("http://a..b/", "the URL's host must be a name"),  # the idna codec's UnicodeError
    ("http://" + "x" * 64 + ".example/", "the URL's host must be a name"),
    ("http://[zz]/", "the URL must be http://HOST"),
    ("http://bücher.example/", "the URL must be visible ASCII"),
    ("http://h/a\nb", "the URL must be visible ASCII"),
    ("http://u:hunter2@127.0.0.1:9", "the URL must not carry a user or password"),
]


@pytest.mark.parametrize(("url", "words"), BAD_URLS)
@pytest.mark.parametrize("command", ["plan --learned", "agent", "run"])
def test_any_manager_url_is_one_line_and_exit_2(command: str, url: str, words: str, tmp_path: Path) -> None:
    marker = tmp_path / "worker-ran"
    argv = _commands(tmp_path, marker)[command]
    argv = [url if a == DEAD else a for a in argv]
    line = _one_error_line(argv)
    assert line.startswith(f"--manager: {words}"), line
    assert "hunter2" not in line and not marker.exists()


# --- --token-file -------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "empty").write_text("")
    (tmp_path / "blank").write_text(" \n\n")
    (tmp_path / "big").write_text("x" * (flags.TOKEN_FILE_MAX + 1))
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "latin1").write_bytes(b"t\xe9st\n")  # not UTF-8, not ASCII
    (tmp_path / "two-lines").write_text("tok\nother\n")
    names = ("empty", "blank", "big", "adir", "fifo", "latin1", "two-lines")
    return {name: str(tmp_path / name) for name in names} | {"missing": str(tmp_path / "missing")}


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("missing", "--token-file: cannot read {}: No such file or directory"),
        ("empty", "--token-file: {} is empty"),
        ("blank", "--token-file: {} is empty"),
        ("big", "--token-file: cannot read {}: larger than 16 KiB"),
        ("adir", "--token-file: cannot read {}: not a regular file"),
        ("fifo", "--token-file: cannot read {}: not a regular file"),  # at once, never waiting for a writer
        ("latin1", "--token-file {}: " + RULE),
        ("two-lines", "--token-file {}: " + RULE),
    ],
)
def test_a_token_file_that_gives_no_token_is_one_line_and_exit_2(files: dict[str, str], name: str, words: str) -> None:
    line = _one_error_line(["agent", "--manager", DEAD, "--token-file", files[name], "--once", "--no-gpu"])
    assert line.startswith(words.format(files[name])), line


def test_a_token_file_path_with_a_newline_stays_one_line(tmp_path: Path) -> None:
    path = str(tmp_path / "a\nb")
    line = _one_error_line(["plan", "--learned", "--profile", "porep-c2-32g", "--manager", DEAD, "--token-file", path])
    assert line == f"--token-file: cannot read {path!r}: No such file or directory"


def test_token_and_token_file_together_are_refused(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("from-the-file\n")
    line = _one_error_line(
        ["agent", "--manager", DEAD, "--token", "x", "--token-file", str(tmp_path / "t"), "--once", "--no-gpu"]
    )
    assert line.startswith("--token and --token-file: give one of them")


def test_plan_token_file_needs_learned(tmp_path: Path) -> None:
    line = _one_error_line(["plan", "--profile", "porep-c2-32g", "--token-file", str(tmp_path / "t"), "--no-gpu"])
    assert line == "--token-file needs --learned"


def _args(token: str | None = None, token_file: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(token=token, token_file=token_file)


def test_precedence_flag_then_file_then_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--token or --token-file (never both) beats OOMGUARD_AGENT_TOKEN; no token at all is none ("")."""
    path = tmp_path / "t"
    path.write_text("from-the-file\r\n")
    monkeypatch.setenv("OOMGUARD_AGENT_TOKEN", " from-the-variable\n")
    assert flags.token_from(_args("from-the-flag")) == "from-the-flag"
    assert flags.token_from(_args(token_file=str(path))) == "from-the-file"  # its line ending stripped
    assert flags.token_from(_args()) == "from-the-variable"
    monkeypatch.delenv("OOMGUARD_AGENT_TOKEN")
    assert flags.token_from(_args()) == ""
    with pytest.raises(UsageError, match=r"^--token and --token-file: give one of them"):
        flags.token_from(_args("x", str(path)))


def test_the_token_file_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``run`` asks for the token for --learned and for its events: one read, one token."""
    monkeypatch.delenv("OOMGUARD_AGENT_TOKEN", raising=False)
    path = tmp_path / "t"
    path.write_text("first\n")
    args = _args(token_file=str(path))
    assert flags.token_from(args) == "first"
    path.write_text("second\n")
    assert flags.token_from(args) == "first"


@pytest.mark.parametrize("command", [["agent"], ["run"], ["plan"]])
def test_help_says_where_a_token_is_safe(command: list[str]) -> None:
    proc = run_oomguard(*command, "--help", env={"COLUMNS": "300"})
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "--token-file FILE" in text
    assert "visible to other users of the host (ps, /proc/PID/cmdline): prefer --token-file or the variable" in text
    assert "--token or --token-file (not both) beats OOMGUARD_AGENT_TOKEN" in text
