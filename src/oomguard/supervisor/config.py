"""What a worker of ``oomguard run`` is given: the run's settings, its arguments and environment.

The settings are a ``RunConfig`` (usage errors are raised there, before anything starts), with
the ``--guard`` flags as a ``GuardSettings`` (``settings_from``; the guard is ``guard.py``).

The worker gets its budget as variables and as placeholders in its arguments (docs/run.md):

| placeholder              | variable                        | value                                     |
|--------------------------|---------------------------------|-------------------------------------------|
| ``{budget_bytes}``       | ``OOMGUARD_BUDGET_BYTES``       | the budget in bytes                       |
| ``{budget}``             | ``OOMGUARD_BUDGET``             | the same, exact: "21694MiB"               |
| ``{budget_gib}``         |                                 | whole GiB, rounded down                   |
| ``{total_budget_bytes}`` | ``OOMGUARD_TOTAL_BUDGET_BYTES`` | the budget less the jobs stepped down (3) |
| ``{concurrency}``        | ``OOMGUARD_CONCURRENCY``        | the jobs to run (1)                       |
| ``{per_job_bytes}``      | ``OOMGUARD_PER_JOB_BYTES``      | the shape's per-job size (1)              |
| ``{jobs_budget_bytes}``  | ``OOMGUARD_JOBS_BUDGET_BYTES``  | budget - baseline: memory for jobs (1)    |
| ``{jobs_bytes}``         | ``OOMGUARD_JOBS_BYTES``         | concurrency x per-job (1, 2)              |

(1) with plan flags only. (2) the memory of the jobs run now: it follows each OOM step-down.
(3) for a program that plans its own jobs inside one total (CuZK's ``total_budget``): the budget,
less one per-job for each job an OOM step-down took away (``{budget_bytes}`` without plan flags,
and before any step-down): the whole budget, its baseline included, never only the jobs' share.

The same placeholders fill in config files (``run --render TEMPLATE OUTPUT``, ``templates.py``);
``run --cuzk`` writes ``{total_budget_bytes}`` into CuZK's ``[memory] total_budget`` (``cuzk.py``).

A placeholder is a name in braces, ``{budget}``. A name that looks like one of oomguard's
but is not (``{budjet}``, ``{jobs}``, ``{budget_mib}``: close to a known name, or holding one
of its stems), or a plan placeholder without plan flags, is a usage error that names it,
before anything starts: a typo would otherwise reach the worker as text. Any other braces
pass through unchanged: shell parameters (``${HOME}``, ``${x}``), f-string fields in
``python -c`` code (``{n}``, ``{n + 1}``), ``{'a': 1}``, awk's ``{print $1}``, JSON.
``{{name}}`` is the literal text ``{name}`` (as in ``str.format``).

The worker inherits ``run``'s environment except oomguard's own secrets (``is_secret_variable``):
``OOMGUARD_AGENT_TOKEN`` (which ``run --manager`` itself reads), the manager's
``OOMGUARD_VIEWER_TOKEN`` and ``OOMGUARD_ADMIN_TOKEN``, the fleet secrets, and any ``OOMGUARD_*``
variable, in any case, whose name holds TOKEN, SECRET, PASSWORD, PASSWD, PASSPHRASE, CREDENTIAL,
AUTH, KEY or COOKIE (``SECRET_WORDS``): a worker never holds a credential to speak for its node, or
for another. The variables above, which oomguard sets itself, are always the worker's.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import signal
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from oomguard.errors import UsageError
from oomguard.policy.plan import Shape
from oomguard.supervisor.restart import RestartPolicy
from oomguard.units import GiB, format_size_exact, parse_size, parse_size_or_percent

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Report
    from oomguard.supervisor.templates import Rendered

ALWAYS = ("budget_bytes", "budget", "budget_gib", "total_budget_bytes")
WITH_PLAN = ("concurrency", "per_job_bytes", "jobs_budget_bytes", "jobs_bytes")
_TOKEN = re.compile(r"\{\{([A-Za-z_]\w*)\}\}|(?<!\$)\{([A-Za-z_]\w*)\}")
# A name holding one of these (case aside) is taken for a mistyped placeholder, not for the worker's text.
_STEMS = ("budget", "job", "concurr", "gib")


def _placeholder_like(name: str) -> list[str]:
    """The known placeholder *name* looks like a typo of, or nothing: then it is the worker's own text."""
    lower, known = name.lower(), (*ALWAYS, *WITH_PLAN)
    close = difflib.get_close_matches(lower, known, n=1, cutoff=0.75)
    if close or not any(stem in lower for stem in _STEMS):
        return close
    return difflib.get_close_matches(lower, known, n=1, cutoff=0.0)


def _replace(arg: str, values: dict[str, str], where: str = "the worker's arguments") -> str:
    def one(m: re.Match[str]) -> str:
        literal, name = m.group(1), m.group(2)
        if literal is not None:
            return "{" + literal + "}"
        if name in values:
            return values[name]
        if name in WITH_PLAN:
            raise UsageError(f"run: the placeholder {{{name}}} needs plan flags (--per-job or --profile)")
        like = _placeholder_like(name)
        if not like:
            return m.group(0)  # the worker's own braces: an f-string field, a template
        hint = f"did you mean {{{like[0]}}}? "
        known = ", ".join("{" + k + "}" for k in (*ALWAYS, *WITH_PLAN))
        raise UsageError(
            f"run: unknown placeholder {{{name}}} in {where} ({hint}known: {known}; "
            f"write {{{{{name}}}}} for a literal {{{name}}})"
        )

    return _TOKEN.sub(one, arg)


def substitute(args: list[str], values: dict[str, str]) -> list[str]:
    """Replace ``{name}`` placeholders by *values*, ``{{name}}`` by ``{name}``; ``UsageError`` for a mistyped one."""
    return [_replace(arg, values) for arg in args]


def fill_text(where: str) -> Callable[[str, dict[str, str]], str]:
    """The ``Rendered`` fill of ``run --render``: the placeholders in a config file's text (*where*
    names it in errors), as in the worker's arguments."""
    return lambda text, values: _replace(text, values, where)


def check_placeholders(command: list[str], with_plan: bool) -> None:
    """Raise ``UsageError`` now for what ``substitute`` would refuse at the first start."""
    names = ALWAYS + (WITH_PLAN if with_plan else ())
    substitute(command, dict.fromkeys(names, ""))


# oomguard's own secrets, by name, and the rule that also catches the ones added later.
SECRET_VARIABLES = frozenset(
    {
        "OOMGUARD_AGENT_TOKEN",  # the agent's bearer token (run --manager, agent)
        "OOMGUARD_VIEWER_TOKEN",  # the manager's dashboard token
        "OOMGUARD_ADMIN_TOKEN",  # the manager's admin token
        "OOMGUARD_FLEET_SECRET",  # the manager's per-node credentials' secret
        "OOMGUARD_FLEET_SECRETS",  # the same, several during a rollover
    }
)
# A word that, anywhere in an OOMGUARD_* name (in any case), makes it a secret's: CREDENTIAL holds
# CREDENTIALS, KEY holds API_KEY and KEYS, AUTH holds AUTHORIZATION. Better a variable of
# oomguard's kept from the worker for nothing than a secret handed to it.
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "AUTH", "KEY", "COOKIE")
# What oomguard itself gives the worker (``worker_env_and_args``): never taken for a secret.
WORKER_VARIABLES = frozenset(
    {"OOMGUARD_BUDGET_BYTES", "OOMGUARD_BUDGET", "OOMGUARD_TOTAL_BUDGET_BYTES", "OOMGUARD_CONCURRENCY"}
    | {"OOMGUARD_" + name.upper() for name in WITH_PLAN[1:]}
)


def is_secret_variable(name: str) -> bool:
    """True for a variable of oomguard's that holds, or leads to, a secret: one of
    ``SECRET_VARIABLES``, or a name that starts with ``OOMGUARD_`` and holds one of ``SECRET_WORDS``,
    both in any case (``OOMGUARD_Secret``, ``oomguard_agent_token``, ``OOMGUARD_AGENT_TOKEN_FILE``:
    the path to the token is none of the worker's business either). ``WORKER_VARIABLES`` never are;
    other names (``HF_TOKEN``, ``MY_APP_PASSWORD``) are the worker's own and never are either."""
    upper = name.upper()
    if upper in WORKER_VARIABLES:
        return False
    if upper in SECRET_VARIABLES:
        return True
    return upper.startswith("OOMGUARD_") and any(word in upper for word in SECRET_WORDS)


def worker_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """*environ* without oomguard's own secrets (``is_secret_variable``)."""
    return {k: v for k, v in environ.items() if not is_secret_variable(k)}


# ``run --guard`` (supervisor/guard.py): how often it samples, how often near the ceiling (the
# working set within NEAR_MARGINS guard margins of it), and the full-stall time under memory.high
# that stops the worker.
GUARD_INTERVAL = 0.1
FAST_INTERVAL = 0.02
NEAR_MARGINS = 4
STALL_LIMIT = 10.0


class GuardSettings(NamedTuple):
    """``--guard-margin`` as (bytes, None), (None, percent) or (None, None) for the default; the
    ``--on-pressure`` signal (None: none); how often to sample, and how often near the ceiling;
    the stall time that stops; whether to ask the kernel for wake-ups (supervisor/alarm.py);
    ``--grace-bytes``, the room kept under the stop line for the worker's graceful stop."""

    margin: tuple[int | None, float | None] = (None, None)
    on_pressure: int | None = None
    interval: float = GUARD_INTERVAL
    stall_limit: float = STALL_LIMIT
    fast_interval: float = FAST_INTERVAL
    kernel_alarm: bool = True
    grace: int = 0


def parse_signal(text: str, flag: str = "--on-pressure") -> int | None:
    """``none``, ``SIGUSR1``, ``USR1`` or ``10`` -> the signal number (None for none)."""
    word = text.strip()
    if word.lower() == "none":
        return None
    if word.isascii() and word.isdigit():
        with contextlib.suppress(ValueError):
            return int(signal.Signals(int(word)))
    name = word.upper() if word.upper().startswith("SIG") else "SIG" + word.upper()
    if name in signal.Signals.__members__:
        return int(signal.Signals[name])
    raise UsageError(f"{flag}: expected a signal (SIGUSR1, USR1, 10) or none, got {text!r}")


def settings_from(margin: str | None, on_pressure: str | None, grace: str | None = None) -> GuardSettings:
    """The guard's settings from the flags' text; ``UsageError`` naming the flag."""
    spec = parse_size_or_percent(margin, "--guard-margin") if margin is not None else (None, None)
    room = 0 if grace is None else parse_size(grace, "--grace-bytes")
    return GuardSettings(spec, parse_signal(on_pressure) if on_pressure is not None else None, grace=room)


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
        guard: GuardSettings | None = None,
        allow_over_limit: bool = False,
        learn: Callable[[Shape, Report], tuple[Shape, dict[str, Any]]] | None = None,
        render: list[tuple[str, str]] | None = None,
        cuzk: tuple[str, str | None] | None = None,
    ) -> None:
        if not command:
            raise UsageError("run: missing the command to run (oomguard run [options] -- CMD ARGS...)")
        self.notes: list[str] = []  # lines said once on stderr before the first start
        self.rendered = [self._render(t, o, shape is not None) for t, o in render or ()]
        if cuzk is not None:
            command = self._cuzk(command, *cuzk)
        if on_oom not in (None, "concurrency", "margin"):
            raise UsageError(f"--on-oom: expected concurrency or margin, got {on_oom!r}")
        if on_oom == "concurrency" and shape is None:
            raise UsageError("--on-oom concurrency needs plan flags (--per-job or --profile)")
        check_placeholders(command, shape is not None)
        self.command = command
        self.budget = budget
        self.margin = margin
        self.shape = shape
        self.policy = policy or RestartPolicy()
        self.on_oom = on_oom or ("concurrency" if shape is not None else "margin")
        self.min_concurrency = min_concurrency
        self.stop_timeout = stop_timeout
        self.isolate = isolate
        self.allow_over_limit = allow_over_limit  # an explicit budget above the ceiling may start
        self.guard = guard
        # --learned: (declared shape, this start's report) -> (the shape to plan with, the decision)
        self.learn = learn if shape is not None else None

    @staticmethod
    def _render(template: str, output: str, with_plan: bool) -> Rendered:
        from oomguard.supervisor.templates import Rendered

        r = Rendered(template, output, "--render", fill_text(template))
        names = ALWAYS + (WITH_PLAN if with_plan else ())
        r.check(dict.fromkeys(names, "1"))
        return r

    def _cuzk(self, command: list[str], template: str, output: str | None) -> list[str]:
        """``--cuzk``: the config CuZK reads, written from *template*; CuZK's command line told of it."""
        from oomguard.supervisor import cuzk
        from oomguard.supervisor.templates import Rendered

        out = output or cuzk_output(template)
        r = Rendered(template, out, "--cuzk", *cuzk.editor("--cuzk"))
        r.check({"total_budget_bytes": "1"})
        self.rendered.append(r)
        command, said = cuzk.without_budget_flag(command)
        if said is not None:
            self.notes.append(said)
        return cuzk.with_config(command, out)


def cuzk_output(template: str) -> str:
    """Where ``--cuzk`` writes without ``--cuzk-out``: beside the template, ``cuzk.toml`` ->
    ``cuzk.oomguard.toml``."""
    stem, dot, ext = template.rpartition(".")
    if not dot or "/" in ext:
        return template + ".oomguard"
    return f"{stem}.oomguard.{ext}"


def worker_values(
    budget: int, concurrency: int | None, shape: Shape | None, planned: int | None = None
) -> dict[str, str]:
    """The placeholders' values for one start (the plan's only with a shape and a concurrency);
    *planned* is the plan's concurrency before OOM step-downs (``{total_budget_bytes}``)."""
    total = budget
    if shape is not None and concurrency is not None and planned is not None and planned > concurrency:
        total = max(0, budget - (planned - concurrency) * shape.per_job)
    values = {
        "budget_bytes": str(budget),
        "budget": format_size_exact(budget),
        "budget_gib": str(budget // GiB),
        "total_budget_bytes": str(total),
    }
    if shape is not None and concurrency is not None:
        values |= {
            "concurrency": str(concurrency),
            "per_job_bytes": str(shape.per_job),
            "jobs_budget_bytes": str(max(0, budget - shape.baseline)),
            "jobs_bytes": str(concurrency * shape.per_job),
        }
    return values


def worker_env_and_args(
    command: list[str],
    budget: int,
    concurrency: int | None,
    shape: Shape | None = None,
    values: dict[str, str] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """The worker's environment (this process's, less oomguard's secrets, plus the budget variables)
    and its arguments (*values*: ``worker_values``' own, when the caller has them already)."""
    values = values or worker_values(budget, concurrency, shape)
    env = {
        **worker_environ(os.environ),
        "OOMGUARD_BUDGET_BYTES": values["budget_bytes"],
        "OOMGUARD_BUDGET": values["budget"],
        "OOMGUARD_TOTAL_BUDGET_BYTES": values["total_budget_bytes"],
    }
    if concurrency is not None:
        env["OOMGUARD_CONCURRENCY"] = str(concurrency)
    for name in WITH_PLAN[1:]:
        if name in values:
            env["OOMGUARD_" + name.upper()] = values[name]
    return env, substitute(command, values)
