"""``oomguard agent`` and ``oomguard run --manager``: the worker side of the fleet manager (stdlib only)."""

from __future__ import annotations

import os
from typing import Any

from oomguard.agent.agent import default_node_name, default_spool_dir, run_agent, sanitize_node_name
from oomguard.agent.forwarder import EventForwarder
from oomguard.commands.flags import text
from oomguard.commands.plan import Values, shape_from_flags
from oomguard.errors import UsageError
from oomguard.units import parse_duration


def _token(values: Values) -> str:
    return text(values, "token") or os.environ.get("OOMGUARD_AGENT_TOKEN", "")


def _node(values: Values) -> str:
    name = text(values, "node")
    return sanitize_node_name(name) if name else default_node_name(dict(os.environ))


def agent_command(values: Values) -> int:
    from oomguard.cli import gpu_options
    from oomguard.policy.budget import probe
    from oomguard.policy.plan import make_plan

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


def forwarder(values: Values) -> EventForwarder | None:
    manager = text(values, "manager")
    if manager is None:
        return None
    return EventForwarder(
        manager, _token(values), _node(values), text(values, "spool") or default_spool_dir(dict(os.environ))
    )
