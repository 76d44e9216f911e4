"""Options several commands share, and the one way from parsed flags to a report.

Option values stay text here: each command parses sizes, durations and counts itself, so an
error names the flag in oomguard's words (``--budget: invalid size 'lots'``). The groups:

- ``add_budget``: ``--budget``, ``--margin`` (and ``--root`` where a snapshot makes sense);
- ``add_gpu``: ``--no-gpu``, ``--gpu-timeout``;
- ``add_shape``: the job shape of ``plan``, ``verify``, ``run`` and ``agent``.

``probe_from(args)`` is the one "flags -> probe()" step; ``shape_from(args)`` the one
"flags -> Shape" step.
"""

from __future__ import annotations

import argparse

from oomguard.errors import UsageError
from oomguard.units import MAX_DURATION_TEXT, MAX_SIZE_TEXT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from oomguard._types import Report
    from oomguard.errors import BadParameter
    from oomguard.policy.plan import Shape

BUDGET_HELP = "auto (default), SIZE (e.g. 300GiB) or PCT% of the basis; beats OOMGUARD_BUDGET"
MARGIN_HELP = "safety margin under an auto budget: SIZE or PCT% (default min(10GiB, max(256MiB, 10%)))"
ROOT_HELP = "probe a snapshot (directory or .tar.gz from 'oomguard capture') instead of the live system"
SIZES = (
    "Sizes: B, KiB/MiB/GiB/TiB (K/M/G/T are binary too), KB/MB/GB/TB (decimal), at most " + MAX_SIZE_TEXT + " (8 EiB)."
)
DURATIONS = "Durations: 500ms, 30s, 5m, 1h, 2d or seconds, at most " + MAX_DURATION_TEXT + "."
ENVIRONMENT = (  # agent's and manager's (commands/envflags.py)
    "Every option is also a variable, but those of one invocation (the gate's, migrate --check, revoke "
    "--reason): OOMGUARD_ and its name in capitals, dashes as underscores (--max-time: OOMGUARD_MAX_TIME; "
    "a switch takes 1 or 0); an option given beats its variable (docs/configuration.md)."
)
# Metavars whose value is a path: shell completion offers files (or directories) for them.
FILE_METAVARS = frozenset({"FILE", "PATH", "FILE.tar.gz"})
DIR_METAVARS = frozenset({"DIR"})


class OneOf:
    """An option's ``type`` that accepts one of a few words; completion offers them."""

    def __init__(self, choices: Sequence[str]) -> None:
        self.choices = tuple(choices)
        self.__name__ = "one of " + ", ".join(self.choices)  # argparse names a type by it

    def __call__(self, text: str) -> str:
        if text not in self.choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(self.choices)}, got {text!r}")
        return text


def option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    name: str,
    help: str,
    metavar: str | None = None,
    **kw: object,
) -> None:
    """``--name METAVAR`` (text, None when absent) or, without *metavar*, a ``--name`` switch."""
    help = help.replace("%", "%%")  # argparse formats help with %
    if metavar is None:
        parser.add_argument(name, action="store_true", help=help)
    else:
        parser.add_argument(name, metavar=metavar, help=help, **kw)  # type: ignore[arg-type]


def add_json(parser: argparse.ArgumentParser, help: str = "print one JSON object") -> None:
    option(parser, "--json", help)


def add_budget(parser: argparse.ArgumentParser, *, budget_help: str = BUDGET_HELP, root: bool = True) -> None:
    group = parser.add_argument_group("budget options")
    option(group, "--budget", budget_help, "SPEC")
    option(group, "--margin", MARGIN_HELP, "SPEC")
    if root:
        option(group, "--root", ROOT_HELP, "PATH")


ALLOW_OVER_LIMIT_HELP = (
    "let an explicit budget above the hard ceiling pass (swap-backed or overcommitted on purpose); "
    "also OOMGUARD_ALLOW_OVER_LIMIT=1"
)


def add_allow_over_limit(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    option(parser, "--allow-over-limit", ALLOW_OVER_LIMIT_HELP)


def allowed_over_limit(args: argparse.Namespace) -> bool:
    """--allow-over-limit, or OOMGUARD_ALLOW_OVER_LIMIT in this process's environment."""
    import os

    from oomguard.policy.budget import allow_over_limit

    return allow_over_limit(bool(getattr(args, "allow_over_limit", False)), os.environ)


def add_gpu(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("GPU options")
    option(group, "--no-gpu", "skip the GPU probe")
    option(group, "--gpu-timeout", "seconds NVML and nvidia-smi may take (default 5)", "SECONDS")


def add_shape(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("shape options")
    option(
        group,
        "--profile",
        "job shape from a profile (built in: see --list-profiles); flags override its fields",
        "NAME",
    )
    option(group, "--profiles", "also load profiles from FILE (JSON, or TOML on Python >= 3.11)", "FILE")
    option(group, "--per-job", "host RAM each job needs at its peak", "SIZE")
    option(group, "--baseline", "resident memory shared by all jobs (caches, parameters)", "SIZE")
    option(
        group, "--pinned-per-job", "page-locked host memory per job (part of --per-job: raises it when larger)", "SIZE"
    )
    option(
        group,
        "--pinned-baseline",
        "page-locked memory held once, outside the jobs (part of --baseline: raises it when larger)",
        "SIZE",
    )
    option(
        group,
        "--pin-method",
        "how it is pinned: cuda (cudaHostAlloc: charged to the memory cgroup only), mlock (default) or "
        "rdma (both RLIMIT_MEMLOCK unless CAP_IPC_LOCK)",
        "METHOD",
        type=OneOf(("cuda", "mlock", "rdma")),
    )
    option(group, "--gpu-per-job", "device memory per job on each visible GPU (needs GPU data)", "SIZE")
    option(group, "--max-jobs", "never more than N jobs", "N")
    option(group, "--cpus-per-job", "CPUs each job needs (no CPU constraint without it)", "N")


# The agent's bearer token: --token, --token-file or the variable (``token_from``).
TOKEN_VARIABLE = "OOMGUARD_AGENT_TOKEN"
TOKEN_FILE_MAX = 16 << 10  # a bearer token is at most a few hundred bytes; a header, some KiB
TOKEN_PRECEDENCE = f"--token or --token-file (not both) beats {TOKEN_VARIABLE}"  # said in --help and docs/agent.md


def add_token(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    """``--token TOKEN`` and ``--token-file FILE``; *what* says what the token is for."""
    option(
        parser,
        "--token",
        f"{what} (or {TOKEN_VARIABLE}); on the command line it is visible to other users of the host "
        "(ps, /proc/PID/cmdline): prefer --token-file or the variable",
        "TOKEN",
    )
    option(
        parser,
        "--token-file",
        f"read the token from FILE, e.g. a mounted secret (white space around it stripped: a trailing newline "
        f"is fine); {TOKEN_PRECEDENCE}",
        "FILE",
    )


def _shown(path: str) -> str:
    """*path* as an error line shows it: quoted when it holds a newline or another unprintable character."""
    return path if path.isprintable() else repr(path)


def _token_file(path: str, where: str = "--token-file") -> str:
    """The text of the token file *path* (``sources.files.read_bounded``: a regular file, at most
    ``TOKEN_FILE_MAX``); ``UsageError`` naming *where* it was given when it cannot be read or holds
    nothing but white space."""
    from oomguard.sources.files import read_bounded

    try:
        data = read_bounded(path, TOKEN_FILE_MAX)
    except OSError as exc:
        raise UsageError(f"{where}: cannot read {_shown(path)}: {exc.strerror or exc}") from None
    except ValueError:  # a NUL byte in the path
        raise UsageError(f"{where}: cannot read {path!r}: a path holds no NUL byte") from None
    text = data.decode("utf-8", "replace")  # a byte that is not UTF-8 fails the token's check, and says so
    if not text.strip():
        raise UsageError(f"{where}: {_shown(path)} is empty")
    return text


def token_from(args: argparse.Namespace) -> str:
    """The agent's bearer token, checked (``agent.client.check_token``: visible ASCII, what the
    manager accepts), or "" for none: ``--token``, else the content of ``--token-file``, else
    ``OOMGUARD_AGENT_TOKEN``, else the content of the file ``OOMGUARD_AGENT_TOKEN_FILE`` names.
    ``UsageError`` naming where it came from (never the token itself), for both flags given, and
    for a token file that cannot be read or is empty. Read once per *args* (``run`` asks for it
    for --learned and for its events)."""
    import os

    from oomguard.agent.client import check_token
    from oomguard.errors import BadParameter

    cached = getattr(args, "_token_checked", None)
    if isinstance(cached, str):
        return cached
    given, path = value(args, "token"), value(args, "token_file")
    if given is not None and path is not None:
        raise UsageError("--token and --token-file: give one of them (--token-file keeps the token out of ps)")
    from_env = os.environ.get(TOKEN_VARIABLE, "")
    env_file = os.environ.get(TOKEN_VARIABLE + "_FILE", "")
    if given is not None:
        where, text = "--token", given
    elif path is not None:
        where, text = f"--token-file {_shown(path)}", _token_file(path)
    elif not from_env and env_file:  # a mounted secret's file (issue 39: *_FILE for every secret)
        where, text = f"{TOKEN_VARIABLE}_FILE {_shown(env_file)}", _token_file(env_file, f"{TOKEN_VARIABLE}_FILE")
    else:
        where, text = TOKEN_VARIABLE, from_env
    try:
        token = check_token(text)
    except BadParameter as exc:
        raise UsageError(f"{where}: the token {exc.message}") from None
    args._token_checked = token
    return token


# The flag that feeds each API parameter whose name does not simply become --name-with-dashes.
FLAG_OF_PARAM = {
    "mode": "--restart",  # RestartPolicy(mode)
    "token": f"--token (or --token-file, {TOKEN_VARIABLE})",
}


def flag_message(exc: BadParameter) -> str:
    """*exc* in the command line's words: the flag the user typed, not the API's parameter name."""
    flag = FLAG_OF_PARAM.get(exc.param, "--" + exc.param.replace("_", "-"))
    return f"{flag}: {exc.message}"


def value(args: argparse.Namespace, name: str) -> str | None:
    """The text given to option *name*, or None when it was not given (or the command has none)."""
    given = getattr(args, name, None)
    return given if isinstance(given, str) else None


def needs(args: argparse.Namespace, flag: str, dependents: Sequence[str]) -> None:
    """``UsageError("DEPENDENT needs FLAG")`` for the first of *dependents* (``--name``) that was
    given: call it where *flag* was not."""
    for dependent in dependents:
        if getattr(args, dependent[2:].replace("-", "_"), None) not in (None, False):
            raise UsageError(f"{dependent} needs {flag}")


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


def gpu_options(args: argparse.Namespace) -> tuple[bool, float]:
    """(gpu, gpu_timeout) for ``probe()`` from --no-gpu / --gpu-timeout."""
    timeout = 5.0
    given = value(args, "gpu_timeout")
    if given is not None:
        from oomguard.units import parse_duration

        timeout = parse_duration(given, "--gpu-timeout")
    return not getattr(args, "no_gpu", False), timeout


def probe_from(args: argparse.Namespace) -> Report:
    """The report the flags ask for: ``--root``, ``--budget``, ``--margin``, ``--no-gpu``, ``--gpu-timeout``."""
    from oomguard.policy.budget import probe

    gpu, gpu_timeout = gpu_options(args)
    return probe(
        root=value(args, "root"),
        budget=value(args, "budget"),
        margin=value(args, "margin"),
        gpu=gpu,
        gpu_timeout=gpu_timeout,
    )


def _shape_fields(args: argparse.Namespace) -> dict[str, object]:
    from oomguard.policy.profiles import load_profiles, profile_values
    from oomguard.units import parse_size

    fields: dict[str, object] = {}
    name = value(args, "profile")
    if name is not None:
        profiles = load_profiles(value(args, "profiles"))
        if name not in profiles:
            raise UsageError(f"--profile: unknown profile {name!r} (known: {', '.join(sorted(profiles))})")
        fields.update(profile_values(name, profiles[name]))
        fields["profile"] = name
    for key in ("per_job", "baseline", "pinned_per_job", "pinned_baseline", "gpu_per_job"):
        given = value(args, key)
        if given is not None:
            fields[key] = parse_size(given, "--" + key.replace("_", "-"))
    method = value(args, "pin_method")
    if method is not None:
        fields["pin_method"] = method
    max_jobs, cpus = value(args, "max_jobs"), value(args, "cpus_per_job")
    if max_jobs is not None:
        fields["max_jobs"] = parse_count(max_jobs, "--max-jobs")
    if cpus is not None:
        from oomguard.policy.profiles import check_cpus

        fields["cpus_per_job"] = check_cpus(parse_number(cpus, "--cpus-per-job"), "--cpus-per-job")
    return fields


def shape_from(args: argparse.Namespace, *, required: bool = True) -> Shape | None:
    """A Shape from --profile and the shape flags (flags win); None when none given and not *required*."""
    from oomguard.policy.plan import Shape

    fields = _shape_fields(args)
    if "per_job" not in fields:
        if fields or required:
            raise UsageError("plan: give --per-job SIZE or --profile NAME (see 'oomguard plan --help')")
        return None
    per_job = fields.pop("per_job")
    assert isinstance(per_job, int)
    return Shape(per_job, **fields)  # type: ignore[arg-type]
