"""``oomguard verify``: allocate the plan for real in child processes: delivered or not."""

from __future__ import annotations

import argparse
import sys

from oomguard.commands import flags
from oomguard.errors import EXIT_OK, EXIT_THRESHOLD, EXIT_VERIFY_FAILED, UsageError
from oomguard.verify.shares import DEFAULT_CHILDREN, MAX_CHILDREN

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Report
    from oomguard.policy.plan import Shape

SUMMARY = (
    "Prove the machine delivers the plan: allocate and touch baseline + jobs x per-job memory "
    "(or the whole budget) in at most --children child processes, hold it, and report peak, "
    "fault-in speed and OOM kills."
)
USAGE = "%(prog)s [--json] [shape options] [budget options] [--fraction F] [--hold SECONDS] [--children N]"
# --children: the default is the CPUs verify may use, at most 8 (verify/shares.py says why:
# faulting pages in is CPU work, each child is a ~10 MiB interpreter and a PID); the cap keeps
# a typo from becoming the fork bomb of issue #37 (one child per job: 1,364 children, +5.3 GB).
CHILDREN_HELP = (
    "allocate in at most N child processes, 1..{cap}, each holding several jobs' memory "
    "(default: the CPUs verify may use, at most {default})"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    parser.description = SUMMARY
    parser.epilog = (
        f"Exit {EXIT_OK} when the memory was delivered, {EXIT_VERIFY_FAILED} when not "
        f"(an OOM kill, a failed allocation or a child that could not start), "
        f"{EXIT_THRESHOLD} when the plan fits no job (nothing is allocated).\n" + flags.SIZES
    )
    flags.add_json(parser)
    flags.option(parser, "--fraction", "verify only this part of the target, 0 < F <= 1 (default 1)", "F")
    flags.option(parser, "--hold", "how long to hold the memory once touched: a duration (default 3s)", "SECONDS")
    flags.option(parser, "--children", CHILDREN_HELP.format(cap=MAX_CHILDREN, default=DEFAULT_CHILDREN), "N")
    flags.add_shape(parser)
    flags.add_budget(parser)
    flags.add_gpu(parser)


def _refuse_an_empty_plan(report: Report, shape: Shape) -> None:
    """A plan that fits 0 jobs has nothing to verify: say so (exit 3) instead of "delivered 0 B"."""
    from oomguard.errors import ThresholdError
    from oomguard.policy.plan import make_plan

    plan = make_plan(report, shape)
    if plan["concurrency"] == 0:
        raise ThresholdError(f"verify: the plan fits 0 jobs ({plan['explanation']}): nothing to verify")


def parse_children(text: str) -> int:
    """--children N: a whole number from 1 to ``MAX_CHILDREN``; ``UsageError`` (exit 2) otherwise."""
    n = flags.parse_count(text, "--children")
    if not 1 <= n <= MAX_CHILDREN:
        raise UsageError(f"--children: must be from 1 to {MAX_CHILDREN}, got {text!r}")
    return n


def execute(args: argparse.Namespace) -> int:
    from oomguard.units import parse_duration
    from oomguard.verify.runner import format_verify, verify

    fraction = flags.parse_number(args.fraction, "--fraction") if args.fraction else 1.0
    if fraction > 1:
        raise UsageError(f"--fraction: must be at most 1, got {args.fraction!r}")
    hold = parse_duration(args.hold, "--hold") if args.hold is not None else 3.0
    children = parse_children(args.children) if args.children is not None else None
    shape = flags.shape_from(args, required=False)
    report = flags.probe_from(args)
    if shape is not None:
        _refuse_an_empty_plan(report, shape)
    result = verify(report, shape, fraction=fraction, hold=hold, children=children)
    if args.json:
        from oomguard.commands.render import to_json

        sys.stdout.write(to_json(result) + "\n")
    else:
        sys.stdout.write(format_verify(result))
    return EXIT_OK if result["delivered"] else EXIT_VERIFY_FAILED
