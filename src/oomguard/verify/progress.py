"""What ``verify``'s children say while they fault their memory in, and how it is shown.

Each ``_alloc`` child writes JSON lines on stdout: ``{"progress": BYTES, "seconds": S}`` every
half second while it touches its pages, then one final ``{"touched": N, "seconds": S}`` (or
``{"error": ...}``). ``collect`` reads all children at once (``selectors`` over their pipes) until
each has said its final word, its pipe closed, or ``REPORT_TIMEOUT`` passed.

On stderr, ``Progress`` shows it: where stderr is a terminal, one line per child, redrawn in
place ("child 4242: 3.20 GiB of 14 GiB (22%), 1.85 GB/s"); elsewhere (a log, a pipe) one summary
line at the end, so a minutes-long verify of a large budget is not silent and a log is not
flooded. The summary's "touched" is the result's ``touched_bytes``: the children that said
``touched``, never the part a child faulted in before it was killed ("1 of 2 children touched
768 MiB of 1.5 GiB"), so a run has one touched figure.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import time
from collections.abc import Callable
from typing import Any, TextIO

from oomguard.units import format_size

REPORT_TIMEOUT = 900.0  # seconds for all children to fault their memory in
REDRAW_EVERY = 0.2  # seconds between two redraws on a terminal


def _rate(done: int, seconds: float | None) -> str:
    return f"{done / seconds / 1e9:.2f} GB/s" if seconds and done else "-"


class Progress:
    """Per-child progress on a terminal, a summary line elsewhere; *out* None shows nothing."""

    def __init__(self, out: TextIO | None, sizes: list[int], pids: list[int]) -> None:
        self.out = out
        self.tty = bool(out is not None and out.isatty())
        self.sizes, self.pids = sizes, pids
        self.done = [0] * len(sizes)
        self.seconds: list[float | None] = [None] * len(sizes)
        self.finished = [False] * len(sizes)  # said its final "touched"
        self._drawn = False
        self._last = 0.0

    def update(self, i: int, done: int, seconds: float | None) -> None:
        self.done[i], self.seconds[i] = done, seconds
        if self.tty and time.monotonic() - self._last >= REDRAW_EVERY:
            self._draw()

    def touched(self, i: int, done: int, seconds: float | None) -> None:
        """Child *i* said its final ``touched``: it counts in the summary's touched figure."""
        self.finished[i] = True
        self.update(i, done, seconds)

    def line(self, i: int) -> str:
        size, done = self.sizes[i], self.done[i]
        pct = f" ({done * 100 // size}%)" if size else ""
        return f"oomguard verify: child {self.pids[i]}: {format_size(done)} of {format_size(size)}{pct}, " + _rate(
            done, self.seconds[i]
        )

    def _draw(self) -> None:
        assert self.out is not None
        up = f"\x1b[{len(self.sizes)}F" if self._drawn else ""  # back to the first of our lines
        self.out.write(up + "".join(f"{self.line(i)}\x1b[K\n" for i in range(len(self.sizes))))
        self.out.flush()
        self._drawn, self._last = True, time.monotonic()

    def finish(self, elapsed: float) -> None:
        """The last redraw on a terminal, or the one summary line elsewhere."""
        if self.out is None:
            return
        if self.tty:
            self._draw()
            return
        done = sum(n for n, ok in zip(self.sizes, self.finished, strict=True) if ok)
        target, finished = sum(self.sizes), sum(self.finished)
        slowest = max((s for s, ok in zip(self.seconds, self.finished, strict=True) if s and ok), default=None)
        n = len(self.sizes)
        who = f"{n} children" if finished == n else f"{finished} of {n} children"
        self.out.write(
            f"oomguard verify: {who} touched {format_size(done)} of {format_size(target)} "
            f"in {elapsed:.1f}s ({_rate(done, slowest)})\n"
        )
        self.out.flush()


def _parse(line: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(line)
    except ValueError:
        return {}
    return msg if isinstance(msg, dict) else {}


def _number(msg: dict[str, Any], key: str) -> float | None:
    value = msg.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def collect(
    procs: list[subprocess.Popen[str]], progress: Progress, tick: Callable[[], None] | None = None
) -> list[dict[str, Any]]:
    """Each child's final JSON line ({} for none or garbage), showing progress lines meanwhile; *tick*
    is called between reads (at least once a second: ``verify`` samples the group's usage)."""
    final: list[dict[str, Any] | None] = [None] * len(procs)
    buffers = [b""] * len(procs)
    sel = selectors.DefaultSelector()
    for i, p in enumerate(procs):
        assert p.stdout is not None
        sel.register(p.stdout.fileno(), selectors.EVENT_READ, i)
    deadline = time.monotonic() + REPORT_TIMEOUT
    try:
        while sel.get_map() and (left := deadline - time.monotonic()) > 0:
            if tick is not None:
                tick()
            for key, _ in sel.select(timeout=min(left, 0.1 if tick is not None else 1.0)):
                i = key.data
                chunk = os.read(key.fd, 65536)
                buffers[i] += chunk
                *lines, buffers[i] = buffers[i].split(b"\n")
                for raw in lines:
                    msg = _parse(raw)
                    if "progress" in msg:
                        progress.update(i, int(_number(msg, "progress") or 0), _number(msg, "seconds"))
                    elif final[i] is None:
                        final[i] = msg
                if final[i] is not None or not chunk:
                    sel.unregister(key.fd)
    finally:
        sel.close()
    out = [msg or {} for msg in final]
    for i, msg in enumerate(out):
        if "touched" in msg:
            progress.touched(i, int(_number(msg, "touched") or 0), _number(msg, "seconds"))
    return out
