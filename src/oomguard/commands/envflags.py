"""Every option of ``agent`` and ``manager`` as an ``OOMGUARD_*`` variable: one table, applied here
and printed as docs/configuration.md's table (issue 39, item 6; a test compares the two).

The rule: ``OOMGUARD_`` and the option's name in capitals, dashes as underscores (``--max-time``:
``OOMGUARD_MAX_TIME``). An option given on the command line beats its variable, and an empty
variable is not set (the Twelve-Factor App, "III. Config": config in the environment; Docker's and
Kubernetes' ``env`` set variables, not arguments). A switch (``--once``, ``--no-gpu``) is on for
``1``, ``true``, ``yes`` or ``on`` and off for ``0``, ``false``, ``no`` or ``off``, in any case.

``NAMES``: variables older than the rule keep their names. ``ELSEWHERE``: variables read where
their value is used, since they do more than stand in for the option (a ``_FILE`` form, a list,
labels merged with the option's, the probed environment ``check`` and ``run`` read too); the table
says where. ``NOT_CONFIG``: options of one invocation (``manager migrate --check``, ``manager revoke
--reason``, the gate's: ``agent --gate STEP``) are not configuration, and have no variable.

A value taken from a variable is checked where the option's is; an error names both
(``OOMGUARD_INTERVAL (--interval): ...``, ``reword``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping

from oomguard.errors import UsageError

PREFIX = "OOMGUARD_"
COMMANDS = ("agent", "manager")
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
NAMES = {  # (command, option): variable, where the variable is older than the rule
    ("agent", "--token"): "OOMGUARD_AGENT_TOKEN",
    ("agent", "--token-file"): "OOMGUARD_AGENT_TOKEN_FILE",
    ("agent", "--label"): "OOMGUARD_LABELS",
    ("manager", "--fleet-secret"): "OOMGUARD_FLEET_SECRETS",
    ("manager", "--trusted-proxy"): "OOMGUARD_TRUSTED_PROXIES",
}
_SETTINGS = "the manager's settings (oomguard/manager/settings.py)"
ELSEWHERE = {  # (command, option): where the variable is read, and what it does beyond the option
    ("agent", "--token"): "flags.token_from: after --token and --token-file",
    ("agent", "--token-file"): "flags.token_from: a mounted secret's file",
    ("agent", "--label"): "agent/labels.py: KEY=VALUE,... merged with --label's and the platform's",
    ("agent", "--node-class"): "agent/labels.py: the label node_class (run --manager reads it too)",
    ("agent", "--spool"): "agent/spool.py (run --manager reads it too)",
    ("agent", "--budget"): "policy/budget.py, from the probed environment (check, plan and run read it too)",
    ("manager", "--db"): _SETTINGS + "; or OOMGUARD_DB_FILE, a file holding the URL",
    ("manager", "--fleet-secret"): _SETTINGS + ": comma-separated; or OOMGUARD_FLEET_SECRETS_FILE",
    ("manager", "--agent-token"): _SETTINGS + "; or OOMGUARD_AGENT_TOKEN_FILE",
    ("manager", "--viewer-token"): _SETTINGS + "; or OOMGUARD_VIEWER_TOKEN_FILE",
    ("manager", "--admin-token"): _SETTINGS + "; or OOMGUARD_ADMIN_TOKEN_FILE",
    ("manager", "--trusted-proxy"): _SETTINGS + ": comma-separated",
}
# One invocation's words, not configuration: the manager's actions' options, and the gate's (the
# worker image's entrypoint passes them, and its own OOMGUARD_GATE is on/off: deploy/worker/entrypoint.sh).
ELSEWHERE |= {  # read by settings_from itself, which names the variable in its errors
    ("manager", option): _SETTINGS
    for option in (
        "--max-connections-per-client",
        "--max-new-nodes",
        "--max-events-per-node",
        "--max-observations-per-node",
        "--max-profiles",
        "--max-classes",
        "--max-profiles-per-node",
        "--max-classes-per-node",
        "--write-queue-bytes",
        "--working-set-line",
    )
}
NOT_CONFIG = {
    ("manager", "--check"),
    ("manager", "--reason"),
    ("agent", "--gate"),
    ("agent", "--gate-exit"),
    ("agent", "--gate-message"),
}
HERE = "as the option"


def variable(command: str, option: str) -> str | None:
    """The variable of *option* of *command* (None: an option of one action, not configuration)."""
    if (command, option) in NOT_CONFIG:
        return None
    return NAMES.get((command, option), PREFIX + option.lstrip("-").upper().replace("-", "_"))


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """*parser*'s options (``--help`` left out), in the order ``--help`` lists them."""
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            yield action


def _long(action: argparse.Action) -> str:
    return max(action.option_strings, key=len)


def _switch(text: str, name: str) -> bool:
    word = text.strip().lower()
    if word in TRUE or word in FALSE:
        return word in TRUE
    raise UsageError(f"{name}: expected 1, true, yes or on (or 0, false, no, off), got {text[:64]!r}")


def _value(action: argparse.Action, text: str, name: str) -> object:
    """*text* as the option would have taken it on the command line (its ``type``), or a UsageError."""
    convert = action.type if callable(action.type) else None
    parts = [p.strip() for p in text.split(",") if p.strip()] if isinstance(action, argparse._AppendAction) else [text]
    try:
        values = [convert(p) if convert is not None else p for p in parts]
    except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
        raise UsageError(f"{name} ({_long(action)}): {exc}") from None
    return values if isinstance(action, argparse._AppendAction) else values[0]


def apply(
    command: str, parser: argparse.ArgumentParser, args: argparse.Namespace, env: Mapping[str, str]
) -> dict[str, str]:
    """Fill each option of *command* not given in *args* from its variable in *env* (unless read
    elsewhere); returns {option: variable} of those filled, for ``reword``."""
    filled = {}
    for action in options(parser):
        option = _long(action)
        name = variable(command, option)
        text = env.get(name, "") if name is not None else ""
        if not text or (command, option) in ELSEWHERE or getattr(args, action.dest, None) != action.default:
            continue
        if isinstance(action, argparse._StoreTrueAction):
            setattr(args, action.dest, _switch(text, f"{name} ({option})"))
        else:
            setattr(args, action.dest, _value(action, text, name or option))
        filled[option] = name or option
    return filled


def reword(message: str, filled: Mapping[str, str]) -> str:
    """ "--interval: ..." as "OOMGUARD_INTERVAL (--interval): ..." where the variable gave the value."""
    for option, name in filled.items():
        if message.startswith(option + ":"):
            return f"{name} ({option}){message[len(option) :]}"
    return message


def rows(parsers: Mapping[str, argparse.ArgumentParser]) -> list[tuple[str, str, str, str]]:
    """(variable, agent's option, manager's option, where it is read) for every option of *parsers*."""
    table: dict[str, dict[str, str]] = {}
    for command, parser in parsers.items():
        for action in options(parser):
            option = _long(action)
            name = variable(command, option)
            if name is not None:
                table.setdefault(name, {})[command] = option
    out: list[tuple[str, str, str, str]] = []
    for name, found in sorted(table.items()):
        where = {c: ELSEWHERE.get((c, option), HERE) for c, option in found.items()}
        said = (
            "; ".join(f"{c}: {w}" for c, w in where.items())
            if len(set(where.values())) > 1
            else where[next(iter(where))]
        )
        agent, manager = (f"`{found[c]}`" if c in found else "" for c in COMMANDS)
        out.append((name, agent, manager, said))
    return out


def markdown(parsers: Mapping[str, argparse.ArgumentParser]) -> str:
    """The table of docs/configuration.md."""
    lines = ["| variable | agent | manager | read by |", "|---|---|---|---|"]
    lines += [f"| `{name}` | {agent} | {manager} | {where} |" for name, agent, manager, where in rows(parsers)]
    return "\n".join(lines)


def parsers() -> dict[str, argparse.ArgumentParser]:
    """``agent``'s and ``manager``'s options, each on a parser of its own (as ``oomguard`` configures them)."""
    from oomguard.commands import agent, manager

    found = {}
    for command, module in (("agent", agent), ("manager", manager)):
        parser = argparse.ArgumentParser(prog=f"oomguard {command}", add_help=False)
        module.configure(parser)
        found[command] = parser
    return found


if __name__ == "__main__":  # python -m oomguard.commands.envflags: the table, for docs/configuration.md
    print(markdown(parsers()))
