"""Every exit code oomguard can return, once; and the exceptions that carry them.

Problems found while probing are not exceptions: they become warnings in the report.
Exceptions are for usage and input errors, thresholds and failures the command line
turns into one line on stderr and the exit code on the class (click's habit).

``EXIT_CODES`` is the one table: ``oomguard --help``, each command's help and the README's
table are generated from it (a test checks the README).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_USAGE = 2  # bad flag, bad size or variable, missing, corrupt or too large snapshot or file
EXIT_THRESHOLD = 3  # a --require style threshold was not met
EXIT_VERIFY_FAILED = 4  # verify: the machine did not deliver the memory
EXIT_REJECTED = 65  # EX_DATAERR (sysexits.h): the manager refused the report itself (422, 400, 413, ...)
EXIT_INTERNAL = 70  # EX_SOFTWARE (sysexits.h): the agent gave up after repeated internal errors
EXIT_LOST = 74  # EX_IOERR (sysexits.h): the report could neither be spooled nor delivered
EXIT_SPOOLED = 75  # EX_TEMPFAIL (sysexits.h): spooled, a later run delivers it
EXIT_TOKEN_REFUSED = 77  # EX_NOPERM (sysexits.h): the manager refused the agent's token (401, 403)
EXIT_WRONG_URL = 78  # EX_CONFIG (sysexits.h): no manager API at --manager (404, 405, a redirect)
EXIT_NOT_FOUND = 127  # run: the worker's command cannot be started (as a shell says)
EXIT_INTERRUPTED = 130  # 128 + SIGINT

# (code, meaning), every EXIT_* above once, in order: the help text and the README's table.
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "ok (check exits 0 with warnings too: they are in the report)"),
    (
        EXIT_USAGE,
        "usage or input error: bad flag, size or variable (one line naming it); missing, corrupt or too large "
        "snapshot; a file flag naming a FIFO, a device or too large a file; "
        "agent: a --spool directory that cannot be created, read or written",
    ),
    (
        EXIT_THRESHOLD,
        "a threshold was not met (--require, --require-jobs; run: a budget that cannot work; "
        "check --require, plan --require-jobs, run: an explicit budget above the hard ceiling, "
        "without --allow-over-limit; verify: the plan fits no job)",
    ),
    (
        EXIT_VERIFY_FAILED,
        "verification failed (verify: an OOM kill, a failed allocation or a child that could not start)",
    ),
    (
        EXIT_REJECTED,
        "agent --once: the manager rejected the report (422 or another 4xx); it is in rejected/",
    ),
    (EXIT_INTERNAL, "agent: gave up after repeated internal errors in a row (tracebacks on stderr)"),
    (EXIT_LOST, "agent --once: the report is lost: it could not be spooled (disk full?) and not delivered"),
    (EXIT_SPOOLED, "agent --once: the report was spooled, to be delivered later"),
    (EXIT_TOKEN_REFUSED, "agent --once: the manager refused the token (401/403); the report is in rejected/"),
    (EXIT_WRONG_URL, "agent --once: wrong --manager URL (404, 405 or a redirect); the report is in rejected/"),
    (EXIT_NOT_FOUND, "run: the worker's command was not found or cannot be executed"),
    (EXIT_INTERRUPTED, "interrupted (SIGINT)"),
)


def exit_codes_help() -> str:
    """The table as the ``exit codes:`` section of ``--help``."""
    return "exit codes:\n" + "\n".join(f"  {code:<3} {meaning}" for code, meaning in EXIT_CODES)


def exit_codes_markdown() -> str:
    """The table as README markdown (a test compares it with the README)."""
    rows = "\n".join(f"| {code} | {meaning} |" for code, meaning in EXIT_CODES)
    return "| code | meaning |\n|---|---|\n" + rows


class OomguardError(Exception):
    """Base class; ``exit_code`` is what ``oomguard`` exits with; ``from_env``: {option: variable} of
    the options a variable gave (``cli`` names the variable in the message: commands/envflags.py)."""

    exit_code = EXIT_USAGE
    from_env: dict[str, str] | None = None


class UsageError(OomguardError):
    """A flag, environment variable or argument that cannot be used as given."""


class BadParameter(UsageError):
    """A bad value for the parameter *param*, named as the API names it (``per_job``, ``manager``).

    click's ``BadParameter(message, param=...)``: the library's words are its own parameter names,
    so ``Shape(per_job=0)`` says ``per_job: must be above 0`` to a library user, and the command
    line, which knows which flag fed the parameter, says ``--per-job: must be above 0``
    (``commands.flags.flag_message``). *message* does not repeat the name.
    """

    def __init__(self, param: str, message: str) -> None:
        self.param = param
        self.message = message
        super().__init__(f"{param}: {message}")


class SnapshotError(OomguardError):
    """A ``--root`` snapshot that is missing, unreadable or not a snapshot."""


class BudgetUnknownError(UsageError, ValueError):
    """No memory ceiling could be read, so no budget can be computed: give one explicitly.

    Also a ``ValueError``, which ``MemoryBudget.from_system()`` raised before.
    """

    def __init__(self, where: str, hint: str = "give --budget SIZE") -> None:
        super().__init__(f"{where}: the memory budget is unknown (no memory ceiling could be read); {hint}")


class ThresholdError(OomguardError):
    """A threshold such as ``--require`` was not met."""

    exit_code = EXIT_THRESHOLD


class VerifyFailedError(OomguardError):
    """``verify``: the machine did not deliver the memory."""

    exit_code = EXIT_VERIFY_FAILED


class CommandNotFoundError(OomguardError):
    """``run``: the worker's command cannot be started."""

    exit_code = EXIT_NOT_FOUND
