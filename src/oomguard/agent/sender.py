"""The sender: delivers spooled reports and events to the fleet manager, oldest first.

Every item is spooled first (nothing is lost if the agent dies mid-request), then the spool is
flushed in order. What each answer means is ``client.Outcome``; an item the manager refuses
(any 4xx but 408/429) or keeps failing with 5xx for too long moves to ``rejected/``
(``agent/rejected.py``) and the queue goes on, so one item never blocks the others. When the
spool itself fails (disk full, unreadable, removed), items are sent directly: only one the
manager does not take at once is lost, and said to be.

Each item ends with a *fate*: ``delivered``, ``spooled`` (waits for a later attempt), ``lost``
(neither spooled nor delivered), ``token``/``url``/``rejected`` (refused: 401/403, 404/405/3xx,
another 4xx) or ``gave-up`` (5xx for too long). ``--once`` turns the report's fate into its
exit code. The log says each failure episode once, not each attempt (``log.Episode``).

Every envelope (``envelope``) carries the node, a fresh id and, when there are any, the node's
``labels`` (``agent/labels.py``). A *deadline* (``time.monotonic()`` seconds, ``agent --once
--max-time``) bounds the delivery: each POST's time-out is cut to the time left, and once none is
left nothing more is posted (what waits stays spooled, as when the manager is unreachable).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from oomguard.agent.client import Client, Outcome
from oomguard.agent.log import Episode, one_line, stderr_log
from oomguard.agent.rejected import give_up
from oomguard.agent.spool import Spool, SpoolError, parse_name, read_item
from oomguard.times import iso_now

REFUSED = ("token", "url", "rejected")


class Sender:
    """Delivers spooled items to the manager, oldest first. ``BadParameter`` for a bad manager
    URL or token."""

    def __init__(
        self,
        manager: str,
        token: str,
        spool: Spool,
        *,
        timeout: float = 10.0,
        log: Callable[[str], None] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.client = Client(manager, token, timeout=timeout)
        self.labels = dict(labels or {})
        self.deadline: float | None = None  # time.monotonic() after which nothing more is posted
        self.manager = self.client.manager
        self.spool = spool
        self.log: Callable[[str], None] = log if log is not None else stderr_log
        self.trouble = Episode(self.log)  # the manager's answers
        self.spool_trouble = Episode(self.log)  # the spool directory
        self._flush_lock = threading.Lock()
        self._stuck: set[str] = set()  # items that could not be removed or moved: skipped from now on

    def post(self, kind: str, body: dict[str, Any]) -> Outcome:
        """One POST, no spool (``Client.post``), within the *deadline* when there is one."""
        if self.deadline is None:
            return self.client.post(kind, body)
        left = self.deadline - time.monotonic()
        if left <= 0:
            return Outcome("retry", None, "no time left (--max-time)")
        return self.client.post_within(kind, body, min(self.client.timeout, left))

    def envelope(self, node: str, **fields: Any) -> dict[str, Any]:
        """``{"node", "id", **fields}``, and ``labels`` when the node has any."""
        body = {"node": node, "id": uuid.uuid4().hex, **fields}
        if self.labels:
            body["labels"] = dict(self.labels)
        return body

    def pending(self) -> bool:
        """True when items wait in the spool (False when it cannot be read: nothing to retry)."""
        try:
            return any(p not in self._stuck for p in self.spool.pending())
        except SpoolError:
            return False

    # --- one item, spooled first ------------------------------------------------------------

    def send(self, kind: str, body: dict[str, Any]) -> str:
        """Spool *body*, then flush; *body*'s fate (see the module doc)."""
        try:
            path = self.spool.put(kind, body)
        except SpoolError as e:
            self.spool_trouble.trouble("spool", f"{e}; sending directly (what the manager does not take is lost)")
            self.flush()  # older items first, if they can still be read
            return self._send_direct(kind, body)
        self.spool_trouble.end(f"the spool {self.spool.directory} works again")
        fates = self._flush()[1]
        if path in fates:
            return fates[path]
        if _may_exist(path):
            return "spooled"
        moved = os.path.join(self.spool.rejected_dir, os.path.basename(path))
        return "rejected" if _may_exist(moved) else "delivered"  # by a concurrent flush

    def _send_direct(self, kind: str, body: dict[str, Any]) -> str:
        outcome = self.post(kind, body)
        what = f"{kind} {body.get('id', '?')}"
        if outcome.delivered:
            self._delivered_again(1, "item(s) sent directly")
            return "delivered"
        if outcome.later:
            self.trouble.trouble("unreachable", f"manager not reachable ({outcome.why}); the {what} is lost")
            self.trouble.count("item(s) lost (spool not writable)")
            return "lost"
        self._refused(outcome, what, None)
        return outcome.kind

    def report(self, node: str, report: dict[str, Any], interval_s: float | None) -> str:
        """Send a ``check`` report; its fate."""
        return self.send("report", self.envelope(node, report=report, interval_s=interval_s, time=iso_now()))

    def event(self, node: str, event: dict[str, Any]) -> str:
        """Send a supervisor event; its fate."""
        return self.send("event", self.envelope(node, event=event))

    # --- the queue ----------------------------------------------------------------------------

    def flush(self) -> bool:
        """Send spooled items oldest first until the spool is empty (True) or the manager asks
        to try later (False, order kept). Refused items move to ``rejected/``."""
        return self._flush()[0]

    def _flush(self) -> tuple[bool, dict[str, str]]:
        fates: dict[str, str] = {}
        with self._flush_lock:
            while True:
                try:
                    paths = [p for p in self.spool.pending() if p not in self._stuck and p not in fates]
                except SpoolError as e:
                    self.spool_trouble.trouble("spool", f"{e}; spooled items wait until it can be read")
                    return False, fates
                if not paths:
                    break
                for path in paths:
                    fates[path] = self._deliver(path)
                    if fates[path] == "spooled":
                        return False, fates
            delivered = sum(f == "delivered" for f in fates.values())
            if delivered:
                self._delivered_again(delivered)
            return True, fates

    def _delivered_again(self, delivered: int, what: str = "spooled item(s)") -> None:
        line = "manager reachable again" if self.trouble.kind == "unreachable" else "manager accepts items again"
        self.trouble.end(f"{line}; delivered {delivered} {what}")

    def _deliver(self, path: str) -> str:
        parsed = parse_name(os.path.basename(path))
        kind = parsed[1] if parsed is not None else "report"
        try:
            body = read_item(path)
        except FileNotFoundError:  # delivered by another process meanwhile
            return "delivered"
        except OSError as e:  # a FIFO, a device, a symbolic link, a directory, too large (spool.read_item)
            body, bad = None, f"unreadable spool file: {one_line(e.strerror or str(e), 120)}"
        except ValueError as e:
            body, bad = None, f"unreadable spool file: {one_line(str(e), 120)}"
        else:
            bad = "spool file is not a JSON object"
        if not isinstance(body, dict):
            self._move(path, {"reason": "unreadable", "status": None, "why": bad, "answer": ""})
            self.log(f"{os.path.basename(path)} will not be sent ({bad}); kept in {self.spool.rejected_dir}")
            return "rejected"
        outcome = self.post(kind, body)
        if outcome.delivered:
            self._done(path)
            return "delivered"
        if outcome.kind == "server":
            return self._server_error(path, outcome)
        if outcome.later:
            self._wait_trouble(outcome)
            return "spooled"
        self._refused(outcome, f"{kind} {os.path.basename(path)}", path)
        return outcome.kind

    def _server_error(self, path: str, outcome: Outcome) -> str:
        """Count a 5xx; give the item up (``rejected.give_up``) or keep it for later."""
        now = time.time()
        answers, first = self.spool.note_server_error(path, now)
        if not give_up(answers, first, now):
            self._wait_trouble(outcome)
            return "spooled"
        hours = (now - first) / 3600
        why = f"{answers} answers 5xx over {hours:.1f} h, the last {outcome.why}"
        where = self._move(path, _reason("gave-up", outcome, why, answers))
        self.log(f"gave up on {os.path.basename(path)} ({why}); kept in {where}")
        return "gave-up"

    def _wait_trouble(self, outcome: Outcome) -> None:
        what = "not reachable" if outcome.status is None else "busy or failing"
        n = sum(1 for _ in self._safe_pending())
        where = self.spool.directory
        self.trouble.trouble("unreachable", f"manager {what} ({outcome.why}); {n} item(s) spooled in {where}")

    def _safe_pending(self) -> list[str]:
        try:
            return self.spool.pending()
        except SpoolError:
            return []

    def _refused(self, outcome: Outcome, what: str, path: str | None) -> None:
        """Log a refusal (once per episode) and move the item, when spooled, to ``rejected/``."""
        if path is not None:
            where = self._move(path, _reason(outcome.kind, outcome, outcome.why, 1))
            self.trouble.count("item(s) moved to rejected/")
            kept = f"refused items are kept in {where}"
        else:
            self.trouble.count("item(s) refused and not kept (spool not writable)")
            kept = f"the {what} is not kept (the spool cannot be written)"
        if outcome.kind == "token":
            line = f"token refused by the manager ({outcome.why}): check --token, --token-file or OOMGUARD_AGENT_TOKEN"
        elif outcome.kind == "url":
            line = f"wrong manager URL: {self.client.manager} answered {outcome.why}: check --manager"
        else:
            line = f"manager rejected the {what} ({outcome.why})"
        self.trouble.trouble(outcome.kind, f"{line}; {kept}")

    def _move(self, path: str, reason: dict[str, Any]) -> str:
        try:
            return os.path.dirname(self.spool.reject(path, {**reason, "rejected_at": iso_now()}))
        except SpoolError as e:
            self._stuck.add(path)
            self.spool_trouble.trouble("spool", f"{e}; it stays in the spool and is skipped")
            return self.spool.directory

    def _done(self, path: str) -> None:
        try:
            self.spool.done(path)
        except SpoolError as e:
            self._stuck.add(path)  # delivered: sending it again would be harmless, but never ends
            self.spool_trouble.trouble("spool", f"{e}; delivered, skipped from now on")


def _may_exist(path: str) -> bool:
    """False only when *path* is known to be gone (a spool that cannot be read keeps its items)."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
    return True


def _reason(kind: str, outcome: Outcome, why: str, answers: int) -> dict[str, Any]:
    return {"reason": kind, "status": outcome.status, "why": why, "answer": outcome.body, "answers": answers}
