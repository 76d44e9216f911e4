"""Items that leave the queue undelivered: ``rejected/``, and the 5xx counters that lead there.

A 4xx other than 408/429 means the manager will never take the item: it moves at once to
``<spool>/rejected/`` with ``<name>.why`` beside it, a JSON object::

    {"reason": "token"|"url"|"rejected"|"gave-up"|"unreadable", "status": 401 | null,
     "why": "401 Unauthorized: bad token", "answer": "<the answer's body, at most 500 chars>",
     "answers": 1, "rejected_at": "2025-01-01T00:00:00Z"}

To send such items again (after fixing the token, say), move the ``.json`` files back into the
spool directory: they are replayed in their original order.

A 5xx means "not now", but a manager that never takes one item must not block the queue
behind it for ever. Its 5xx answers are counted in ``<name>.retry`` (``{"answers", "first"}``),
and the item is given up (``reason: "gave-up"``) once they span ``GIVE_UP_MIN_S`` (1 hour) and
number ``GIVE_UP_ANSWERS`` (20), or span ``GIVE_UP_MAX_S`` (24 hours) whatever their number.
The hour is what keeps an outage of the manager (5xx for everything) from emptying the queue:
only the head of the queue is tried, so an outage moves at most one item an hour.
Connection failures, timeouts, 408 and 429 say nothing about the item and are not counted.

Both files are read and written as regular files only (``sources/files.py``): a FIFO or a symbolic
link named like one is never waited on or followed.

``rejected/`` keeps the newest ``REJECTED_KEEP`` items (a wrong token on a 30 s agent rejects
2,880 reports a day).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from typing import Any

from oomguard.sources.files import loads_json, read_bounded, write_regular

GIVE_UP_ANSWERS = 20
GIVE_UP_MIN_S = 3600.0
GIVE_UP_MAX_S = 86400.0
REJECTED_KEEP = 10_000
WHY_SUFFIX = ".why"
_RETRY_MAX_BYTES = 4096  # {"answers": 20, "first": 1700000000.0} is 40 bytes


def give_up(answers: int, first: float, now: float) -> bool:
    """True when an item answered 5xx *answers* times since *first* (epoch seconds) is given up."""
    elapsed = max(0.0, now - first)  # a clock set back never makes an item older
    return elapsed >= GIVE_UP_MAX_S or (answers >= GIVE_UP_ANSWERS and elapsed >= GIVE_UP_MIN_S)


def read_retry(path: str) -> tuple[int, float] | None:
    """``(answers, first)`` from a ``.retry`` file; None when it is missing or not one."""
    try:
        state = loads_json(read_bounded(path, _RETRY_MAX_BYTES, follow=False))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    answers, first = state.get("answers"), state.get("first")
    if type(answers) is not int or not isinstance(first, (int, float)) or isinstance(first, bool):
        return None
    if answers < 0 or not math.isfinite(first):
        return None
    return answers, float(first)


def write_retry(path: str, answers: int, first: float) -> None:
    """Write a ``.retry`` file (a temp file renamed: a crash leaves the old one or the new one).
    Not fsynced and never an error: losing a counter only restarts it."""
    tmp = f"{path}.tmp"
    with contextlib.suppress(OSError):
        write_regular(tmp, json.dumps({"answers": answers, "first": first}).encode())
        os.replace(tmp, path)


def move_to_rejected(path: str, rejected_dir: str, reason: dict[str, Any]) -> str:
    """Write ``<name>.why`` (JSON *reason*) in *rejected_dir*, then move *path* there; the new
    path. ``OSError`` when that fails (the item then stays where it was)."""
    os.makedirs(rejected_dir, mode=0o700, exist_ok=True)
    name = os.path.basename(path)
    why = os.path.join(rejected_dir, name + WHY_SUFFIX)
    with contextlib.suppress(FileNotFoundError):  # a FIFO or a link in its place: the new file replaces it
        if not os.path.isfile(why) or os.path.islink(why):
            os.unlink(why)
    write_regular(why, (json.dumps(reason, sort_keys=True) + "\n").encode("utf-8"), 0o644)
    target = os.path.join(rejected_dir, name)
    with contextlib.suppress(FileNotFoundError):  # else another process dealt with it
        os.replace(path, target)
    _prune(rejected_dir)
    return target


def _prune(rejected_dir: str, keep: int = REJECTED_KEEP) -> None:
    """Remove the oldest rejected items (and their ``.why``) beyond the newest *keep*."""
    try:
        names = sorted(n for n in os.listdir(rejected_dir) if n.endswith(".json"))
    except OSError:
        return
    for name in names[: max(0, len(names) - keep)]:
        for victim in (name, name + WHY_SUFFIX):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(rejected_dir, victim))
