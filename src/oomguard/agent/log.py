"""The agent's stderr: one human line per message; a full traceback for an internal error.

Expected trouble (the manager down, a 5xx, a full disk) is one line. An exception that
escapes a cycle of the loop is a bug: its traceback goes to stderr as well, so that it can
be reported and fixed rather than read as ``Type: msg`` and forgotten.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

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


class Episode:
    """One line when a kind of trouble starts or changes kind, none while it goes on (a retry
    is no news), one when it ends: ``oomguard agent`` logs failure episodes, not attempts."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.kind: str | None = None
        self.counts: dict[str, int] = {}

    def trouble(self, kind: str, line: str) -> None:
        """Log *line* unless trouble of this *kind* is already going on."""
        if kind != self.kind:
            self.kind = kind
            self.log(line)

    def count(self, what: str) -> None:
        """Count something that happened during the episode (said when it ends)."""
        self.counts[what] = self.counts.get(what, 0) + 1

    def end(self, line: str) -> None:
        """Log *line* and what was counted, when trouble was going on."""
        if self.kind is None:
            return
        extra = "".join(f", {n} {what}" for what, n in self.counts.items())
        self.log(line + extra)
        self.kind = None
        self.counts = {}
