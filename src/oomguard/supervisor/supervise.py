"""``oomguard run``: start a worker with its budget passed explicitly, tell OOM kills apart, restart.

Before each start the probe runs again (limits change at run time), the budget (and, with a
job shape, the concurrency) is computed, and the worker gets ``OOMGUARD_BUDGET_BYTES``,
``OOMGUARD_BUDGET`` and ``OOMGUARD_CONCURRENCY`` plus placeholders in its arguments.

The worker runs in its own process group and session; SIGTERM, SIGINT and SIGHUP sent to the
supervisor go to that group, and ``stop_timeout`` later SIGKILL follows. The supervisor is a
child subreaper, kills what is left of the group when the worker exits, and reaps everything:
no zombies, no orphans. The worker also gets SIGKILL should the supervisor itself die
(both through prctl(2), ``process.py``; a failed prctl is said once on stderr).

Every read of /proc and /sys (the probe before each start, the OOM-kill counter around each
run, the process table when orphans are hunted) goes through the ``Root`` the supervisor is
given: the live system by default, a fake tree in tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

from oomguard.errors import EXIT_THRESHOLD, BudgetUnknownError, CommandNotFoundError
from oomguard.policy.budget import default_margin, probe, resolve_budget
from oomguard.policy.plan import make_plan
from oomguard.probes.counters import read_oom_kills
from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import LiveRoot, Root
from oomguard.supervisor.config import RunConfig, substitute, worker_env_and_args
from oomguard.supervisor.events import EventLog
from oomguard.supervisor.exits import OOM_KILL, classify, exit_fields, shell_status
from oomguard.supervisor.isolate import Isolation
from oomguard.supervisor.process import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_PDEATHSIG,
    kill_orphans,
    load_libc,
    prctl_failure,
    set_prctl,
)
from oomguard.units import MiB, format_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Report

__all__ = ["RunConfig", "Supervisor", "oom_margin_step", "prepare_child", "substitute"]

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# After an OOM kill under --on-oom margin, an auto budget's safety margin grows by
# max(256 MiB, 5% of the basis) per kill (docs/run.md); 256 MiB is also the floor of the
# default margin (policy/budget.py MARGIN_MIN), so a small basis still moves visibly.
OOM_STEP_MIN = 256 * MiB
OOM_STEP_RATIO = 0.05


def oom_margin_step(basis_bytes: int | None) -> int:
    """How much an auto budget's margin grows after one OOM kill: max(256 MiB, 5% of the basis)."""
    return max(OOM_STEP_MIN, int((basis_bytes or 0) * OOM_STEP_RATIO))


def prepare_child(libc: Any, tell: bool, isolation: Isolation | None) -> None:
    """In the worker after fork, before exec: SIGKILL on the supervisor's death, then the group.

    Only a raw write(2) is safe here; *tell* False keeps a failed prctl quiet after the first start.
    """
    err = set_prctl(PR_SET_PDEATHSIG, signal.SIGKILL, libc)
    if err and tell:
        os.write(2, prctl_failure(PR_SET_PDEATHSIG, err).encode())
    if isolation is not None:
        try:
            isolation.place_self()
        except OSError as exc:  # the worker runs on, outside the group: said, not a traceback
            os.write(2, f"oomguard run: cannot move the worker into {isolation.path}: {exc.strerror}\n".encode())


class Supervisor:
    """Runs ``config.command`` until it is done; *root* is where it reads /proc and /sys (live by
    default, a fake tree in tests), *cgroupfs* where ``--isolate`` writes, *libc* what prctl goes to."""

    def __init__(
        self,
        config: RunConfig,
        log: EventLog,
        *,
        root: Root | None = None,
        cgroupfs: CgroupFS | None = None,
        libc: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cfg = config
        self.log = log
        self.root = root if root is not None else LiveRoot()
        self.cgroupfs = cgroupfs if cgroupfs is not None else CgroupFS()
        self.libc = libc if libc is not None else load_libc()
        self.clock = clock
        self.sleep = sleep
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping: int | None = None  # the operator's signal, once one came
        self.concurrency_cap: int | None = None
        self.extra_margin = 0
        self._deathsig_reported = False  # PR_SET_PDEATHSIG's failure is told by the first start only

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
    def _prepare(self) -> tuple[Report, int | None]:
        """(report, concurrency), computed afresh before each start."""
        report = probe(root=self.root, budget=self.cfg.budget, margin=self.cfg.margin)
        b = report["budget"]
        if self.extra_margin and b["source"] == "auto" and b["safety_margin_bytes"] is not None:
            margin = b["safety_margin_bytes"] + self.extra_margin
            resolve_budget(report, budget=self.cfg.budget, margin=str(margin), env=self.root.environ())
        if report["budget"]["bytes"] is None:
            raise BudgetUnknownError("run")
        concurrency = None
        if self.cfg.shape is not None:
            planned = make_plan(report, self.cfg.shape)["concurrency"]
            concurrency = planned if self.concurrency_cap is None else min(planned, self.concurrency_cap)
        return report, concurrency

    def _spawn(self, env: dict[str, str], args: list[str], isolation: Isolation | None) -> subprocess.Popen[bytes]:
        tell, self._deathsig_reported = not self._deathsig_reported, True

        def in_child() -> None:
            prepare_child(self.libc, tell, isolation)

        try:
            return subprocess.Popen(args, env=env, start_new_session=True, preexec_fn=in_child)  # noqa: PLW1509
        except FileNotFoundError:
            raise CommandNotFoundError(f"run: command not found: {args[0]!r}") from None
        except PermissionError:
            raise CommandNotFoundError(f"run: cannot execute {args[0]!r}: permission denied") from None

    def _isolation(self, report: Report, budget: int) -> Isolation | None:
        if not self.cfg.isolate:
            return None
        margin = report["budget"]["safety_margin_bytes"] or default_margin(budget)
        name = f"oomguard-run-{os.getpid()}"
        iso, why = Isolation.create(report, budget + margin, name, self.root, self.cgroupfs)
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
                    kill_orphans(self.root, os.getpid())
                    deadline = self.clock() + 2.0
                time.sleep(0.01)

    def _run_once(self, report: Report, budget: int, concurrency: int | None) -> tuple[int, dict[str, Any], float]:
        """Start the worker, wait for it, classify its end: (returncode, event fields, uptime)."""
        env, args = worker_env_and_args(self.cfg.command, budget, concurrency)
        isolation = self._isolation(report, budget)
        oom = report["memory"]["oom"]
        oom_source = isolation.oom_source if isolation else oom["source"] if oom else None
        before = read_oom_kills(self.root, oom_source)
        started = self.clock()
        self.child = self._spawn(env, args, isolation)
        pid = self.child.pid
        self.log.emit("start", pid=pid, budget_bytes=budget, concurrency=concurrency)
        if self.stopping is not None:  # a signal between spawn and now
            self._on_signal(self.stopping, None)
        rc, peak = self._wait()
        after = read_oom_kills(self.root, oom_source)
        self._cleanup_group()
        if isolation is not None:
            peak = isolation.peak() or peak
            isolation.remove()
        uptime = self.clock() - started
        reason, note = classify(rc, before, after)
        common = {"pid": pid, "budget_bytes": budget, "concurrency": concurrency, "reason": reason, **exit_fields(rc)}
        self.log.emit("exit", duration_s=round(uptime, 3), peak_bytes=peak, message=note, **common)
        return rc, common, uptime

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        err = set_prctl(PR_SET_CHILD_SUBREAPER, 1, self.libc)
        if err:
            self.log.stderr.write(prctl_failure(PR_SET_CHILD_SUBREAPER, err))
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
            budget = int(report["budget"]["bytes"] or 0)
            if report["budget"]["source"] == "auto":
                budget = budget // MiB * MiB  # whole MiB, so {budget} reads "21694MiB"
            refused = self._refuse_start(budget, concurrency)
            if refused is not None:
                return refused
            rc, common, uptime = self._run_once(report, budget, concurrency)
            if not self._restart(report, concurrency, common, uptime):
                return shell_status(rc)

    def _refuse_start(self, budget: int, concurrency: int | None) -> int | None:
        """The exit status when the worker must not start (no job fits, or a stop came); else None."""
        if concurrency == 0:
            message = "the plan fits 0 jobs in this budget; not starting the worker"
            self.log.emit("give-up", budget_bytes=budget, concurrency=0, message=message)
            return EXIT_THRESHOLD
        if self.stopping is not None:  # stopped while the budget was computed: start nothing
            message = f"stopped by signal {self.stopping} before the start"
            self.log.emit("stop", budget_bytes=budget, concurrency=concurrency, message=message)
            return 128 + self.stopping
        return None

    def _restart(self, report: Report, concurrency: int | None, common: dict[str, Any], uptime: float) -> bool:
        """After an exit: whether to start again (after the backoff); emits stop/give-up/restart."""
        if self.stopping is not None:
            self.log.emit("stop", message=f"stopped by signal {self.stopping}", **common)
            return False
        policy = self.cfg.policy
        if not policy.wants_restart(common["reason"], False):
            return False
        now = self.clock()
        if policy.gives_up(now):
            message = f"{policy.max_restarts} restarts within {policy.window:g}s"
            self.log.emit("give-up", message=message, **common)
            return False
        lowered = self._after_oom(report, concurrency) if common["reason"] == OOM_KILL else None
        delay = policy.next_delay(uptime, now)
        self.log.emit("restart", delay_s=delay, message=lowered, **common)
        if not self._backoff(delay):
            self.log.emit("stop", message=f"stopped by signal {self.stopping} during backoff", **common)
            return False
        return True

    def _after_oom(self, report: Report, concurrency: int | None) -> str:
        if self.cfg.on_oom == "concurrency" and concurrency is not None:
            lowered = max(self.cfg.min_concurrency, concurrency - 1)
            self.concurrency_cap = lowered
            if lowered == concurrency:
                return f"after an OOM kill: concurrency stays {concurrency} (--min-concurrency)"
            return f"after an OOM kill: concurrency {concurrency} -> {lowered}"
        b = report["budget"]
        if b["source"] != "auto":
            return f"after an OOM kill: the {b['source']} budget is kept as given (only an auto budget is lowered)"
        step = oom_margin_step(b["basis_bytes"])
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
