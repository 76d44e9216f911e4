"""Supervisor events to the fleet manager: spooled at once (durable), sent by a background thread.

When the spool cannot take an event (disk full, removed, unwritable), the event waits in memory
(at most ``MEMORY_MAX``, the oldest dropped first) and the thread posts it directly after the
spooled ones; the supervisor never sees an error from its event sink.
"""

from __future__ import annotations

import collections
import threading
import uuid
from typing import Any

from oomguard.agent.sender import Sender
from oomguard.agent.spool import SpoolError, open_spool
from oomguard.nodes import sanitize_node_name

MEMORY_MAX = 1000


class EventForwarder:
    """A sink for supervisor events: spooled at once (durable), sent by a background thread.

    ``UsageError`` naming the flag for a bad ``--manager``, ``--token`` or ``--spool``."""

    def __init__(self, manager: str, token: str, node: str, spool_dir: str) -> None:
        self.sender = Sender(manager, token, open_spool(spool_dir), timeout=5.0)
        self.node = sanitize_node_name(node)
        if self.node != node:
            self.sender.log(f"node name {node!r} is not one the manager accepts: using {self.node!r}")
        self.memory: collections.deque[dict[str, Any]] = collections.deque(maxlen=MEMORY_MAX)
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="oomguard-events", daemon=True)
        self._thread.start()

    def __call__(self, event: dict[str, Any]) -> None:
        body = {"node": self.node, "id": uuid.uuid4().hex, "event": event}
        try:
            self.sender.spool.put("event", body)
        except SpoolError as e:
            self.sender.spool_trouble.trouble("spool", f"{e}; events wait in memory and are sent directly")
            self.memory.append(body)
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait(30)
            self._wake.clear()
            stopping = self._stop  # read before sending: what close() wakes us for is always sent
            self._send_all()
            if stopping:
                return

    def _send_all(self) -> None:
        self.sender.flush()
        while self.memory:  # after the spooled ones (when the spool can be read at all)
            if self.sender.post("event", self.memory[0]).later:
                return
            self.memory.popleft()  # delivered or refused: either way it is done

    def close(self, timeout: float = 5.0) -> None:
        """Try once more to deliver what is spooled (what is not stays for the agent)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)
