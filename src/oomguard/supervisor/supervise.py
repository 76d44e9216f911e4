"""``oomguard run``: start a worker with its budget passed explicitly, tell OOM kills apart, restart.

Before each start the probe runs again (limits change at run time), the budget (and, with a
job shape, the concurrency) is computed, and the worker gets ``OOMGUARD_BUDGET_BYTES``,
``OOMGUARD_BUDGET`` and ``OOMGUARD_CONCURRENCY`` plus placeholders in its arguments.

The worker runs in its own process group and session; SIGTERM, SIGINT and SIGHUP sent to the
supervisor go to that group, and ``stop_timeout`` later SIGKILL follows. The supervisor is a
child subreaper, kills what is left of the group when the worker exits, and reaps everything:
no zombies, no orphans. The worker also gets SIGKILL should the supervisor itself die.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

from oomguard.errors import EXIT_THRESHOLD, BudgetUnknownError, CommandNotFoundError, UsageError
from oomguard.policy.budget import default_margin, probe, resolve_budget
from oomguard.policy.plan import Shape, make_plan
from oomguard.probes.memory import read_oom_kills
from oomguard.sources.root import LiveRoot
from oomguard.supervisor.events import EventLog
from oomguard.supervisor.isolate import Isolation
from oomguard.supervisor.restart import RestartPolicy
from oomguard.units import GiB, MiB, format_size, format_size_exact

PLACEHOLDERS = ("{budget_bytes}", "{budget_gib}", "{budget}", "{concurrency}")
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _prctl(option: int, value: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def classify(returncode: int, oom_before: int | None, oom_after: int | None) -> tuple[str, str | None]:
    """("clean"|"exit"|"signal"|"oom-kill", a note when the OOM counter could not be read)."""
    if returncode == 0:
        return "clean", None
    if returncode > 0:
        return "exit", None
    if returncode == -signal.SIGKILL:
        if oom_before is None or oom_after is None:
            return "signal", "no oom_kill counter is readable: an OOM kill cannot be told from another SIGKILL"
        if oom_after > oom_before:
            return "oom-kill", None
    return "signal", None


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
    def __init__(
        self,
        command: list[str],
        *,
        budget: str | None = None,
        margin: str | None = None,
        root: str | None = None,
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
        self.root = root
        self.shape = shape
        self.policy = policy or RestartPolicy()
        self.on_oom = on_oom or ("concurrency" if shape is not None else "margin")
        self.min_concurrency = min_concurrency
        self.stop_timeout = stop_timeout
        self.isolate = isolate


class Supervisor:
    def __init__(
        self,
        config: RunConfig,
        log: EventLog,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cfg = config
        self.log = log
        self.clock = clock
        self.sleep = sleep
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping: int | None = None  # the operator's signal, once one came
        self.concurrency_cap: int | None = None
        self.extra_margin = 0

    # -- signals ---------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = signum
        if self.child is not None and self.child.returncode is None:
            self._killpg(signum)
            signal.setitimer(signal.ITIMER_REAL, max(self.cfg.stop_timeout, 0.001))

    def _on_alarm(self, signum: int, frame: object) -> None:
        self._killpg(signal.SIGKILL)

    def _killpg(self, signum: int) -> None:
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signum)

    # -- one start -------------------------------------------------------------------------
    def _prepare(self) -> tuple[dict[str, Any], int | None]:
        """(report, concurrency), computed afresh before each start."""
        report: Any = probe(root=self.cfg.root, budget=self.cfg.budget, margin=self.cfg.margin)
        b = report["budget"]
        if self.extra_margin and b["source"] == "auto" and b["safety_margin_bytes"] is not None:
            margin = b["safety_margin_bytes"] + self.extra_margin
            resolve_budget(report, budget=self.cfg.budget, margin=str(margin), env=LiveRoot().environ())
        if report["budget"]["bytes"] is None:
            raise BudgetUnknownError("run")
        concurrency = None
        if self.cfg.shape is not None:
            planned: int = make_plan(report, self.cfg.shape)["concurrency"]  # type: ignore[assignment]
            concurrency = planned if self.concurrency_cap is None else min(planned, self.concurrency_cap)
        return report, concurrency

    def _env_and_args(self, budget: int, concurrency: int | None) -> tuple[dict[str, str], list[str]]:
        values = {
            "budget_bytes": str(budget),
            "budget": format_size_exact(budget),
            "budget_gib": str(budget // GiB),
        }
        env = {**os.environ, "OOMGUARD_BUDGET_BYTES": values["budget_bytes"], "OOMGUARD_BUDGET": values["budget"]}
        if concurrency is not None:
            values["concurrency"] = str(concurrency)
            env["OOMGUARD_CONCURRENCY"] = values["concurrency"]
        return env, substitute(self.cfg.command, values)

    def _spawn(self, env: dict[str, str], args: list[str], isolation: Isolation | None) -> subprocess.Popen[bytes]:
        def in_child() -> None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if isolation is not None:
                isolation.place_self()

        try:
            return subprocess.Popen(args, env=env, start_new_session=True, preexec_fn=in_child)  # noqa: PLW1509
        except FileNotFoundError:
            raise CommandNotFoundError(f"run: command not found: {args[0]!r}") from None
        except PermissionError:
            raise CommandNotFoundError(f"run: cannot execute {args[0]!r}: permission denied") from None

    def _isolation(self, report: dict[str, Any], budget: int) -> Isolation | None:
        if not self.cfg.isolate:
            return None
        margin = report["budget"]["safety_margin_bytes"] or default_margin(budget)
        iso, why = Isolation.create(report, budget + margin, f"oomguard-run-{os.getpid()}")  # type: ignore[arg-type]
        self.log.stderr.write(f"oomguard run: {'isolate: ' + why if iso else 'cannot isolate: ' + why}\n")
        return iso

    def _wait(self) -> tuple[int, int | None]:
        """Block until the worker exits: (returncode as Popen gives it, peak RSS bytes)."""
        assert self.child is not None
        _, status, usage = os.wait4(self.child.pid, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.child.returncode = os.waitstatus_to_exitcode(status)
        return self.child.returncode, usage.ru_maxrss * 1024 or None

    def _cleanup_group(self) -> None:
        """Kill what is left of the worker's process group and reap every child."""
        self._killpg(signal.SIGKILL)
        deadline = self.clock() + 2.0
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                if self.clock() > deadline:
                    _kill_children(os.getpid())
                    deadline = self.clock() + 2.0
                time.sleep(0.01)

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        previous = {s: signal.signal(s, self._on_signal) for s in FORWARDED}
        previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._on_alarm)
        try:
            return self._loop()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _loop(self) -> int:
        while True:
            report, concurrency = self._prepare()
            budget = int(report["budget"]["bytes"])
            if report["budget"]["source"] == "auto":
                budget = budget // MiB * MiB  # whole MiB, so {budget} reads "21694MiB"
            if concurrency == 0:
                self.log.emit(
                    "give-up",
                    budget_bytes=budget,
                    concurrency=0,
                    message="the plan fits 0 jobs in this budget; not starting the worker",
                )
                return EXIT_THRESHOLD
            if self.stopping is not None:  # stopped while the budget was computed: start nothing
                self.log.emit(
                    "stop",
                    budget_bytes=budget,
                    concurrency=concurrency,
                    message=f"stopped by signal {self.stopping} before the start",
                )
                return 128 + self.stopping
            env, args = self._env_and_args(budget, concurrency)
            isolation = self._isolation(report, budget)
            oom_source = isolation.oom_source if isolation else (report["memory"]["oom"] or {}).get("source")
            before = read_oom_kills(LiveRoot(), oom_source)
            started = self.clock()
            self.child = self._spawn(env, args, isolation)
            pid = self.child.pid
            self.log.emit("start", pid=pid, budget_bytes=budget, concurrency=concurrency)
            if self.stopping is not None:  # a signal between spawn and now
                self._on_signal(self.stopping, None)
            rc, peak = self._wait()
            after = read_oom_kills(LiveRoot(), oom_source)
            self._cleanup_group()
            if isolation is not None:
                peak = isolation.peak() or peak
                isolation.remove()
            uptime = self.clock() - started
            reason, note = classify(rc, before, after)
            status = rc if rc >= 0 else 128 - rc
            common = {
                "pid": pid,
                "budget_bytes": budget,
                "concurrency": concurrency,
                "reason": reason,
                "exit_code": rc if rc >= 0 else None,
                "signal": -rc if rc < 0 else None,
            }
            self.log.emit("exit", duration_s=round(uptime, 3), peak_bytes=peak, message=note, **common)
            if self.stopping is not None:
                self.log.emit("stop", message=f"stopped by signal {self.stopping}", **common)
                return status
            if not self.cfg.policy.wants_restart(reason, False):
                return status
            now = self.clock()
            if self.cfg.policy.gives_up(now):
                self.log.emit(
                    "give-up",
                    message=f"{self.cfg.policy.max_restarts} restarts within {self.cfg.policy.window:g}s",
                    **common,
                )
                return status
            lowered = self._after_oom(report, concurrency) if reason == "oom-kill" else None
            delay = self.cfg.policy.next_delay(uptime, now)
            self.log.emit("restart", delay_s=delay, message=lowered, **common)
            if not self._backoff(delay):
                self.log.emit("stop", message=f"stopped by signal {self.stopping} during backoff", **common)
                return status

    def _after_oom(self, report: dict[str, Any], concurrency: int | None) -> str:
        if self.cfg.on_oom == "concurrency" and concurrency is not None:
            lowered = max(self.cfg.min_concurrency, concurrency - 1)
            self.concurrency_cap = lowered
            if lowered == concurrency:
                return f"after an OOM kill: concurrency stays {concurrency} (--min-concurrency)"
            return f"after an OOM kill: concurrency {concurrency} -> {lowered}"
        b = report["budget"]
        if b["source"] != "auto":
            return f"after an OOM kill: the {b['source']} budget is kept as given (only an auto budget is lowered)"
        step = max(256 * MiB, int((b["basis_bytes"] or 0) * 0.05))
        self.extra_margin += step
        return f"after an OOM kill: safety margin raised by {format_size(step)} (now +{format_size(self.extra_margin)})"

    def _backoff(self, delay: float) -> bool:
        """Sleep *delay* seconds; False if an operator's signal came meanwhile."""
        end = self.clock() + delay
        while self.stopping is None:
            left = end - self.clock()
            if left <= 0:
                return True
            self.sleep(min(left, 0.1))
        return False


def _kill_children(parent: int) -> None:
    """SIGKILL every process whose parent is *parent* (orphans that left the worker's group)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
