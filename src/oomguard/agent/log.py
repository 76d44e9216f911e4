"""The agent's stderr: one human line per message; a full traceback for an internal error.

Expected trouble (the manager down, a 5xx, a full disk) is one line. An exception that
escapes a cycle of the loop is a bug: its traceback goes to stderr as well, so that it can
be reported and fixed rather than read as ``Type: msg`` and forgotten.
"""

from __future__ import annotations

import sys
import traceback

PREFIX = "oomguard agent: "


def one_line(text: str, limit: int = 200) -> str:
    """*text* with its white space runs (newlines included) squeezed to one space, cut at *limit*."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def stderr_log(line: str) -> None:
    """The default log: ``oomguard agent: LINE`` on stderr."""
    sys.stderr.write(PREFIX + line + "\n")
    sys.stderr.flush()


def stderr_traceback(exc: BaseException) -> None:
    """*exc*'s full traceback on stderr, each line prefixed so it is found among the others."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    sys.stderr.write("".join(PREFIX + line + "\n" for line in text.rstrip("\n").split("\n")))
    sys.stderr.flush()
