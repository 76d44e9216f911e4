"""Supervisor events to the fleet manager: spooled at once (durable), sent by a background thread."""

from __future__ import annotations

import threading
import uuid
from typing import Any

from oomguard.agent.sender import Sender
from oomguard.agent.spool import open_spool


class EventForwarder:
    """A sink for supervisor events: spooled at once (durable), sent by a background thread.

    ``UsageError`` naming the flag for a bad ``--manager``, ``--token`` or ``--spool``."""

    def __init__(self, manager: str, token: str, node: str, spool_dir: str) -> None:
        self.sender = Sender(manager, token, open_spool(spool_dir), timeout=5.0)
        self.node = node
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="oomguard-events", daemon=True)
        self._thread.start()

    def __call__(self, event: dict[str, Any]) -> None:
        self.sender.spool.put("event", {"node": self.node, "id": uuid.uuid4().hex, "event": event})
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop:
            self._wake.wait(30)
            self._wake.clear()
            self.sender.flush()

    def close(self, timeout: float = 5.0) -> None:
        """Try once more to deliver what is spooled (what is not stays for the agent)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)
