"""``oomguard agent`` and ``oomguard run --manager``: the worker side of the fleet manager (stdlib only)."""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any

from .agent import Sender, Spool, default_node_name, default_spool_dir, run_agent, sanitize_node_name
from .args import text
from .errors import UsageError
from .plan_cli import Values, shape_from_flags
from .units import parse_duration


def _token(values: Values) -> str:
    return text(values, "token") or os.environ.get("OOMGUARD_AGENT_TOKEN", "")


def _node(values: Values) -> str:
    name = text(values, "node")
    return sanitize_node_name(name) if name else default_node_name(dict(os.environ))


def agent_command(values: Values) -> int:
    from .api import probe
    from .cli import gpu_options
    from .plan import make_plan

    manager = text(values, "manager")
    if not manager:
        raise UsageError("agent: --manager URL is required (see 'oomguard agent --help')")
    interval = parse_duration(text(values, "interval") or "30s", "--interval")
    shape = shape_from_flags(values, required=False)
    gpu, gpu_timeout = gpu_options(values)

    def make_report() -> dict[str, Any]:
        report: dict[str, Any] = probe(
            budget=text(values, "budget"),
            margin=text(values, "margin"),
            gpu=gpu,  # type: ignore[assignment]
            gpu_timeout=gpu_timeout,
        )
        if shape is not None:
            report["plan"] = make_plan(report, shape)  # type: ignore[arg-type]
        return report

    try:
        return run_agent(
            manager=manager,
            token=_token(values),
            node=_node(values),
            interval=interval,
            once=bool(values.get("once")),
            spool_dir=text(values, "spool") or default_spool_dir(dict(os.environ)),
            make_report=make_report,
        )
    except ValueError as exc:
        raise UsageError(f"agent: {exc}") from None


class EventForwarder:
    """A sink for supervisor events: spooled at once (durable), sent by a background thread."""

    def __init__(self, manager: str, token: str, node: str, spool_dir: str) -> None:
        try:
            self.sender = Sender(manager, token, Spool(spool_dir), timeout=5.0)
        except ValueError as exc:
            raise UsageError(f"run: --manager: {exc}") from None
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


def forwarder(values: Values) -> EventForwarder | None:
    manager = text(values, "manager")
    if manager is None:
        return None
    return EventForwarder(
        manager, _token(values), _node(values), text(values, "spool") or default_spool_dir(dict(os.environ))
    )
