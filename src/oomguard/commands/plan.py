"""``oomguard plan`` and ``oomguard verify``: flags to a job shape, then print the result."""

from __future__ import annotations

import sys

from oomguard.commands.flags import text
from oomguard.errors import EXIT_VERIFY_FAILED, ThresholdError, UsageError
from oomguard.policy.budget import probe
from oomguard.policy.plan import CONSTRAINTS, Shape, make_plan
from oomguard.units import format_size, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Report

Values = dict[str, "str | bool | None"]


def parse_count(text: str, flag: str) -> int:
    try:
        n = int(text.strip())
    except ValueError:
        raise UsageError(f"{flag}: expected a whole number, got {text!r}") from None
    if n < 0:
        raise UsageError(f"{flag}: must not be negative, got {text!r}")
    return n


def parse_number(text: str, flag: str) -> float:
    try:
        x = float(text.strip())
    except ValueError:
        raise UsageError(f"{flag}: expected a number, got {text!r}") from None
    if not (x > 0 and x - x == 0.0):
        raise UsageError(f"{flag}: must be a number above 0, got {text!r}")
    return x


def shape_from_flags(values: Values, *, required: bool = True) -> Shape | None:
    """A Shape from --profile and the shape flags (flags win); None when none given and not *required*."""
    from oomguard.policy.profiles import load_profiles, profile_values

    fields: dict[str, object] = {}
    name = text(values, "profile")
    if name is not None:
        profiles = load_profiles(text(values, "profiles"))
        if name not in profiles:
            raise UsageError(f"--profile: unknown profile {name!r} (known: {', '.join(sorted(profiles))})")
        fields.update(profile_values(name, profiles[name]))
        fields["profile"] = name
    for key in ("per_job", "baseline", "pinned_per_job", "pinned_baseline", "gpu_per_job"):
        given = text(values, key)
        if given is not None:
            fields[key] = parse_size(given, "--" + key.replace("_", "-"))
    if text(values, "max_jobs") is not None:
        fields["max_jobs"] = parse_count(str(values["max_jobs"]), "--max-jobs")
    if text(values, "cpus_per_job") is not None:
        fields["cpus_per_job"] = parse_number(str(values["cpus_per_job"]), "--cpus-per-job")
    if "per_job" not in fields:
        if fields or required:
            raise UsageError("plan: give --per-job SIZE or --profile NAME (see 'oomguard plan --help')")
        return None
    per_job = int(fields.pop("per_job"))  # type: ignore[call-overload]
    return Shape(per_job, **fields)  # type: ignore[arg-type]


def _report(values: Values) -> Report:
    from oomguard.cli import gpu_options

    gpu, gpu_timeout = gpu_options(values)
    return probe(
        root=text(values, "root"),
        budget=text(values, "budget"),
        margin=text(values, "margin"),
        gpu=gpu,
        gpu_timeout=gpu_timeout,
    )


def _list_profiles(values: Values) -> int:
    from oomguard.policy.profiles import load_profiles

    for name, p in sorted(load_profiles(text(values, "profiles")).items()):
        sys.stdout.write(
            f"{name:<16} per_job {p.get('per_job')}, baseline {p.get('baseline', 0)}, "
            f"max_jobs {p.get('max_jobs', '-')}: {p.get('description', '')}\n"
        )
    return 0


def plan_command(values: Values) -> int:
    if values.get("list_profiles"):
        return _list_profiles(values)
    require = parse_count(str(values["require_jobs"]), "--require-jobs") if text(values, "require_jobs") else None
    shape = shape_from_flags(values)
    assert shape is not None
    report = _report(values)
    result = make_plan(report, shape)
    if values.get("json"):
        from oomguard.commands.render import to_json

        sys.stdout.write(to_json({**result, "report": report}) + "\n")
    else:
        sys.stdout.write(format_plan(result, report))
    if require is not None and int(result["concurrency"]) < require:  # type: ignore[call-overload]
        raise ThresholdError(f"--require-jobs: {result['concurrency']} jobs fit, {require} required")
    return 0


def format_plan(result: dict[str, object], report: Report) -> str:
    capacity = result["capacity"]
    assert isinstance(capacity, dict)
    caps = ", ".join(f"{k} {'-' if capacity[k] is None else capacity[k]}" for k in CONSTRAINTS)
    b = report["budget"]
    headroom = result["headroom_bytes"]
    lines = [
        f"oomguard plan: {result['explanation']}",
        f"  capacity   {caps}",
        f"  headroom   {format_size(headroom if isinstance(headroom, int) else None)}",
        f"  budget     {format_size(b['bytes'])} ({b['source']}; "
        f"ceiling {format_size(report['memory']['effective_bytes'])}, {report['memory']['limited_by']})",
        f"Warnings ({len(report['warnings'])})",
        *(f"  {w['code']}: {w['message']}" for w in report["warnings"]),
    ]
    return "\n".join(lines) + "\n"


def verify_command(values: Values) -> int:
    from oomguard.verify.runner import format_verify, verify

    fraction = parse_number(str(values["fraction"]), "--fraction") if text(values, "fraction") else 1.0
    if fraction > 1:
        raise UsageError(f"--fraction: must be at most 1, got {values['fraction']!r}")
    hold = parse_number(str(values["hold"]), "--hold") if text(values, "hold") else 3.0
    shape = shape_from_flags(values, required=False)
    report = _report(values)
    result = verify(report, shape, fraction=fraction, hold=hold)
    if values.get("json"):
        from oomguard.commands.render import to_json

        sys.stdout.write(to_json(result) + "\n")
    else:
        sys.stdout.write(format_verify(result))
    return 0 if result["delivered"] else EXIT_VERIFY_FAILED
