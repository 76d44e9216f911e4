"""``oomguard run``: flags to a RunConfig, then supervise the worker.

Everything after ``--`` (or from the first word that is not an option) is the worker's command
line, passed through untouched: ``oomguard run --restart never sh -c 'exit 3'``.
"""

from __future__ import annotations

import argparse

from oomguard.commands import flags
from oomguard.commands.agent import add_fleet_options
from oomguard.errors import EXIT_NOT_FOUND, EXIT_THRESHOLD, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard.supervisor.config import GuardSettings
    from oomguard.supervisor.restart import RestartPolicy

SUMMARY = (
    "Supervise a worker: compute its budget (and concurrency) before each start, pass it in "
    "OOMGUARD_BUDGET_BYTES / OOMGUARD_BUDGET / OOMGUARD_CONCURRENCY and the placeholders {budget_bytes}, "
    "{budget}, {budget_gib}, {total_budget_bytes}, {concurrency}, {per_job_bytes}, {jobs_budget_bytes}, "
    "{jobs_bytes} in its arguments and in config files (--render; CuZK's own config: --cuzk), "
    "start nothing with a budget that cannot work (exit 3), tell OOM kills (of the worker or a "
    "descendant) from other deaths, restart with backoff and one less concurrency (or a larger margin) "
    "after an OOM kill. With --guard, watch the worker's cgroup every 100 ms and stop it gracefully before "
    "the kernel's OOM killer acts (docs/guard.md)."
)
EPILOG = (
    f"Exit status: the worker's (128 + signal when it was killed); {EXIT_THRESHOLD} when the budget cannot "
    "work (0, below the plan's baseline + one job, or an explicit budget above the hard ceiling without "
    f"--allow-over-limit); {EXIT_NOT_FOUND} when CMD cannot be run.\n"
    "The worker inherits this environment without oomguard's secrets: every OOMGUARD_* variable (in any "
    "case) whose name holds TOKEN, SECRET, PASSWORD, PASSWD, PASSPHRASE, CREDENTIAL, AUTH, KEY or COOKIE is removed "
    "(OOMGUARD_AGENT_TOKEN, OOMGUARD_FLEET_SECRETS, ...; docs/run.md).\n" + flags.DURATIONS + "\n" + flags.SIZES
)
ON_OOM = ("concurrency", "margin")


def _restart_options(parser: argparse.ArgumentParser) -> None:
    from oomguard.supervisor.restart import RESTART_MODES

    group = parser.add_argument_group("restart options")
    flags.option(group, "--restart", "on-failure (default), always or never", "WHEN", type=flags.OneOf(RESTART_MODES))
    flags.option(group, "--backoff-initial", "first restart delay (default 1s)", "DURATION")
    flags.option(group, "--backoff-max", "longest restart delay (default 5m)", "DURATION")
    flags.option(group, "--backoff-factor", "delay multiplier per consecutive restart (default 2)", "X")
    flags.option(
        group, "--healthy-after", "uptime that resets the backoff and lifts OOM step-downs (default 10m)", "DURATION"
    )
    flags.option(group, "--max-restarts", "give up after N restarts within --restart-window (default: no limit)", "N")
    flags.option(group, "--restart-window", "window for --max-restarts (default 10m)", "DURATION")
    flags.option(
        group,
        "--on-oom",
        "after an OOM kill: concurrency (default with plan flags: one less job) or "
        "margin (default otherwise: a larger safety margin)",
        "WHAT",
        type=flags.OneOf(ON_OOM),
    )
    flags.option(group, "--min-concurrency", "never fewer jobs than N after OOM kills (default 1)", "N")
    flags.option(group, "--stop-timeout", "SIGKILL this long after forwarding a stop signal (default 30s)", "DURATION")


def _guard_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("guard options (docs/guard.md)")
    flags.option(
        group,
        "--guard",
        "sample the worker's memory cgroup every 100 ms (20 ms near the ceiling; woken by the kernel too: v1 at "
        "the stop line and while the group reclaims at its limit, v2 on memory.events high and max): signal it "
        "at the budget, stop it (SIGTERM, then "
        "SIGKILL after --stop-timeout) near the ceiling, restart it asking for less, before the kernel acts",
    )
    flags.option(
        group,
        "--guard-margin",
        "stop the worker when its working set is this close to the ceiling: SIZE or PCT% of the ceiling "
        "(default max(64MiB, 2%))",
        "SPEC",
    )
    flags.option(
        group,
        "--grace-bytes",
        "room kept under the stop line for the worker's graceful stop: the guard stops it this much "
        "earlier (default 0; the exit event says how much it grew after SIGTERM, and later starts keep "
        "more when an earlier stop grew more, docs/guard.md)",
        "SIZE",
    )
    flags.option(
        group,
        "--on-pressure",
        "signal sent to the worker when its working set reaches the budget (default none; e.g. SIGUSR1)",
        "SIGNAL",
    )


def _config_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("config files (docs/run.md, docs/cuzk.md)")
    group.add_argument(
        "--render",
        nargs=2,
        action="append",
        metavar=("TEMPLATE", "OUTPUT"),
        help="before each start, write OUTPUT from TEMPLATE with its placeholders ({budget_bytes}, "
        "{total_budget_bytes}, ...) filled in, as in the worker's arguments (repeatable)",
    )
    flags.option(
        group,
        "--cuzk",
        "run CuZK (cuzk-daemon): before each start, write the CuZK config TEMPLATE with [memory] "
        "total_budget set to the budget in bytes ({total_budget_bytes}; all else kept) to --cuzk-out, "
        "and pass it as --config; a --budget in the command is kept only where the daemon's --help lists it",
        "TEMPLATE",
    )
    flags.option(
        group, "--cuzk-out", "the config file --cuzk writes (default: beside TEMPLATE, NAME.oomguard.toml)", "FILE"
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = "%(prog)s [budget and plan options] [restart options] [--] CMD ARGS..."
    parser.description = SUMMARY
    parser.epilog = EPILOG
    flags.add_budget(
        parser, budget_help="auto (default), SIZE or PCT% of the basis; passed through unchanged", root=False
    )
    flags.add_shape(parser)
    _restart_options(parser)
    _guard_options(parser)
    _config_options(parser)
    flags.option(parser, "--isolate", "run the worker in its own memory cgroup limited to budget + margin")
    flags.add_allow_over_limit(parser)
    flags.option(parser, "--events", "append events as JSON lines to FILE", "FILE")
    add_fleet_options(parser, run=True)
    from oomguard.commands.learned import add_learned

    add_learned(parser, fleet=False)
    parser.add_argument("worker", nargs=argparse.REMAINDER, metavar="CMD ARGS", help="the worker's command line")


def _duration(args: argparse.Namespace, name: str, default: float) -> float:
    from oomguard.units import parse_duration

    given = flags.value(args, name)
    return default if given is None else parse_duration(given, "--" + name.replace("_", "-"))


def _policy(args: argparse.Namespace) -> RestartPolicy:
    from oomguard.supervisor.restart import RestartPolicy

    return RestartPolicy(
        args.restart or "on-failure",
        backoff_initial=_duration(args, "backoff_initial", 1.0),
        backoff_max=_duration(args, "backoff_max", 300.0),
        backoff_factor=flags.parse_number(args.backoff_factor, "--backoff-factor") if args.backoff_factor else 2.0,
        healthy_after=_duration(args, "healthy_after", 600.0),
        max_restarts=flags.parse_count(args.max_restarts, "--max-restarts") if args.max_restarts else None,
        window=_duration(args, "restart_window", 600.0),
    )


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The worker's command line: argparse keeps the ``--`` in front of a REMAINDER; drop that one."""
    argv = list(args.worker)
    return argv[1:] if argv[:1] == ["--"] else argv


def _guard(args: argparse.Namespace) -> GuardSettings | None:
    from oomguard.supervisor.config import settings_from

    if not args.guard:
        flags.needs(args, "--guard", ("--guard-margin", "--on-pressure", "--grace-bytes"))
        return None
    return settings_from(args.guard_margin, args.on_pressure, args.grace_bytes)


def execute(args: argparse.Namespace) -> int:
    from oomguard.commands.agent import _labels, forwarder
    from oomguard.commands.learned import learner
    from oomguard.labels import CLASS_LABEL
    from oomguard.supervisor.events import EventLog
    from oomguard.supervisor.observe import observation
    from oomguard.supervisor.supervise import RunConfig, Supervisor

    if not args.cuzk:
        flags.needs(args, "--cuzk", ("--cuzk-out",))
    manager = flags.value(args, "manager")
    if manager is not None:  # what cannot be sent is a usage error now, not a dead sender thread later
        from oomguard.agent.client import check_manager

        check_manager(manager)  # BadParameter: "--manager: ..."
        flags.token_from(args)
    min_conc = flags.parse_count(args.min_concurrency, "--min-concurrency") if args.min_concurrency else 1
    shape = flags.shape_from(args, required=False)
    config = RunConfig(
        worker_argv(args),
        budget=args.budget,
        margin=args.margin,
        shape=shape,
        policy=_policy(args),
        on_oom=args.on_oom,
        min_concurrency=max(1, min_conc),
        stop_timeout=_duration(args, "stop_timeout", 30.0),
        isolate=args.isolate,
        guard=_guard(args),
        allow_over_limit=flags.allowed_over_limit(args),
        learn=learner(args, shape),
        render=[(t, o) for t, o in args.render or ()],
        cuzk=(args.cuzk, args.cuzk_out) if args.cuzk else None,
    )
    try:
        log = EventLog(args.events)
    except OSError as exc:
        import errno

        why = "a FIFO that no process reads" if exc.errno == errno.ENXIO else exc.strerror
        raise UsageError(f"--events: cannot open {args.events}: {why}") from None
    supervisor = Supervisor(config, log)
    # Each exit's observation is of the shape that run had: the declared one, or --learned's.
    node_class = _labels(args).get(CLASS_LABEL) if flags.value(args, "manager") else None
    observe = (lambda exit_event: observation(exit_event, supervisor.shape, node_class)) if config.shape else None
    sink = forwarder(args, observe)
    if sink is not None:
        log.sinks.append(sink)
    try:
        return supervisor.run()
    finally:
        log.close()
        if sink is not None:
            sink.close()
