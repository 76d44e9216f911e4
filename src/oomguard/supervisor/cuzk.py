"""``run --cuzk TEMPLATE``: CuZK, the Filecoin prover, run with oomguard's budget in its own config.

What the public daemon takes (filecoin-project/curio at e0294b0, extern/cuzk):
- cuzk-daemon/src/main.rs L17-31: only ``--config`` (default /data/zk/cuzk.toml), ``--listen``
  and ``--log-level``; clap refuses any other flag. Some private builds added ``--budget``: that
  route is taken only where the binary's ``--help`` lists it (``accepts_flag``).
- cuzk-core/src/config.rs L57-108: ``[memory] total_budget`` is a TOML *string*: ``"auto"`` is
  /proc/meminfo MemTotal (the host's RAM inside a container, memory.rs L83-100) minus
  ``safety_margin`` (default "5GiB"); any other value is ``parse_size``'d and used as written,
  the margin NOT subtracted (L100-107). So oomguard writes its safe budget as a string of
  decimal bytes, and leaves ``safety_margin`` alone: with an explicit budget CuZK adds no second
  margin. A bare TOML integer (``total_budget = 1``) fails the daemon's start (serde: a string is
  expected), so the value is always quoted.
- config.rs L482-497 ``parse_size``: whole numbers with GiB, MiB, GB, MB or none (bytes); anything
  else silently becomes 50 GiB (0 after MiB/MB). Ported as ``parse_size`` below, to read what an
  operator's template asks for.
- The whole budget, not the jobs' share: the pinned SRS parameters (~44 GiB) and the PCE caches
  (~26 GiB) reserve from the same ``total_budget`` as each partition's working set
  (cuzk-memory-manager.md L19-24; engine.rs L2187-2193, L3638-3643).

The template is the operator's own CuZK config: every other setting and comment is kept as
written; only the ``total_budget`` line of the ``[memory]`` table is replaced (or added under its
header). Where Python has ``tomllib`` (3.11+: the worker image's 3.12) the template is parsed first
("not TOML" is a usage error) and the result is parsed again and compared with the template: the
file differs from it by exactly that one value, or nothing is written. On Python 3.10 the line
edit is made without that check.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from oomguard.errors import UsageError
from oomguard.units import GiB, MiB, format_size

U64 = 1 << 64
# Rust's str::trim: Unicode White_Space (not Python's str.isspace, which adds U+001C-U+001F).
_RUST_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
)
_UNITS = (("GiB", GiB, 50), ("MiB", MiB, 0), ("GB", 1_000_000_000, 50), ("MB", 1_000_000, 0))
DEFAULT_BYTES = 50 * GiB  # what CuZK reads for a size it cannot parse


def _u64(text: str) -> int | None:
    """Rust's ``text.parse::<u64>()``: an optional '+', ASCII digits, below 2**64; else None."""
    if not re.fullmatch(r"\+?[0-9]+", text):
        return None
    value = int(text)
    return value if value < U64 else None


def parse_size(text: str) -> int:
    """The bytes CuZK reads from a size string (config.rs L482-497): "50GiB", "626MiB", "1GB", "100MB",
    or bytes; a number it cannot parse is 50 GiB (0 before MiB or MB). The product wraps at 2**64
    (a release build's u64 multiplication)."""
    s = text.strip(_RUST_WHITESPACE)
    for suffix, unit, default in _UNITS:
        if s.endswith(suffix):
            n = _u64(s[: -len(suffix)].strip(_RUST_WHITESPACE))
            return ((default if n is None else n) * unit) % U64
    n = _u64(s)
    return DEFAULT_BYTES if n is None else n


_HEADER = re.compile(r"""^[ \t]*\[[ \t]*(?:memory|"memory"|'memory')[ \t]*\][ \t]*(?:#[^\n]*)?\r?\n?\Z""")
_ANY_HEADER = re.compile(r"^[ \t]*\[")
_KEY = re.compile(r"""^[ \t]*(?:total_budget|"total_budget"|'total_budget')[ \t]*=""")

Loads = Callable[[str], dict[str, Any]]


def toml_loads() -> Loads | None:
    """``tomllib.loads`` where the interpreter has it (3.11+), else None."""
    if sys.version_info >= (3, 11):
        import tomllib  # novermin: guarded by the version check above

        return tomllib.loads
    return None


def _memory_table(text: str, loads: Loads | None) -> dict[str, Any] | None:
    """The template's ``[memory]`` table as parsed (None without a parser); ``ValueError`` (one line)
    for a template that is not TOML or has no ``[memory]`` table."""
    if loads is None:
        return None
    try:
        data = loads(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError
        raise ValueError(f"not TOML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ValueError("not TOML: nested too deep") from None
    memory = data.get("memory")
    if not isinstance(memory, dict):
        raise ValueError("no [memory] table (CuZK's budget is [memory] total_budget)")
    return memory


def _lines(text: str) -> list[str]:
    """*text*'s lines with their ends, split at "\\n" only: TOML's newline (LF or CRLF), not at the
    other characters ``str.splitlines`` takes (U+2028 may stand inside a TOML string)."""
    return [x for x in re.split(r"(?<=\n)", text) if x]


def _memory_lines(lines: list[str]) -> tuple[int, int | None] | None:
    """Where the ``[memory]`` table is in *lines*: (its header's index, its ``total_budget`` line's
    index or None); None without a ``[memory]`` header."""
    header = next((i for i, x in enumerate(lines) if _HEADER.match(x)), None)
    if header is None:
        return None
    end = next((i for i in range(header + 1, len(lines)) if _ANY_HEADER.match(lines[i])), len(lines))
    return header, next((i for i in range(header + 1, end) if _KEY.match(lines[i])), None)


def _edit(text: str, line: str) -> str:
    """*text* with the ``total_budget`` line of its ``[memory]`` table replaced by *line* (added
    under the header where the table has none); ``ValueError`` without a ``[memory]`` header."""
    lines = _lines(text)
    where = _memory_lines(lines)
    if where is None:
        raise ValueError("no [memory] table header (CuZK's budget is [memory] total_budget)")
    header, found = where
    newline = "\r\n" if lines[header].endswith("\r\n") else "\n"
    if found is None:
        lines.insert(header + 1, line + newline)
    else:
        lines[found] = line + newline
    if not lines[header].endswith("\n"):  # the header was the file's last line, without a newline
        lines[header] += newline
    return "".join(lines)


def asked(template_value: object) -> int | None:
    """The budget an operator's template asks for: None for "auto" (or no value), else the bytes CuZK
    would read from it."""
    if template_value is None or template_value == "auto":
        return None
    return parse_size(str(template_value))


def set_total_budget(text: str, budget: int, loads: Loads | None = None) -> tuple[str, str]:
    """(the config with ``[memory] total_budget`` = *budget* bytes, what was done in words).

    An explicit ``total_budget`` in the template below *budget* is kept (an operator's lower cap
    is never raised); "auto" or a larger value is replaced. ``ValueError`` (one line) for a
    template that is not TOML, has no ``[memory]`` table header, or cannot be edited line by line.
    """
    memory = _memory_table(text, loads)
    current = memory.get("total_budget") if memory is not None else _line_value(text)
    lower = asked(current)
    value = budget if lower is None or lower >= budget else lower
    note = f"total_budget = {value} ({format_size(value)})"
    if value != budget:
        note += f": the template's {current!r} is below the budget {budget} and is kept"
    line = f'total_budget = "{value}"  # set by oomguard run before each start: bytes'
    out = _edit(text, line)
    if loads is not None:
        _same_but_budget(text, out, str(value), loads)
    return out, note


def _line_value(text: str) -> str | None:
    """Without a TOML parser: the text of a one-line ``total_budget = "..."`` in ``[memory]``, if any."""
    lines = _lines(text)
    where = _memory_lines(lines)
    if where is None or where[1] is None:
        return None
    m = re.match(r"""^[^=]*=[ \t]*(["'])([^"']*)\1""", lines[where[1]])
    return m.group(2) if m else None


def _same_but_budget(before: str, after: str, value: str, loads: Loads) -> None:
    """``ValueError`` unless *after* parses to *before* with only ``memory.total_budget`` = *value*."""
    want = loads(before)
    want["memory"]["total_budget"] = value
    try:
        got = loads(after)
    except ValueError as exc:
        raise ValueError(f"cannot set total_budget by a line edit: {str(exc).splitlines()[0]}") from None
    if got != want:
        raise ValueError("cannot set total_budget by a line edit (a multi-line value or a [memory] inside a string?)")


def editor(flag: str) -> tuple[Callable[[str, dict[str, str]], str], Callable[[str], str]]:
    """The ``Rendered`` fill and describe of a CuZK config: ``total_budget`` from the
    ``total_budget_bytes`` value; the last edit in words, for ``run``'s line ("total_budget =
    5368709120 (5 GiB)", and that a template's lower value was kept)."""
    loads = toml_loads()
    said = {"note": "total_budget unknown"}

    def fill(text: str, values: dict[str, str]) -> str:
        try:
            out, said["note"] = set_total_budget(text, int(values["total_budget_bytes"]), loads)
        except ValueError as exc:
            raise UsageError(f"{flag}: {exc}") from None
        return out

    return fill, lambda text: said["note"]


# -- the worker's command line ---------------------------------------------------------------
_CONFIG_FLAGS = ("-c", "--config")


def _names(arg: str) -> str:
    return arg.split("=", 1)[0] if arg.startswith("--") else arg[:2] if arg.startswith("-c") else arg


def with_config(command: list[str], output: str, flag: str = "--cuzk") -> list[str]:
    """*command* with ``--config OUTPUT`` right after the program; ``UsageError`` when it names a config
    of its own (the template is ``--cuzk``'s, the file CuZK reads is oomguard's)."""
    if any(_names(a) in _CONFIG_FLAGS for a in command[1:]):
        raise UsageError(
            f"{flag}: remove --config from the worker's command: {flag} names the template, and "
            "oomguard run passes CuZK the config it writes (--cuzk-out)"
        )
    return [command[0], "--config", output, *command[1:]]


def budget_flag_at(command: list[str]) -> tuple[int, int] | None:
    """Where ``--budget VALUE`` (or ``--budget=VALUE``) is in *command*: (index, how many words)."""
    for i, arg in enumerate(command[1:], start=1):
        if arg == "--budget":
            return i, 2 if i + 1 < len(command) else 1
        if arg.startswith("--budget="):
            return i, 1
    return None


def accepts_flag(program: str, flag: str = "--budget", timeout: float = 10.0) -> bool | None:
    """Whether ``PROGRAM --help`` lists *flag*: True, False, or None when it cannot be asked (not found,
    not executable, no answer within *timeout*)."""
    try:
        done = subprocess.run(
            [program, "--help"], check=False, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout + done.stderr).decode("utf-8", "replace")
    return re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", text) is not None


def without_budget_flag(command: list[str]) -> tuple[list[str], str | None]:
    """(*command*, the line to say): ``--budget`` kept where the program's ``--help`` lists it, else
    dropped with one line saying the budget goes through the config only."""
    at = budget_flag_at(command)
    if at is None:
        return command, None
    accepted = accepts_flag(command[0])
    if accepted:
        return command, f"cuzk: {command[0]} accepts --budget (its --help lists it): passed as well as the config"
    i, n = at
    why = "its --help does not list it" if accepted is False else "its --help could not be read"
    line = (
        f"cuzk: {command[0]} has no --budget flag ({why}; the public daemon takes --config, --listen and "
        "--log-level): --budget dropped, the budget goes through [memory] total_budget only"
    )
    return command[:i] + command[i + n :], line
