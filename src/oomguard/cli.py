"""The ``oomguard`` command: an argparse parser, lazy dispatch, errors as one line and an exit code.

Each command is a module in ``oomguard.commands`` with ``configure(parser)`` (its options) and
``execute(args) -> int``. Only the module of the command that runs is imported (and its options
defined): ``oomguard check`` loads the probe and nothing of ``run``, ``agent`` or the manager.
``completion`` gets the whole parser (``args.parser``), every command configured.
"""

from __future__ import annotations

import argparse
import os
import sys

from oomguard._version import __version__
from oomguard.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    BadParameter,
    OomguardError,
    UsageError,
    exit_codes_help,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, NoReturn

# name -> one line for 'oomguard --help'; the module is oomguard.commands.<name>.
COMMANDS: dict[str, str] = {
    "check": "the memory this process may really use, and a safe budget",
    "plan": "how many jobs of a shape fit, and which constraint binds",
    "verify": "allocate the plan for real in child processes: delivered or not",
    "run": "supervise a worker under its budget; tell OOM kills apart; restart",
    "capture": "save what the probe reads as a .tar.gz snapshot",
    "agent": "send this node's report to the fleet manager (spooled when it is down)",
    "manager": "the fleet manager: API, dashboard, metrics (extra [manager])",
    "completion": "print a shell completion script (bash or zsh)",
}

ENV_COMMANDS = ("agent", "manager")  # whose options are also OOMGUARD_* variables
DESCRIPTION = "Know the memory a worker may really use inside a container, and keep it there."


def _main_epilog() -> str:
    rows = "\n".join(f"  {name:<11} {brief}" for name, brief in COMMANDS.items())
    return (
        f"commands:\n{rows}\n\n"
        "Run 'oomguard COMMAND --help' for a command's options.\n"
        "'oomguard --version' prints the version.\n\n" + exit_codes_help()
    )


def _columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` finds it, without importing shutil."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's layout; descriptions are wrapped, lines that start with a space (tables) are kept.

    The width is found here: argparse's own default imports shutil (and bz2, lzma), which every
    ``add_argument`` pays for, help or not.
    """

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        lines = []
        for line in text.splitlines():
            if line.startswith(" ") or len(indent + line) <= width:
                lines.append(indent + line)
            else:
                lines.append(
                    textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)
                )
        return "\n".join(lines)

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)  # keeps --list-profiles whole


def _plain(message: str, prog: str) -> str:
    """argparse's message in oomguard's words, naming the flag.

    ``check: --budget needs a value``, ``check: --json takes no value``, ``check: unknown option
    --bogus`` (what the command line is missing: the command first); ``--restart: expected one
    of ...`` (what a value is missing: the flag first, as the commands' own checks say it).
    """
    command = prog.rsplit(maxsplit=1)[-1]
    where, see = ("", "") if command == "oomguard" else (f"{command}: ", f" (see '{prog} --help')")
    subject, sep, rest = message.partition(": ")
    if not (sep and subject.startswith("argument ")):
        return f"{where}{message}{see}"
    flag = subject[len("argument ") :].split("/")[-1]
    if rest.startswith("expected one argument"):
        return f"{where}{flag} needs a value{see}"
    if rest.startswith("ignored explicit argument"):
        return f"{where}{flag} takes no value{see}"
    return f"{flag}: {rest}"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are ``UsageError`` (one line, exit 2), never a usage dump.

    A value that starts with a minus and a digit (``--budget -5GiB``) is a value, not an option:
    argparse only treats plain numbers (``-5``) so, and would otherwise say the flag "expected one
    argument" instead of letting the size parser say the size is negative. ``_negative_number_matcher``
    is argparse's own hook for this (CPython Lib/argparse.py, 3.10-3.13).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        import re  # argparse has imported it already

        self._negative_number_matcher = re.compile(r"^-\d")

    def error(self, message: str) -> NoReturn:
        raise UsageError(_plain(message, self.prog))


def _command_of(argv: list[str]) -> str | None:
    """The command word: the first argument that is not an option (the top level has no valued option)."""
    word = next((a for a in argv if not a.startswith("-")), None)
    if word is not None and word not in COMMANDS:
        raise UsageError(f"unknown command {word!r} (commands: {', '.join(COMMANDS)}; see 'oomguard --help')")
    return word


def _module(command: str) -> ModuleType:
    """``oomguard.commands.<command>``, imported now (``__import__``: importlib costs start-up time)."""
    return __import__(f"oomguard.commands.{command}", fromlist=["execute"])


def build_parser(command: str | None = None, *, full: bool = False) -> Parser:
    """The parser with *command* (every command when *full*): only what runs is imported and built.

    The main help lists the commands from ``COMMANDS``, so it needs no subparser.
    """
    parser = Parser(
        prog="oomguard",
        usage="%(prog)s COMMAND [OPTIONS]",
        description=DESCRIPTION,
        epilog=_main_epilog(),
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"oomguard {__version__}", help="print the version and exit"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", prog="oomguard", help=argparse.SUPPRESS)
    for name, brief in COMMANDS.items():
        if full or name == command:
            sub = subparsers.add_parser(name, help=brief, formatter_class=HelpFormatter)
            _module(name).configure(sub)
            sub.epilog = (sub.epilog + "\n\n" if sub.epilog else "") + exit_codes_help()
    return parser


def subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """*command*'s own parser in *parser* (as ``build_parser`` made it)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[command]
            return found
    raise KeyError(command)


def parse(argv: list[str]) -> argparse.Namespace:
    """*argv* (without the program name) parsed as oomguard parses it; UsageError when it cannot be."""
    command = _command_of(argv)
    parser = build_parser(command, full=command == "completion")
    args, extra = parser.parse_known_args(argv)
    extra = extra[1:] if extra[:1] == ["--"] else extra  # argparse leaves a "--" it did not need
    if extra:
        word = extra[0]
        is_option = word.startswith("-") and word != "-"
        what = f"unknown option {word.partition('=')[0]}" if is_option else f"unexpected argument {word!r}"
        raise UsageError(
            f"{command}: {what} (see 'oomguard {command} --help')" if command else f"{what} (see 'oomguard --help')"
        )
    args.parser = parser
    args.from_env = {}
    if command in ENV_COMMANDS:  # every option is also a variable (commands/envflags.py)
        from oomguard.commands import envflags

        args.from_env = envflags.apply(command, subparser(parser, command), args, os.environ)
    return args


def run(argv: list[str]) -> int:
    """Parse and run one command; returns its exit code (help and --version: 0)."""
    if argv[:1] == ["help"]:  # 'oomguard help [COMMAND]'
        argv = [*argv[1:2], "--help"]
    try:
        args = parse(argv)
    except SystemExit as exc:  # --help and --version print, then argparse exits
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    if args.command is None:
        args.parser.print_help()
        return EXIT_USAGE
    try:
        code = _module(args.command).execute(args)
    except OomguardError as exc:
        exc.from_env = args.from_env  # main names the variable a value came from
        raise
    assert isinstance(code, int)
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns the exit code; no traceback reaches the user for expected errors."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except OomguardError as exc:
        message = str(exc)
        if isinstance(exc, BadParameter):  # the API's parameter name -> the flag the user typed
            from oomguard.commands.flags import flag_message

            message = flag_message(exc)
        if exc.from_env:
            from oomguard.commands.envflags import reword

            message = reword(message, exc.from_env)
        sys.stderr.write(f"oomguard: error: {message}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("oomguard: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


def main_exit() -> None:
    """Console-script entry point."""
    sys.exit(main())
