"""What a worker of ``oomguard run`` is given: the run's settings, its arguments and environment.

The worker gets its budget three ways: ``OOMGUARD_BUDGET_BYTES`` (bytes), ``OOMGUARD_BUDGET``
(exact, "21694MiB") and, with a job shape, ``OOMGUARD_CONCURRENCY``; and the placeholders
``{budget_bytes}``, ``{budget}``, ``{budget_gib}`` and ``{concurrency}`` in its arguments.
"""

from __future__ import annotations

import os

from oomguard.errors import UsageError
from oomguard.policy.plan import Shape
from oomguard.supervisor.restart import RestartPolicy
from oomguard.units import GiB, format_size_exact


def substitute(args: list[str], values: dict[str, str]) -> list[str]:
    """Replace ``{budget}``-style placeholders; other braces stay as they are."""
    out = []
    for arg in args:
        new = arg
        for key, value in values.items():
            new = new.replace("{" + key + "}", value)
        out.append(new)
    return out


class RunConfig:
    """The settings of one ``oomguard run``; usage errors are raised here, before anything starts."""

    def __init__(
        self,
        command: list[str],
        *,
        budget: str | None = None,
        margin: str | None = None,
        shape: Shape | None = None,
        policy: RestartPolicy | None = None,
        on_oom: str | None = None,
        min_concurrency: int = 1,
        stop_timeout: float = 30.0,
        isolate: bool = False,
    ) -> None:
        if not command:
            raise UsageError("run: missing the command to run (oomguard run [options] -- CMD ARGS...)")
        if on_oom not in (None, "concurrency", "margin"):
            raise UsageError(f"--on-oom: expected concurrency or margin, got {on_oom!r}")
        if on_oom == "concurrency" and shape is None:
            raise UsageError("--on-oom concurrency needs plan flags (--per-job or --profile)")
        if "{concurrency}" in " ".join(command) and shape is None:
            raise UsageError("run: the placeholder {concurrency} needs plan flags (--per-job or --profile)")
        self.command = command
        self.budget = budget
        self.margin = margin
        self.shape = shape
        self.policy = policy or RestartPolicy()
        self.on_oom = on_oom or ("concurrency" if shape is not None else "margin")
        self.min_concurrency = min_concurrency
        self.stop_timeout = stop_timeout
        self.isolate = isolate


def worker_env_and_args(command: list[str], budget: int, concurrency: int | None) -> tuple[dict[str, str], list[str]]:
    """The worker's environment (this process's plus the budget variables) and its arguments."""
    values = {
        "budget_bytes": str(budget),
        "budget": format_size_exact(budget),
        "budget_gib": str(budget // GiB),
    }
    env = {**os.environ, "OOMGUARD_BUDGET_BYTES": values["budget_bytes"], "OOMGUARD_BUDGET": values["budget"]}
    if concurrency is not None:
        values["concurrency"] = str(concurrency)
        env["OOMGUARD_CONCURRENCY"] = values["concurrency"]
    return env, substitute(command, values)
