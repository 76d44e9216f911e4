"""``oomguard check``: the memory this process may really use, and a safe budget.

The hot path of the command line (start-up goal in bench/startup.py): it imports the probe and
the renderer only; the pin probes load when asked for.
"""

from __future__ import annotations

import argparse
import sys

from oomguard.commands import flags
from oomguard.errors import EXIT_OK, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Report

SUMMARY = (
    "Report the memory this process may really use (cgroup v1/v2 limits, MemTotal), "
    "memlock, CPUs, container and a safe budget."
)
USAGE = "%(prog)s [--json] [--budget SPEC] [--margin SPEC] [--require SIZE] [--root PATH]"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    parser.description = SUMMARY
    parser.epilog = flags.SIZES
    flags.add_json(parser, "print one JSON object (fields: docs/report.md)")
    flags.option(
        parser, "--require", "exit 3 when the budget is below SIZE, or (explicit) above the hard ceiling", "SIZE"
    )
    flags.add_allow_over_limit(parser)
    flags.option(parser, "--probe-mlock", "really mlock SIZE in a short-lived child and report memlock.probe", "SIZE")
    flags.option(
        parser, "--probe-pinned", "really cudaHostAlloc SIZE (libcudart) in a child: memlock.pinned_probe", "SIZE"
    )
    flags.add_budget(parser)
    flags.add_gpu(parser)


def _pin_sizes(args: argparse.Namespace) -> dict[str, int]:
    """{"mlock"|"cuda": bytes} for --probe-mlock / --probe-pinned."""
    from oomguard.units import parse_size

    asked = {"mlock": args.probe_mlock, "cuda": args.probe_pinned}
    if args.root is not None and any(v is not None for v in asked.values()):
        raise UsageError(
            "check: --probe-mlock and --probe-pinned lock memory on this machine; they cannot go with --root"
        )
    names = {"mlock": "--probe-mlock", "cuda": "--probe-pinned"}
    return {kind: parse_size(text, names[kind]) for kind, text in asked.items() if text is not None}


def _run_pin_probes(report: Report, pins: dict[str, int]) -> None:
    """Lock each size for real in a child; a failure (not a skip) is warning ``pin-probe-failed``."""
    from oomguard.report import add_warning
    from oomguard.units import format_size
    from oomguard.verify.pinprobe import run_pin_probe

    for kind, nbytes in pins.items():
        result = run_pin_probe(kind, nbytes)
        report["memlock"]["probe" if kind == "mlock" else "pinned_probe"] = result
        if not result.get("ok") and not result.get("skipped"):
            what = "mlock" if kind == "mlock" else "cudaHostAlloc"
            add_warning(
                report["warnings"],
                "pin-probe-failed",
                f"{what} of {format_size(nbytes)} failed in the probe child: {result.get('error') or 'unknown error'}",
            )


def execute(args: argparse.Namespace) -> int:
    from oomguard.units import parse_size

    require = parse_size(args.require, "--require") if args.require is not None else None
    pins = _pin_sizes(args)
    report = flags.probe_from(args)
    if pins:
        _run_pin_probes(report, pins)
    if args.json:
        from oomguard.commands.render import to_json

        sys.stdout.write(to_json(report) + "\n")
    else:
        from oomguard.commands.render import format_human

        # A snapshot's paths may hold bytes that are not UTF-8 (kept as surrogates): never let a
        # strict stdout encoding turn them into a traceback.
        if hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(errors="backslashreplace")
        sys.stdout.write(format_human(report))
    if require is not None:
        from oomguard.policy.budget import require as require_budget

        require_budget(report, require, allowed_over_limit=flags.allowed_over_limit(args))
    return EXIT_OK
