"""The ``oomguard`` command: dispatch, help, and errors turned into one line and an exit code.

Each command imports what it needs when it runs, so ``oomguard check`` loads only the probe.
"""

from __future__ import annotations

import sys

from oomguard._version import __version__
from oomguard.commands.flags import Command, Option, text
from oomguard.errors import EXIT_INTERRUPTED, EXIT_USAGE, OomguardError, UsageError, exit_codes_help

EXIT_CODES = exit_codes_help()

BUDGET_OPTIONS = [
    Option("--budget", "auto (default), SIZE (e.g. 300GiB) or PCT% of the basis; beats OOMGUARD_BUDGET", "SPEC"),
    Option(
        "--margin", "safety margin under an auto budget: SIZE or PCT% (default min(10GiB, max(256MiB, 10%)))", "SPEC"
    ),
    Option(
        "--root", "probe a snapshot (directory or .tar.gz from 'oomguard capture') instead of the live system", "PATH"
    ),
]

GPU_OPTIONS = [
    Option("--no-gpu", "skip the GPU probe"),
    Option("--gpu-timeout", "seconds NVML and nvidia-smi may take (default 5)", "SECONDS"),
]

CHECK = Command(
    "check",
    "Report the memory this process may really use (cgroup v1/v2 limits, MemTotal), "
    "memlock, CPUs, container and a safe budget.",
    "[--json] [--budget SPEC] [--margin SPEC] [--require SIZE] [--root PATH]",
    [
        Option("--json", "print one JSON object (fields: docs/report.md)"),
        *BUDGET_OPTIONS,
        Option("--require", "exit 3 when the budget is below SIZE", "SIZE"),
        *GPU_OPTIONS,
        Option("--probe-mlock", "really mlock SIZE in a short-lived child and report memlock.probe", "SIZE"),
        Option("--probe-pinned", "really cudaHostAlloc SIZE (libcudart) in a child: memlock.pinned_probe", "SIZE"),
    ],
    epilog="Sizes: B, KiB/MiB/GiB/TiB (K/M/G/T are binary too), KB/MB/GB/TB (decimal).\n" + EXIT_CODES,
    brief="the memory this process may really use, and a safe budget",
)

CAPTURE = Command(
    "capture",
    "Save every file the probe reads (a snapshot) as a .tar.gz, for a bug report or a test "
    "fixture; replay it with 'oomguard check --root FILE'. The environment is reduced to the "
    "variables oomguard reads (docs/snapshots.md).",
    "[--force] FILE.tar.gz",
    [Option("--force", "overwrite FILE if it exists")],
    epilog=EXIT_CODES,
    max_positionals=1,
    brief="save what the probe reads as a .tar.gz snapshot",
)

SHAPE_OPTIONS = [
    Option("--profile", "job shape from a profile (built in: see --list-profiles); flags override its fields", "NAME"),
    Option("--profiles", "also load profiles from FILE (JSON, or TOML on Python >= 3.11)", "FILE"),
    Option("--per-job", "host RAM each job needs at its peak", "SIZE"),
    Option("--baseline", "resident memory shared by all jobs (caches, parameters)", "SIZE"),
    Option("--pinned-per-job", "page-locked host memory per job (checked against RLIMIT_MEMLOCK)", "SIZE"),
    Option("--pinned-baseline", "page-locked memory held once, outside the jobs", "SIZE"),
    Option("--gpu-per-job", "device memory per job on each visible GPU (needs GPU data)", "SIZE"),
    Option("--max-jobs", "never more than N jobs", "N"),
    Option("--cpus-per-job", "CPUs each job needs (no CPU constraint without it)", "N"),
]

PLAN = Command(
    "plan",
    "How many jobs of a shape fit in the budget, which constraint binds, and the headroom left.",
    "[--json] (--per-job SIZE | --profile NAME) [shape options] [budget options] [--require-jobs N]",
    [
        Option("--json", "print one JSON object"),
        *SHAPE_OPTIONS,
        Option("--list-profiles", "list the profiles (built in and --profiles) and exit"),
        Option("--require-jobs", "exit 3 when fewer than N jobs fit", "N"),
        *BUDGET_OPTIONS,
        *GPU_OPTIONS,
    ],
    epilog="concurrency = min over memory, memlock, gpu, max_jobs, cpu (ties: that order).\n" + EXIT_CODES,
    brief="how many jobs of a shape fit, and which constraint binds",
)

VERIFY = Command(
    "verify",
    "Prove the machine delivers the plan: allocate and touch baseline + jobs x per-job memory "
    "(or the whole budget) in child processes, hold it, and report peak, fault-in speed and OOM kills.",
    "[--json] [shape options] [budget options] [--fraction F] [--hold SECONDS]",
    [
        Option("--json", "print one JSON object"),
        *SHAPE_OPTIONS,
        Option("--fraction", "verify only this part of the target, 0 < F <= 1 (default 1)", "F"),
        Option("--hold", "seconds to hold the memory once touched (default 3)", "SECONDS"),
        *BUDGET_OPTIONS,
        *GPU_OPTIONS,
    ],
    epilog="Exit 0 when the memory was delivered, 4 when not (an OOM kill or a failed allocation).\n" + EXIT_CODES,
    brief="allocate the plan for real in child processes: delivered or not",
)

RUN = Command(
    "run",
    "Supervise a worker: compute its budget (and concurrency) before each start, pass it in "
    "OOMGUARD_BUDGET_BYTES / OOMGUARD_BUDGET / OOMGUARD_CONCURRENCY and the placeholders {budget_bytes}, "
    "{budget}, {budget_gib}, {concurrency} in its arguments, tell OOM kills from other deaths, restart "
    "with backoff and one less concurrency (or a larger margin) after an OOM kill.",
    "[budget and plan options] [restart options] [--] CMD ARGS...",
    [
        Option("--budget", "auto (default), SIZE or PCT% of the basis; passed through unchanged", "SPEC"),
        BUDGET_OPTIONS[1],
        *SHAPE_OPTIONS,
        Option("--restart", "on-failure (default), always or never", "WHEN"),
        Option("--backoff-initial", "first restart delay (default 1s)", "DURATION"),
        Option("--backoff-max", "longest restart delay (default 5m)", "DURATION"),
        Option("--backoff-factor", "delay multiplier per consecutive restart (default 2)", "X"),
        Option("--healthy-after", "uptime that resets the backoff (default 10m)", "DURATION"),
        Option("--max-restarts", "give up after N restarts within --restart-window (default: no limit)", "N"),
        Option("--restart-window", "window for --max-restarts (default 10m)", "DURATION"),
        Option(
            "--on-oom",
            "after an OOM kill: concurrency (default with plan flags: one less job) or "
            "margin (default otherwise: a larger safety margin)",
            "WHAT",
        ),
        Option("--min-concurrency", "never fewer jobs than N after OOM kills (default 1)", "N"),
        Option("--stop-timeout", "SIGKILL this long after forwarding a stop signal (default 30s)", "DURATION"),
        Option("--isolate", "run the worker in its own memory cgroup limited to budget + margin"),
        Option("--events", "append events as JSON lines to FILE", "FILE"),
        Option("--manager", "also send events to the fleet manager at URL (spooled when it is down)", "URL"),
        Option("--token", "bearer token for --manager (or OOMGUARD_AGENT_TOKEN)", "TOKEN"),
        Option("--node", "node name for --manager (default: VAST_CONTAINERLABEL, then the hostname)", "NAME"),
        Option(
            "--spool",
            "spool directory for --manager (default: $OOMGUARD_SPOOL, "
            "$XDG_STATE_HOME/oomguard/spool, ~/.local/state/oomguard/spool)",
            "DIR",
        ),
    ],
    epilog="Exit status: the worker's (128 + signal when it was killed); 127 when CMD cannot be run.\n"
    "Durations: 500ms, 30s, 5m, 1h or seconds.\n" + EXIT_CODES,
    max_positionals=1_000_000,
    stop_at_positional=True,
    brief="supervise a worker under its budget; tell OOM kills apart; restart",
)

MANAGER = Command(
    "manager",
    "Run the fleet manager (extra [manager]): agents POST reports and events; an API, Prometheus "
    "metrics and a dashboard show every node. Migrates the database before it serves.",
    "[--db URL] [--host HOST] [--port PORT] [--agent-token T] [--viewer-token T] [--retention 30d]",
    [
        Option("--db", "database URL: sqlite:///oomguard.db (default) or postgresql://user@host/db", "URL"),
        Option("--host", "address to listen on (default 127.0.0.1)", "HOST"),
        Option("--port", "port (default 8080)", "PORT"),
        Option("--agent-token", "bearer token agents write with (or OOMGUARD_AGENT_TOKEN)", "TOKEN"),
        Option("--viewer-token", "bearer token readers use (or OOMGUARD_VIEWER_TOKEN)", "TOKEN"),
        Option("--retention", "history kept (default 30d; OOM events are kept for ever)", "DURATION"),
        Option("--interval", "the agents' report interval, for offline detection (default 30s)", "DURATION"),
        Option("--max-body", "largest request body (default 1MiB); larger gets 413", "SIZE"),
    ],
    epilog="Off loopback, both tokens are required. Tokens are compared in constant time.\n" + EXIT_CODES,
    brief="the fleet manager: API, dashboard, metrics (extra [manager])",
)

AGENT = Command(
    "agent",
    "Send this node's check report to the fleet manager every --interval (standard library only). "
    "When the manager cannot be reached or answers 5xx, reports wait in a durable spool and are "
    "replayed in order; each carries an id, so a retry is never stored twice.",
    "--manager URL [--token T] [--node NAME] [--interval 30s] [--once] [--spool DIR]",
    [
        Option("--manager", "the manager's base URL, e.g. http://manager:8080", "URL"),
        Option("--token", "agent bearer token (or OOMGUARD_AGENT_TOKEN)", "TOKEN"),
        Option("--node", "node name (default: VAST_CONTAINERLABEL, then the hostname)", "NAME"),
        Option("--interval", "time between reports (default 30s)", "DURATION"),
        Option("--once", "send one report and exit: 0 when delivered, 75 when spooled for later"),
        Option(
            "--spool",
            "spool directory (default: $OOMGUARD_SPOOL, $XDG_STATE_HOME/oomguard/spool, ~/.local/state/oomguard/spool)",
            "DIR",
        ),
        Option("--budget", BUDGET_OPTIONS[0].help, "SPEC"),
        BUDGET_OPTIONS[1],
        *SHAPE_OPTIONS,
        *GPU_OPTIONS,
    ],
    epilog="With plan flags the report carries the plan (concurrency, memlock need) too.\n" + EXIT_CODES,
    brief="send this node's report to the fleet manager (spooled when it is down)",
)

COMMANDS = {c.name: c for c in (CHECK, PLAN, VERIFY, RUN, CAPTURE, AGENT, MANAGER)}

MAIN_HELP = f"""usage: oomguard COMMAND [OPTIONS]

Know the memory a worker may really use inside a container, and keep it there.

commands:
{chr(10).join(f"  {c.name:<10} {c.brief}" for c in COMMANDS.values())}

Run 'oomguard COMMAND --help' for a command's options. 'oomguard --version' prints the version.

{EXIT_CODES}
"""


def _check(values: dict[str, str | bool | None]) -> int:
    from oomguard.policy.budget import probe
    from oomguard.units import parse_size

    require = parse_size(str(values["require"]), "--require") if values["require"] is not None else None
    gpu, gpu_timeout = gpu_options(values)
    if values["root"] is not None and (values["probe_mlock"] is not None or values["probe_pinned"] is not None):
        raise UsageError(
            "check: --probe-mlock and --probe-pinned lock memory on this machine; they cannot go with --root"
        )
    pins = {
        kind: parse_size(str(values[key]), "--" + key.replace("_", "-"))
        for kind, key in (("mlock", "probe_mlock"), ("cuda", "probe_pinned"))
        if values[key] is not None
    }
    report = probe(
        root=text(values, "root"),
        budget=text(values, "budget"),
        margin=text(values, "margin"),
        gpu=gpu,
        gpu_timeout=gpu_timeout,
    )
    if pins:
        from oomguard.verify.pinprobe import run_pin_probe

        for kind, nbytes in pins.items():
            report["memlock"]["probe" if kind == "mlock" else "pinned_probe"] = run_pin_probe(kind, nbytes)
    if values["json"]:
        from oomguard.commands.render import to_json

        sys.stdout.write(to_json(report) + "\n")
    else:
        from oomguard.commands.render import format_human

        sys.stdout.write(format_human(report))
    if require is not None:
        from oomguard.policy.budget import require as require_budget

        require_budget(report, require)
    return 0


def _capture(values: dict[str, str | bool | None], positionals: list[str]) -> int:
    from oomguard.probes.capture import capture

    if not positionals:
        raise UsageError("capture: missing FILE.tar.gz (see 'oomguard capture --help')")
    n = capture(positionals[0], force=bool(values["force"]))
    sys.stderr.write(f"oomguard: wrote {n} files to {positionals[0]}\n")
    return 0


def gpu_options(values: dict[str, str | bool | None]) -> tuple[bool, float]:
    """(gpu, gpu_timeout) for ``probe()`` from --no-gpu / --gpu-timeout."""
    timeout = 5.0
    timeout_text = text(values, "gpu_timeout")
    if timeout_text is not None:
        from oomguard.units import parse_duration

        timeout = parse_duration(timeout_text, "--gpu-timeout")
    return not values.get("no_gpu"), timeout


def run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        if len(argv) > 1 and argv[1] in COMMANDS:
            sys.stdout.write(COMMANDS[argv[1]].help())
            return 0
        sys.stdout.write(MAIN_HELP)
        return 0 if argv else EXIT_USAGE
    if argv[0] == "--version":
        sys.stdout.write(f"oomguard {__version__}\n")
        return 0
    command = COMMANDS.get(argv[0])
    if command is None:
        raise UsageError(f"unknown command {argv[0]!r} (commands: {', '.join(COMMANDS)}; see 'oomguard --help')")
    values, positionals = command.parse(argv[1:])
    if values.get("help"):
        sys.stdout.write(command.help())
        return 0
    if command is CHECK:
        return _check(values)
    if command is CAPTURE:
        return _capture(values, positionals)
    if command is AGENT:
        from oomguard.commands.agent import agent_command

        return agent_command(values)
    if command is MANAGER:
        try:
            from oomguard.manager.cli import manager_command
        except ModuleNotFoundError as exc:  # the worker zipapp ships without the manager
            if not (exc.name or "").startswith("oomguard.manager"):
                raise
            raise UsageError(
                "manager: not in this build (the worker zipapp): pip install 'oomguard[manager]'"
            ) from None
        return manager_command(values)
    if command is RUN:
        from oomguard.commands.run import run_command

        return run_command(values, positionals)
    from oomguard.commands import plan as plan_cli

    return plan_cli.plan_command(values) if command is PLAN else plan_cli.verify_command(values)


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns the exit code; no traceback reaches the user for expected errors."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except OomguardError as exc:
        sys.stderr.write(f"oomguard: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("oomguard: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0


def main_exit() -> None:
    """Console-script entry point."""
    sys.exit(main())
