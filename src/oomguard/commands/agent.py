"""``oomguard agent`` and ``oomguard run --manager``: the worker side of the fleet manager (stdlib only)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
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
NODE_CLASS_HELP = (
    "this node's class for what the fleet learns (the label node_class; also OOMGUARD_NODE_CLASS): nodes "
    "of one class share their lessons; without one the manager derives it from the GPU model and host RAM"
)
LABEL_HELP = (
    "a label of this node, repeatable; also OOMGUARD_LABELS=KEY=VALUE,..., and CONTAINER_ID, "
    "VAST_CONTAINERLABEL, K8S_NODE_NAME when set (docs/agent.md)"
)


def add_fleet_options(parser: argparse.ArgumentParser, *, run: bool) -> None:
    """--manager, --token, --token-file, --node, --label, --spool: for ``agent`` (the command's own) or
    ``run --manager``."""
    group = parser.add_argument_group("fleet manager options")
    if run:
        flags.option(
            group, "--manager", "also send events to the fleet manager at URL (spooled when it is down)", "URL"
        )
        flags.add_token(group, "bearer token for --manager")
        flags.option(
            group, "--node", "node name for --manager (default: VAST_CONTAINERLABEL, then the hostname)", "NAME"
        )
        flags.option(
            group, "--label", LABEL_HELP.replace("a label", "for --manager: a label"), "KEY=VALUE", action="append"
        )
        flags.option(group, "--node-class", NODE_CLASS_HELP, "CLASS")
        flags.option(group, "--spool", f"spool directory for --manager (default: {SPOOL_DEFAULT})", "DIR")
        return
    flags.option(group, "--manager", "the manager's base URL, e.g. http://manager:8080 (or OOMGUARD_MANAGER)", "URL")
    flags.add_token(group, "agent bearer token")
    flags.option(
        group, "--node", "node name (or OOMGUARD_NODE; default: VAST_CONTAINERLABEL, then the hostname)", "NAME"
    )
    flags.option(group, "--label", LABEL_HELP, "KEY=VALUE", action="append")
    flags.option(group, "--node-class", NODE_CLASS_HELP, "CLASS")
    flags.option(group, "--interval", "time between reports (default 30s)", "DURATION")
    flags.option(
        group,
        "--once",
        f"send one report and exit: {EXIT_OK} delivered, {EXIT_SPOOLED} spooled for later, "
        f"{EXIT_TOKEN_REFUSED} token refused, {EXIT_WRONG_URL} wrong URL, {EXIT_REJECTED} rejected, "
        f"{EXIT_LOST} lost (not spooled, not delivered); with --gate, the first of report and event not delivered",
    )
    flags.option(
        group,
        "--max-time",
        f"with --once: deliver within DURATION (each POST's time-out included); what is not delivered by then "
        f"stays in the spool (exit {EXIT_SPOOLED})",
        "DURATION",
    )
    flags.option(group, "--spool", f"spool directory (default: {SPOOL_DEFAULT})", "DIR")


def _gate_options(parser: argparse.ArgumentParser) -> None:
    from oomguard.agent.gate import MESSAGE_MAX, STEPS

    group = parser.add_argument_group("gate options (deploy/worker/entrypoint.sh; docs/agent.md)")
    flags.option(
        group,
        "--gate",
        "also send a gate event, after the report (with --once) or the first report: how the gate's step "
        "STEP (check, plan or verify: the one that failed, or the last one when all passed) came out",
        "STEP",
        type=flags.OneOf(STEPS),
    )
    flags.option(group, "--gate-exit", "the step's exit status (default 0: the gate passed)", "N")
    flags.option(
        group,
        "--gate-message",
        "what the step said: one line, or its stderr, of which the last 'oomguard: error:' line (else the step's "
        f"own last line) is sent; at most {MESSAGE_MAX} characters (default: the exit status in words)",
        "TEXT",
    )


def _consumer_options(parser: argparse.ArgumentParser) -> None:
    from oomguard.agent.consumers import MAX_BYTES, TIMEOUT_S

    group = parser.add_argument_group("consumer options (docs/agent.md)")
    flags.option(
        group,
        "--cuzk-status",
        "also poll CuZK's status server (its [daemon] status_listen, e.g. http://127.0.0.1:9821; the path "
        f"defaults to /status) before each report, and send CuZK's own budget and use beside the kernel's view "
        f"(the report's consumers; within {TIMEOUT_S:g}s and {MAX_BYTES >> 20} MiB, else the reason, never a guess)",
        "URL",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "%(prog)s --manager URL [--token-file FILE] [--node NAME] [--label KEY=VALUE]... [--interval 30s] "
        "[--once [--max-time DURATION]] [--spool DIR] [--gate STEP [--gate-exit N] [--gate-message TEXT]] "
        "[--cuzk-status URL]"
    )
    parser.description = SUMMARY
    parser.epilog = (
        "With plan flags the report carries the plan (concurrency, memlock need) too.\n"
        + flags.DURATIONS
        + "\n"
        + flags.ENVIRONMENT
    )
    add_fleet_options(parser, run=False)
    _gate_options(parser)
    _consumer_options(parser)
    flags.add_budget(parser, root=False)
    flags.add_shape(parser)
    flags.add_gpu(parser)


def _token(args: argparse.Namespace) -> str:
    """The token, checked (``flags.token_from``: --token, --token-file, then OOMGUARD_AGENT_TOKEN)."""
    return flags.token_from(args)


def _node(args: argparse.Namespace) -> str:
    """--node as given (``run_agent`` and ``EventForwarder`` sanitize it and say so), else
    ``OOMGUARD_NODE``, else the default."""
    from oomguard.agent import default_node_name

    return flags.value(args, "node") or os.environ.get("OOMGUARD_NODE") or default_node_name(dict(os.environ))


def _spool(args: argparse.Namespace) -> str:
    from oomguard.agent import default_spool_dir

    return flags.value(args, "spool") or default_spool_dir(dict(os.environ))


def _labels(args: argparse.Namespace) -> dict[str, str]:
    """The environment's labels, ``OOMGUARD_LABELS``', ``--label``'s and ``--node-class`` (``agent.labels``)."""
    from oomguard.agent import node_labels

    return node_labels(os.environ, getattr(args, "label", None) or (), flags.value(args, "node_class"))


def _gate(args: argparse.Namespace) -> dict[str, Any] | None:
    """The gate event ``--gate``, ``--gate-exit`` and ``--gate-message`` ask for, or None."""
    from oomguard.agent import gate_event

    if args.gate is None:
        flags.needs(args, "--gate STEP", ("--gate-exit", "--gate-message"))
        return None
    code = flags.parse_count(args.gate_exit, "--gate-exit") if args.gate_exit is not None else 0
    if code > 255:
        raise UsageError(f"--gate-exit: an exit status is 0-255, got {args.gate_exit!r}")
    return gate_event(args.gate, code, args.gate_message or "")


def execute(args: argparse.Namespace) -> int:
    """Report once (``--once``) or every ``--interval``; only oomguard's own usage errors exit 2."""
    from oomguard.agent import run_agent
    from oomguard.agent.consumers import check_status_url, poll_cuzk
    from oomguard.policy.plan import make_plan
    from oomguard.units import parse_duration

    if not args.manager:  # nor OOMGUARD_MANAGER (cli.parse applied the variables: commands/envflags.py)
        raise UsageError("agent: --manager URL (or OOMGUARD_MANAGER) is required (see 'oomguard agent --help')")
    token = _token(args)  # a usage error before anything is probed
    interval = parse_duration(args.interval or "30s", "--interval")
    max_time = parse_duration(args.max_time, "--max-time") if args.max_time is not None else None
    shape = flags.shape_from(args, required=False)
    labels, gate = _labels(args), _gate(args)
    cuzk = check_status_url(args.cuzk_status) if args.cuzk_status is not None else None

    def make_report() -> dict[str, Any]:
        report = flags.probe_from(args)
        if shape is not None:
            report["plan"] = make_plan(report, shape)
        if cuzk is not None:  # CuZK's own view, beside the kernel's (agent/consumers.py)
            report["consumers"] = [poll_cuzk(cuzk)]
        return dict(report)

    return run_agent(
        manager=args.manager,
        token=token,
        node=_node(args),
        interval=interval,
        once=args.once,
        spool_dir=_spool(args),
        make_report=make_report,
        labels=labels,
        gate=gate,
        max_time=max_time,
    )


def forwarder(
    args: argparse.Namespace, observe: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
) -> EventForwarder | None:
    """The event sink for ``run --manager`` (with *observe*: each exit's observation after it), or
    None without ``--manager``."""
    manager = flags.value(args, "manager")
    if manager is None:
        return None
    from oomguard.agent import EventForwarder

    return EventForwarder(manager, _token(args), _node(args), _spool(args), labels=_labels(args), observe=observe)
