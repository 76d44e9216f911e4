"""The agent loop: a ``check`` report to the manager every interval, or once.

The loop says one start line (manager, node, interval, spool), then one line per failure
episode (``sender``), not one per attempt. Network and HTTP failures are not errors here: the
report waits in the spool and the loop retries it with backoff inside the interval; a refused
item moves to ``rejected/`` and the queue goes on; a failing spool means reporting directly.
``--once`` exits with the report's fate (``FATE_EXIT``): 0 only when it was delivered, 75 only
when it waits in the spool; with a gate event (``agent/gate.py``) after it, with the fate of the
first of the two that was not delivered. ``--max-time`` bounds what ``--once`` spends delivering.
In the loop, the gate event follows the first report made. An exception that escapes the report or the
wait (from the probe, or from the agent's own code) is an internal error, a bug: it is
logged with its full traceback on stderr and the loop goes on. After
``MAX_INTERNAL_ERRORS`` internal errors with no report made in between, the agent gives up
and exits ``EXIT_INTERNAL``, so that its supervisor (systemd, a container restart policy)
sees it and an operator reads the tracebacks. An ``OomguardError`` (a usage or input
error) is no bug: it propagates to the command line, which prints one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec

from oomguard.agent.log import one_line, stderr_log, stderr_traceback
from oomguard.agent.sender import Sender
from oomguard.agent.spool import open_spool
from oomguard.errors import (
    EXIT_INTERNAL,
    EXIT_LOST,
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_SPOOLED,
    EXIT_TOKEN_REFUSED,
    EXIT_WRONG_URL,
    BadParameter,
    OomguardError,
)
from oomguard.nodes import sanitize_node_name

# --once: the report's fate (sender.py) -> the exit code (errors.py's table)
FATE_EXIT = {
    "delivered": EXIT_OK,
    "spooled": EXIT_SPOOLED,
    "lost": EXIT_LOST,
    "token": EXIT_TOKEN_REFUSED,
    "url": EXIT_WRONG_URL,
    "rejected": EXIT_REJECTED,
    "gave-up": EXIT_REJECTED,
}
MAX_INTERNAL_ERRORS = 5  # internal errors with no report made in between: the agent exits EXIT_INTERNAL

_P = ParamSpec("_P")


class _InternalErrors:
    """Counts internal errors since the last delivered (or spooled) report; logs each one's
    one-line summary and its traceback."""

    def __init__(self, emit: Callable[[str], None], limit: int = MAX_INTERNAL_ERRORS) -> None:
        self.emit = emit
        self.limit = limit
        self.in_a_row = 0

    def attempt(self, what: str, action: Callable[_P, object], *args: _P.args, **kwargs: _P.kwargs) -> bool:
        """Run *action*; False (logged, counted) when it raised anything but an OomguardError."""
        try:
            action(*args, **kwargs)
        except OomguardError:
            raise
        except Exception as exc:
            self.in_a_row += 1
            summary = one_line(f"{type(exc).__name__}: {exc}", 300)
            self.emit(f"internal error in the {what} ({self.in_a_row} of {self.limit} in a row): {summary}")
            stderr_traceback(exc)
            return False
        return True

    @property
    def exhausted(self) -> bool:
        return self.in_a_row >= self.limit


def _report(
    sender: Sender,
    node: str,
    make_report: Callable[[], dict[str, Any]],
    interval: float,
    then: list[dict[str, Any]],
) -> None:
    """One report; then the events of *then* (the gate's, once), emptied as they are sent."""
    sender.report(node, make_report(), interval)
    while then:
        sender.event(node, then.pop(0))


def _once(sender: Sender, node: str, report: dict[str, Any], interval: float, then: list[dict[str, Any]]) -> int:
    """``--once``: the report, then the events of *then*; the fate of the first not delivered."""
    fates = [sender.report(node, report, interval if interval > 0 else None)]
    fates += [sender.event(node, event) for event in then]
    return next((FATE_EXIT[fate] for fate in fates if fate != "delivered"), EXIT_OK)


def _wait(sender: Sender, interval: float, spent: float, sleep: Callable[[float], None]) -> None:
    """Sleep out the rest of the interval; while items wait in the spool, retry them with
    backoff (1 s, doubling, capped at the interval)."""
    remaining = interval - spent
    delay = 1.0
    while remaining > 0:
        if not sender.pending():
            sleep(remaining)
            return
        step = min(delay, remaining)
        sleep(step)
        remaining -= step
        if remaining <= 0:
            return  # the next cycle's report flushes anyway
        t0 = time.monotonic()
        sender.flush()
        remaining -= time.monotonic() - t0
        delay = min(delay * 2, interval)


def _loop(
    sender: Sender,
    *,
    node: str,
    interval: float,
    make_report: Callable[[], dict[str, Any]],
    sleep: Callable[[float], None],
    max_cycles: int | None,
    then: list[dict[str, Any]],
) -> int:
    errors = _InternalErrors(sender.log)
    cycles = 0
    while max_cycles is None or cycles < max_cycles:
        t0 = time.monotonic()
        if errors.attempt("report", _report, sender, node, make_report, interval, then):
            errors.in_a_row = 0  # a report made it to the manager or the spool
        cycles += 1
        if errors.exhausted or cycles == max_cycles:
            break
        if not errors.attempt("wait between reports", _wait, sender, interval, time.monotonic() - t0, sleep):
            sleep(max(0.0, interval - (time.monotonic() - t0)))  # never spin on a failing wait
        if errors.exhausted:
            break
    if errors.exhausted:
        sender.log(f"giving up after {errors.in_a_row} internal errors in a row (tracebacks above)")
        return EXIT_INTERNAL
    return EXIT_OK


def run_agent(
    *,
    manager: str,
    token: str,
    node: str,
    interval: float,
    once: bool,
    spool_dir: str,
    make_report: Callable[[], dict[str, Any]],
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] | None = None,
    max_cycles: int | None = None,
    labels: Mapping[str, str] | None = None,
    gate: dict[str, Any] | None = None,
    max_time: float | None = None,
) -> int:
    """Report to the manager once or every *interval* seconds; returns the exit code.

    *node* is sanitized (``oomguard.nodes``; a changed name is said once); every envelope carries
    *labels* when there are any. *gate* (``agent.gate.gate_event``) is sent after the first report.
    *once*: the fate of the report (and then of *gate*) as ``FATE_EXIT`` says, delivered within
    *max_time* seconds when given (what is not stays spooled); a failing *make_report* raises;
    the report's ``interval_s`` is *interval* when > 0 (a cron period), else null. Else every
    *interval* until *max_cycles* (None: for ever): ``EXIT_OK``, or ``EXIT_INTERNAL`` after
    ``MAX_INTERNAL_ERRORS`` internal errors in a row (logged with their tracebacks).
    ``BadParameter`` for a bad ``manager``, ``token``, ``interval``, ``max_time`` or ``spool``
    (the command line names the flag).
    """
    if not once and not interval > 0:
        raise BadParameter("interval", f"the report interval must be > 0 seconds, got {interval:g}")
    if max_time is not None and not (once and max_time > 0):
        raise BadParameter("max_time", "bounds --once only, and must be > 0 seconds")
    emit = log if log is not None else stderr_log
    sender = Sender(manager, token, open_spool(spool_dir), log=emit, labels=labels)
    clean = sanitize_node_name(node)
    if clean != node:
        emit(f"node name {node!r} is not one the manager accepts: using {clean!r}")
    then = [gate] if gate is not None else []
    if once:
        report = make_report()
        if max_time is not None:
            sender.deadline = time.monotonic() + max_time
        return _once(sender, clean, report, interval, then)
    shown = ", ".join(f"{k}={v}" for k, v in sorted(sender.labels.items()))
    where = f"spool {spool_dir}" + (f"; labels {shown}" if shown else "")
    emit(f"reporting to {sender.manager} as node {clean} every {interval:g}s ({where})")
    return _loop(
        sender, node=clean, interval=interval, make_report=make_report, sleep=sleep, max_cycles=max_cycles, then=then
    )
