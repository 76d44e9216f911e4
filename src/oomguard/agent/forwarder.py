"""Supervisor events to the fleet manager: spooled at once (durable), sent by a background thread;
with *observe*, an exit's observation after it (``supervisor/observe.py``: ``run --profile``).

When the spool cannot take an event (disk full, removed, unwritable), the event waits in memory
(at most ``MEMORY_MAX``, the oldest dropped first) and the thread posts it directly after the
spooled ones; the supervisor never sees an error from its event sink.

When it has been handed nothing for ``heartbeat_s`` (60 s), the thread posts a heartbeat,
``{"event": "heartbeat", "time": ..., "interval_s": 60}``: a node known to the manager only from
these events (no agent) stays "run-only" (healthy) rather than "offline" while its supervisor
lives. A heartbeat is never spooled (a late one says nothing) nor written to ``--events`` (it is
made here, not by the supervisor); one the manager does not take is dropped, silently.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from oomguard.agent.client import Client
from oomguard.agent.sender import Sender
from oomguard.agent.spool import SpoolError, open_spool
from oomguard.nodes import sanitize_node_name
from oomguard.times import iso_now

MEMORY_MAX = 1000
HEARTBEAT_S = 60.0
HEARTBEAT_TIMEOUT_S = 2.0  # a heartbeat in flight holds close() back at most this long
WAKE_S = 30.0  # the thread retries what waits in the spool at least this often


class EventForwarder:
    """A sink for supervisor events: spooled at once (durable), sent by a background thread.

    Every envelope, heartbeats included, carries *labels* when there are any (``Sender.envelope``).
    ``BadParameter`` for a bad ``manager``, ``token`` or ``spool`` (the command line names the flag)."""

    def __init__(
        self,
        manager: str,
        token: str,
        node: str,
        spool_dir: str,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        labels: Mapping[str, str] | None = None,
        observe: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    ) -> None:
        self.sender = Sender(manager, token, open_spool(spool_dir), timeout=5.0, labels=labels)
        self._beats = Client(manager, token, timeout=HEARTBEAT_TIMEOUT_S)
        self.node = sanitize_node_name(node)
        if self.node != node:
            self.sender.log(f"node name {node!r} is not one the manager accepts: using {self.node!r}")
        self.memory: collections.deque[tuple[str, dict[str, Any]]] = collections.deque(maxlen=MEMORY_MAX)
        self.heartbeat_s = heartbeat_s  # a heartbeat after this long with nothing to send (<= 0: none)
        self.observe = observe  # an event's observation for the manager's recommender, if it makes one
        self.clock = time.monotonic
        self._last_sent = self.clock()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="oomguard-events", daemon=True)
        self._thread.start()

    def __call__(self, event: dict[str, Any]) -> None:
        self._put("event", self.sender.envelope(self.node, event=event))
        seen = self.observe(event) if self.observe is not None else None
        if seen is not None:  # after its exit event, in the spool's order
            self._put("observation", self.sender.envelope(self.node, observation=seen))
        self._last_sent = self.clock()  # sent by the thread now: as good as a heartbeat
        self._wake.set()

    def _put(self, kind: str, body: dict[str, Any]) -> None:
        try:
            self.sender.spool.put(kind, body)
        except SpoolError as e:
            self.sender.spool_trouble.trouble("spool", f"{e}; events wait in memory and are sent directly")
            self.memory.append((kind, body))

    def _timeout(self) -> float:
        """How long the thread may sleep: until the next heartbeat is due, at most WAKE_S."""
        if self.heartbeat_s <= 0:
            return WAKE_S
        return max(0.0, min(WAKE_S, self._last_sent + self.heartbeat_s - self.clock()))

    def _loop(self) -> None:
        while True:
            self._wake.wait(self._timeout())
            self._wake.clear()
            stopping = self._stop  # read before sending: what close() wakes us for is always sent
            self._send_all()
            if stopping:
                return
            if self.heartbeat_s > 0 and self.clock() - self._last_sent >= self.heartbeat_s:
                self._heartbeat()

    def _heartbeat(self) -> None:
        """Post a heartbeat directly (never spooled); whatever the answer, the next one is due later."""
        self._last_sent = self.clock()
        event = {"event": "heartbeat", "time": iso_now(), "interval_s": self.heartbeat_s}
        self._beats.post("event", self.sender.envelope(self.node, event=event))

    def _send_all(self) -> None:
        self.sender.flush()
        while self.memory:  # after the spooled ones (when the spool can be read at all)
            if self.sender.post(*self.memory[0]).later:
                return
            self.memory.popleft()  # delivered or refused: either way it is done

    def close(self, timeout: float = 5.0) -> None:
        """Try once more to deliver what is spooled (what is not stays for the agent): *timeout*
        seconds for that, after a heartbeat that may be in flight (``HEARTBEAT_TIMEOUT_S``)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout + HEARTBEAT_TIMEOUT_S)
