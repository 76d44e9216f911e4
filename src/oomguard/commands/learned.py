"""``--learned`` on ``plan`` and ``run``: the profile's jobs at the size the fleet manager learned.

The flags here, and ``learner(args)``: a function of (declared shape, report) to (the shape to
plan with, the decision), asked before each plan (``run``: before each start, so a floor the
manager raised after this node's OOM kill is taken at the next start). The rule is
``oomguard.policy.learned``; the fetch and the answer kept on disk, ``oomguard.agent.learned``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from oomguard.commands import flags
from oomguard.errors import BadParameter, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Report
    from oomguard.policy.plan import Shape

Learner = Callable[["Shape", "Report"], "tuple[Shape, dict[str, Any]]"]
LEARNED_HELP = (
    "plan the profile's jobs at the size the fleet manager learned (--manager, --token-file, --node); when the "
    "manager cannot answer, the answer kept in --spool from before, else the declared size. Never below the "
    "declared size (raise-only) and never above this node's ceiling; said in the plan, or run's start event"
)


def add_learned(parser: argparse.ArgumentParser, *, fleet: bool) -> None:
    """--learned and --learned-may-lower; with *fleet*, the manager options they need as well
    (``plan``; ``run`` has them from its fleet manager options)."""
    group = parser.add_argument_group("learned size options (docs/plan.md#learned-sizes)")
    flags.option(group, "--learned", LEARNED_HELP)
    flags.option(group, "--learned-may-lower", "with --learned: take a learned size below the declared one too")
    if fleet:
        from oomguard.commands.agent import SPOOL_DEFAULT

        flags.option(group, "--manager", "the fleet manager's base URL, for --learned", "URL")
        flags.add_token(group, "bearer token for --manager")
        from oomguard.commands.agent import NODE_CLASS_HELP

        flags.option(group, "--node", "node name (default: VAST_CONTAINERLABEL, then the hostname)", "NAME")
        flags.option(group, "--node-class", NODE_CLASS_HELP, "CLASS")
        flags.option(group, "--spool", f"where the last answer is kept (default: {SPOOL_DEFAULT})", "DIR")


def learner(args: argparse.Namespace, shape: Shape | None) -> Learner | None:
    """What ``--learned`` asks for, or None without it; ``UsageError`` for what it lacks."""
    if not getattr(args, "learned", False):
        flags.needs(args, "--learned", ("--learned-may-lower",))
        return None
    if shape is None or shape.profile is None:
        raise UsageError("--learned needs --profile NAME: the manager learns per profile")
    manager = flags.value(args, "manager")
    if manager is None:
        raise UsageError("--learned needs --manager URL")
    from oomguard.agent.client import check_manager
    from oomguard.commands.agent import _labels, _node, _spool, _token
    from oomguard.labels import CLASS_LABEL

    try:
        manager = check_manager(manager)
    except BadParameter as exc:
        raise UsageError(flags.flag_message(exc)) from None
    token = _token(args)  # checked; UsageError naming --token, --token-file or the variable
    node, spool, may_lower = _node(args), _spool(args), bool(args.learned_may_lower)
    node_class = _labels(args).get(CLASS_LABEL)  # the operator's; None: the one the manager knows

    def learn(declared: Shape, report: Report) -> tuple[Shape, dict[str, Any]]:
        from oomguard.agent.learned import learned_shape

        return learned_shape(
            declared,
            manager=manager,
            token=token,
            node=node,
            spool=spool,
            report=report,
            may_lower=may_lower,
            node_class=node_class,
        )

    return learn
