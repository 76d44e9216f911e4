"""``oomguard plan``: how many jobs of a shape fit in the budget, and which constraint binds."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from oomguard.commands import flags
from oomguard.errors import EXIT_OK, ThresholdError
from oomguard.units import format_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Plan, PlanCuzk, Report
    from oomguard.policy.plan import Shape

SUMMARY = "How many jobs of a shape fit in the budget, which constraint binds, and the headroom left."
USAGE = "%(prog)s [--json] (--per-job SIZE | --profile NAME) [shape options] [budget options] [--require-jobs N]"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    parser.description = SUMMARY
    parser.epilog = (
        "concurrency = min over memory, memlock, gpu, max_jobs, cpu (ties: that order).\n"
        "Pinned memory is part of the memory it pins: the baseline used is max(--baseline, --pinned-baseline), "
        "the per-job size max(--per-job, --pinned-per-job).\n" + flags.SIZES
    )
    flags.add_json(parser)
    flags.option(parser, "--list-profiles", "list the profiles (built in and --profiles) and exit")
    flags.option(
        parser, "--require-jobs", "exit 3 when fewer than N jobs fit, or an explicit budget is above the ceiling", "N"
    )
    flags.add_allow_over_limit(parser)
    flags.add_shape(parser)
    flags.add_budget(parser)
    flags.add_gpu(parser)
    from oomguard.commands.learned import add_learned

    add_learned(parser, fleet=True)


def _list_profiles(args: argparse.Namespace) -> int:
    from oomguard.policy.profiles import load_profiles

    profiles = sorted(load_profiles(args.profiles).items())
    sys.stdout.write("\n".join(format_profile(name, p) for name, p in profiles))
    return EXIT_OK


def format_profile(name: str, profile: Mapping[str, object]) -> str:
    """A profile as ``plan --list-profiles`` shows it: its name and description, then every shape
    field as the planner takes it (a field the profile leaves out says "(default)", "-" where the
    planner has no value: no constraint), then the profile's other fields (``baseline_parts``,
    ``source``, ...) as written."""
    from oomguard.policy.plan import SHAPE_FIELDS, Shape
    from oomguard.policy.profiles import SIZE_FIELDS, profile_values

    fields = dict(profile_values(name, dict(profile)))
    shape = Shape(fields.pop("per_job"), **fields)  # type: ignore[arg-type]
    description = profile.get("description")
    lines = [f"{name}  {description}" if description else name]
    for key in SHAPE_FIELDS:
        value = getattr(shape, key)
        default = "" if key in profile or value is None else " (default)"
        lines.append(f"  {key:<16} {_shown(value, sized=key in SIZE_FIELDS)}{default}")
    lines += [f"  {k:<16} {_shown(v)}" for k, v in profile.items() if k not in SHAPE_FIELDS and k != "description"]
    return "\n".join(lines) + "\n"


def _shown(value: object, *, sized: bool = False) -> str:
    """One field's value: "-" for none, a size in binary units, a number, a table as "key value, ..."."""
    if value is None:
        return "-"
    if sized and isinstance(value, int):
        return format_size(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_shown(v)}" for k, v in value.items())
    return str(value)


def execute(args: argparse.Namespace) -> int:
    from oomguard.policy.plan import make_plan

    if args.list_profiles:
        return _list_profiles(args)
    require = flags.parse_count(args.require_jobs, "--require-jobs") if args.require_jobs else None
    shape = flags.shape_from(args)
    assert shape is not None
    from oomguard.commands.learned import learner

    learn = learner(args, shape)
    if learn is None:  # plan's manager options serve --learned only
        flags.needs(args, "--learned", ("--manager", "--token", "--token-file", "--node", "--node-class", "--spool"))
    report = flags.probe_from(args)
    learned = None
    if learn is not None:
        shape, learned = learn(shape, report)
    result = make_plan(report, shape)
    if args.json:
        from oomguard.commands.render import to_json

        extra = {} if learned is None else {"learned": learned}
        sys.stdout.write(to_json({**result, **extra, "report": report}) + "\n")
    else:
        sys.stdout.write(format_plan(result, report, learned))
    if require is not None:
        from oomguard.policy.budget import gate_over_limit

        gate_over_limit(report, "--require-jobs", allowed=flags.allowed_over_limit(args))
    if require is not None and result["concurrency"] < require:
        raise ThresholdError(_require_message(result, report, shape, require))
    return EXIT_OK


def _require_message(result: Plan, report: Report, shape: Shape, require: int) -> str:
    """``--require-jobs: 3 jobs fit, 5 required (budget 21.19 GiB - 8 GiB baseline = 13.19 GiB / 1 GiB
    per job)``, and the constraint that binds where it is not memory."""
    from oomguard.policy.plan import memory_arithmetic

    n, binding = result["concurrency"], result["binding"]
    why = memory_arithmetic(report["budget"]["bytes"], shape)
    if binding != "memory":
        why += f"; {binding} binds at {n}"
    return f"--require-jobs: {n} jobs fit, {require} required ({why})"


def format_plan(result: Plan, report: Report, learned: Mapping[str, object] | None = None) -> str:
    from oomguard.policy.plan import CONSTRAINTS

    capacity: Mapping[str, object] = result["capacity"]
    caps = ", ".join(f"{k} {'-' if capacity[k] is None else capacity[k]}" for k in CONSTRAINTS)
    b = report["budget"]
    cz = result.get("cuzk")  # absent in a plan made before there was one
    lines = [
        f"oomguard plan: {result['explanation']}",
        f"  capacity   {caps}",
        f"  headroom   {format_size(result['headroom_bytes'])}",
        f"  budget     {format_size(b['bytes'])} ({b['source']}; "
        f"ceiling {format_size(report['memory']['effective_bytes'])}, {report['memory']['limited_by']})",
        *([f"  learned    {learned['why']}"] if learned is not None else []),
        *([f"  cuzk       {_cuzk_line(cz)}"] if cz is not None else []),
        f"Warnings ({len(report['warnings'])})",
        *(f"  {w['code']}: {w['message']}" for w in report["warnings"]),
    ]
    return "\n".join(lines) + "\n"


def _cuzk_line(c: PlanCuzk) -> str:
    """CuZK's own count, in its arithmetic: ``16 partitions at once with total_budget 300 GiB (= BYTES):
    min(floor((300 GiB - 70 GiB SRS and PCE) / 14 GiB per partition), 18 workers)``."""
    budget = c["total_budget_bytes"]
    if budget is None or c["partitions"] is None:
        return "the budget is unknown: CuZK's partitions cannot be said"
    n = c["partitions"]
    return (
        f"{n} partition{'s' if n != 1 else ''} at once with total_budget {format_size(budget)} "
        f"(= {budget}): min(floor(({format_size(budget)} - {format_size(c['resident_bytes'])} SRS and PCE) / "
        f"{format_size(c['partition_bytes'])} per partition), {c['workers']} workers)"
    )
