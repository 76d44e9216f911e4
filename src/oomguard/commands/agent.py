"""``oomguard agent`` and ``oomguard run --manager``: the worker side of the fleet manager (stdlib only)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from oomguard.commands import flags
from oomguard.errors import (
    EXIT_LOST,
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_SPOOLED,
    EXIT_TOKEN_REFUSED,
    EXIT_WRONG_URL,
    UsageError,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard.agent import EventForwarder

SUMMARY = (
    "Send this node's check report to the fleet manager every --interval (standard library only). "
    "When the manager cannot be reached or answers 5xx, reports wait in a durable spool and are "
    "replayed in order; each carries an id, so a retry is never stored twice. A report the manager "
    "refuses (4xx) moves to the spool's rejected/ and the queue goes on."
)
SPOOL_DEFAULT = "$OOMGUARD_SPOOL, $XDG_STATE_HOME/oomguard/spool, ~/.local/state/oomguard/spool"


def add_fleet_options(parser: argparse.ArgumentParser, *, run: bool) -> None:
    """--manager, --token, --node, --spool: for ``agent`` (the command's own) or ``run --manager``."""
    group = parser.add_argument_group("fleet manager options")
    if run:
        flags.option(
            group, "--manager", "also send events to the fleet manager at URL (spooled when it is down)", "URL"
        )
        flags.option(group, "--token", "bearer token for --manager (or OOMGUARD_AGENT_TOKEN)", "TOKEN")
        flags.option(
            group, "--node", "node name for --manager (default: VAST_CONTAINERLABEL, then the hostname)", "NAME"
        )
        flags.option(group, "--spool", f"spool directory for --manager (default: {SPOOL_DEFAULT})", "DIR")
        return
    flags.option(group, "--manager", "the manager's base URL, e.g. http://manager:8080", "URL")
    flags.option(group, "--token", "agent bearer token (or OOMGUARD_AGENT_TOKEN)", "TOKEN")
    flags.option(group, "--node", "node name (default: VAST_CONTAINERLABEL, then the hostname)", "NAME")
    flags.option(group, "--interval", "time between reports (default 30s)", "DURATION")
    flags.option(
        group,
        "--once",
        f"send one report and exit: {EXIT_OK} delivered, {EXIT_SPOOLED} spooled for later, "
        f"{EXIT_TOKEN_REFUSED} token refused, {EXIT_WRONG_URL} wrong URL, {EXIT_REJECTED} rejected, "
        f"{EXIT_LOST} lost (not spooled, not delivered)",
    )
    flags.option(group, "--spool", f"spool directory (default: {SPOOL_DEFAULT})", "DIR")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = "%(prog)s --manager URL [--token T] [--node NAME] [--interval 30s] [--once] [--spool DIR]"
    parser.description = SUMMARY
    parser.epilog = "With plan flags the report carries the plan (concurrency, memlock need) too.\n" + flags.DURATIONS
    add_fleet_options(parser, run=False)
    flags.add_budget(parser, root=False)
    flags.add_shape(parser)
    flags.add_gpu(parser)


def _token(args: argparse.Namespace) -> str:
    return flags.value(args, "token") or os.environ.get("OOMGUARD_AGENT_TOKEN", "")


def _node(args: argparse.Namespace) -> str:
    """--node as given (``run_agent`` and ``EventForwarder`` sanitize it and say so), else the default."""
    from oomguard.agent import default_node_name

    return flags.value(args, "node") or default_node_name(dict(os.environ))


def _spool(args: argparse.Namespace) -> str:
    from oomguard.agent import default_spool_dir

    return flags.value(args, "spool") or default_spool_dir(dict(os.environ))


def execute(args: argparse.Namespace) -> int:
    """Report once (``--once``) or every ``--interval``; only oomguard's own usage errors exit 2."""
    from oomguard.agent import run_agent
    from oomguard.policy.plan import make_plan
    from oomguard.units import parse_duration

    if not args.manager:
        raise UsageError("agent: --manager URL is required (see 'oomguard agent --help')")
    interval = parse_duration(args.interval or "30s", "--interval")
    shape = flags.shape_from(args, required=False)

    def make_report() -> dict[str, Any]:
        report = flags.probe_from(args)
        if shape is not None:
            report["plan"] = make_plan(report, shape)
        return dict(report)

    return run_agent(
        manager=args.manager,
        token=_token(args),
        node=_node(args),
        interval=interval,
        once=args.once,
        spool_dir=_spool(args),
        make_report=make_report,
    )


def forwarder(args: argparse.Namespace) -> EventForwarder | None:
    """The event sink for ``run --manager``, or None without ``--manager``."""
    manager = flags.value(args, "manager")
    if manager is None:
        return None
    from oomguard.agent import EventForwarder

    return EventForwarder(manager, _token(args), _node(args), _spool(args))
