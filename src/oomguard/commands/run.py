"""``oomguard run`` on the command line: flags to a RunConfig, then supervise."""

from __future__ import annotations

from oomguard.commands.flags import text
from oomguard.commands.plan import Values, parse_count, parse_number, shape_from_flags
from oomguard.errors import UsageError
from oomguard.supervisor.events import EventLog
from oomguard.supervisor.restart import RestartPolicy
from oomguard.supervisor.supervise import RunConfig, Supervisor
from oomguard.units import parse_duration


def _duration(values: Values, key: str, default: float) -> float:
    given = text(values, key)
    return default if given is None else parse_duration(given, "--" + key.replace("_", "-"))


def run_command(values: Values, command: list[str]) -> int:
    policy = RestartPolicy(
        text(values, "restart") or "on-failure",
        backoff_initial=_duration(values, "backoff_initial", 1.0),
        backoff_max=_duration(values, "backoff_max", 300.0),
        backoff_factor=parse_number(str(values["backoff_factor"]), "--backoff-factor")
        if text(values, "backoff_factor")
        else 2.0,
        healthy_after=_duration(values, "healthy_after", 600.0),
        max_restarts=parse_count(str(values["max_restarts"]), "--max-restarts")
        if text(values, "max_restarts")
        else None,
        window=_duration(values, "restart_window", 600.0),
    )
    min_conc = (
        parse_count(str(values["min_concurrency"]), "--min-concurrency") if text(values, "min_concurrency") else 1
    )
    config = RunConfig(
        command,
        budget=text(values, "budget"),
        margin=text(values, "margin"),
        shape=shape_from_flags(values, required=False),
        policy=policy,
        on_oom=text(values, "on_oom"),
        min_concurrency=max(1, min_conc),
        stop_timeout=_duration(values, "stop_timeout", 30.0),
        isolate=bool(values.get("isolate")),
    )
    try:
        log = EventLog(text(values, "events"))
    except OSError as exc:
        raise UsageError(f"--events: cannot open {values['events']}: {exc.strerror}") from None
    from oomguard.commands.agent import forwarder

    sink = forwarder(values)
    if sink is not None:
        log.sinks.append(sink)
    try:
        return Supervisor(config, log).run()
    finally:
        log.close()
        if sink is not None:
            sink.close()
