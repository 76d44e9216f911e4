"""Every option of ``agent`` and ``manager`` is an ``OOMGUARD_*`` variable (issue 39, item 6): one
table (commands/envflags.py) applies them and prints docs/configuration.md's table."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from oomguard.cli import parse
from oomguard.commands import envflags
from oomguard.commands.flags import OneOf
from oomguard.errors import UsageError
from tests.conftest import run_oomguard

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"
BEGIN, END = "<!-- envflags:begin -->", "<!-- envflags:end -->"
PARSERS = envflags.parsers()
APPLIED = [
    (command, action)
    for command, parser in PARSERS.items()
    for action in envflags.options(parser)
    if envflags.variable(command, max(action.option_strings, key=len)) is not None
    and (command, max(action.option_strings, key=len)) not in envflags.ELSEWHERE
]


def _option(action: argparse.Action) -> str:
    return max(action.option_strings, key=len)


def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("OOMGUARD_"):
            monkeypatch.delenv(key)


def test_the_docs_table_is_the_code_s() -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC} lost its table markers"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert table == envflags.markdown(PARSERS), "regenerate it: python -m oomguard.commands.envflags"


def test_every_option_has_a_variable_or_is_one_invocation_s() -> None:
    seen = {(c, _option(a)) for c, p in PARSERS.items() for a in envflags.options(p)}
    assert len(seen) > 50  # both commands' options were found
    without = {key for key in seen if envflags.variable(*key) is None}
    assert without == envflags.NOT_CONFIG  # and nothing else
    assert set(envflags.ELSEWHERE) <= seen and set(envflags.NAMES) <= seen  # no stale entry
    names = [envflags.variable(*key) for key in seen - without]
    assert all(re.fullmatch(r"OOMGUARD_[A-Z0-9_]+", str(n)) for n in names)
    # one variable, one meaning: shared only by options of the same meaning in the two commands
    shared = {n for n in names if names.count(n) > 1}
    assert shared == {"OOMGUARD_INTERVAL", "OOMGUARD_AGENT_TOKEN"}  # the agents' interval; the agents' token


def _sample(action: argparse.Action) -> str:
    return action.type.choices[0] if isinstance(action.type, OneOf) else "7"


@pytest.mark.parametrize(("command", "action"), APPLIED, ids=[f"{c}{_option(a)}" for c, a in APPLIED])
def test_a_variable_gives_what_its_option_gives(
    command: str, action: argparse.Action, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean(monkeypatch)
    option, name = _option(action), str(envflags.variable(command, _option(action)))
    if isinstance(action, argparse._StoreTrueAction):
        by_flag = getattr(parse([command, option]), action.dest)
        monkeypatch.setenv(name, "yes")
        assert getattr(parse([command]), action.dest) is True is by_flag
        monkeypatch.setenv(name, "OFF")
        assert getattr(parse([command]), action.dest) is False
        monkeypatch.setenv(name, "maybe")
        with pytest.raises(UsageError, match=rf"^{name} \({option}\): expected 1, true"):
            parse([command])
        return
    value = _sample(action)
    other = action.type.choices[-1] if isinstance(action.type, OneOf) else "8"
    by_flag, by_other = (getattr(parse([command, option, v]), action.dest) for v in (value, other))
    assert by_flag != by_other
    monkeypatch.setenv(name, value)
    args = parse([command])
    assert getattr(args, action.dest) == by_flag and args.from_env == {option: name}
    beaten = parse([command, option, other])  # an option given beats its variable
    assert getattr(beaten, action.dest) == by_other and beaten.from_env == {}
    monkeypatch.setenv(name, "")  # empty: not set
    assert getattr(parse([command]), action.dest) == action.default


def test_a_bad_value_from_a_variable_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean(monkeypatch)
    monkeypatch.setenv("OOMGUARD_LOG_FORMAT", "xml")  # the option's own type refuses it
    with pytest.raises(UsageError, match=r"^OOMGUARD_LOG_FORMAT \(--log-format\): expected one of text, json"):
        parse(["manager"])
    monkeypatch.delenv("OOMGUARD_LOG_FORMAT")
    env = {"OOMGUARD_INTERVAL": "soon", "OOMGUARD_MANAGER": "http://127.0.0.1:9", "OOMGUARD_AGENT_TOKEN": ""}
    proc = run_oomguard("agent", "--once", "--no-gpu", env=env)  # checked where --interval is
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("oomguard: error: OOMGUARD_INTERVAL (--interval): invalid duration 'soon'")
    flag = run_oomguard("agent", "--once", "--no-gpu", "--interval", "soon", env=env)
    assert flag.returncode == 2 and "error: --interval: invalid duration" in flag.stderr  # the flag: its name only


def test_the_manager_names_the_variable_too() -> None:
    pytest.importorskip("fastapi")  # the manager's own checks (settings.py) need its extra
    port = run_oomguard("manager", env={"OOMGUARD_PORT": "70000"})
    assert port.returncode == 2 and "error: OOMGUARD_PORT (--port): must be 1 to 65535, got 70000" in port.stderr


def test_a_variable_read_elsewhere_is_read_there() -> None:
    """The table's other readers exist: each such variable is read by the module it names."""
    for (command, option), where in envflags.ELSEWHERE.items():
        name = str(envflags.variable(command, option))
        module = re.search(r"[a-z_/]+\.py", where)
        path = REPO / "src" / "oomguard" / (module[0] if module else "commands/flags.py")
        if module and not path.exists():
            path = REPO / "src" / module[0]
        assert name in path.read_text() or (name + "_FILE") in path.read_text(), (name, path)


def test_the_worker_image_s_own_variables_keep_their_meaning() -> None:
    """deploy/worker/entrypoint.sh has variables of its own (OOMGUARD_GATE is on/off there, where
    agent --gate takes a step): the only ones it shares with the table mean the same option."""
    script = (REPO / "deploy" / "worker" / "entrypoint.sh").read_text()
    used = set(re.findall(r"OOMGUARD_[A-Z0-9_]+", script))
    table = {name for name, *_ in envflags.rows(PARSERS)}
    same = {
        "OOMGUARD_MANAGER",  # passed as agent --manager
        "OOMGUARD_NODE",  # passed as agent --node
        "OOMGUARD_AGENT_TOKEN",
        "OOMGUARD_AGENT_TOKEN_FILE",
        "OOMGUARD_BUDGET",
        "OOMGUARD_LABELS",
        "OOMGUARD_NODE_CLASS",
        "OOMGUARD_SPOOL",
    }
    assert used & table <= same, used & table - same
    assert {"OOMGUARD_MANAGER", "OOMGUARD_NODE"} <= used  # the check above saw the script's variables
    assert "OOMGUARD_GATE" in used and "OOMGUARD_GATE" not in table
