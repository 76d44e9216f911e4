"""``oomguard run``: start a worker with its budget passed explicitly, tell OOM kills apart, restart.

Before each start the probe runs again (limits change at run time), the budget (and, with a
job shape, the concurrency) is computed, and the worker gets ``OOMGUARD_BUDGET_BYTES``,
``OOMGUARD_BUDGET`` and ``OOMGUARD_CONCURRENCY`` plus placeholders in its arguments
(``config.py``). A budget that cannot work starts nothing (``admit.py``); what earlier OOM
kills lowered is forgotten when the limit or the plan changes, and no lesson leaves a budget
that cannot work (``adapt.py``). While the worker runs, the kernel says when its group had an
OOM kill and the supervisor looks at once at who can have been hit (``oomwatch.py``), and
samples the worker tree's peak (``peak.py``; ``waiting.py`` waits for all of it). Each end is
classified from the group's ``oom_kill`` counter, when the kills came and who else left the
group meanwhile (``exits.py``, ``members.py``), and the exit event says the peak against the
budget and the limit, the OOM killer at the limit, and the share neighbours held
(``events.py``); a worker is not stepped down for a neighbour's memory. With ``--guard`` the
worker's group is sampled while it runs, and the worker is signalled, throttled or stopped
before the kernel acts (``guard.py``); an OOM kill in the worker's graceful stop then teaches
more grace under the stop line (``grace.py``), not a smaller budget.

The worker runs in its own process group and session; SIGTERM, SIGINT and SIGHUP sent to the
supervisor go to that group, and ``stop_timeout`` later SIGKILL follows. The supervisor is a
child subreaper, kills what is left of the group when the worker exits, and reaps everything:
no zombies, no orphans. The worker also gets SIGKILL should the supervisor itself die
(both through prctl(2), ``process.py``; a failed prctl is said once on stderr).

Every read of /proc and /sys (the probe, the OOM-kill counter, the guard's samples, the process
table) goes through the ``Root`` the supervisor is given: live by default, a fake tree in tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

from oomguard.errors import EXIT_THRESHOLD, BudgetUnknownError, CommandNotFoundError, UsageError
from oomguard.policy.budget import probe, resolve_budget
from oomguard.policy.plan import make_plan
from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import LiveRoot, Root
from oomguard.supervisor.adapt import (
    GRACE,
    OOM_STEP_MIN,
    STEP_DOWN,
    Adaptation,
    Situation,
    lesson,
    oom_margin_step,
    situation_of,
)
from oomguard.supervisor.admit import refusal, start_note
from oomguard.supervisor.config import RunConfig, substitute, worker_env_and_args, worker_values
from oomguard.supervisor.events import EventLog, neighbour_note, neighbour_share, own_share, peak_story
from oomguard.supervisor.exits import (
    OOM_KILL,
    PRESSURE_STOP,
    Verdict,
    classify,
    exit_fields,
    pressure_stopped,
    shell_status,
)
from oomguard.supervisor.grace import GraceLearning
from oomguard.supervisor.guard import Guard, make_guard
from oomguard.supervisor.isolate import Isolation, isolation_limit
from oomguard.supervisor.members import Outside
from oomguard.supervisor.oomwatch import OomWatch
from oomguard.supervisor.peak import TreePeak, fork_floor, run_peak
from oomguard.supervisor.process import (
    PR_SET_CHILD_SUBREAPER,
    kill_orphans,
    load_libc,
    prctl_failure,
    prepare_child,
    set_prctl,
)
from oomguard.supervisor.waiting import wait_worker
from oomguard.units import MiB, format_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Plan, Report

__all__ = ["OOM_STEP_MIN", "RunConfig", "Supervisor", "oom_margin_step", "prepare_child", "substitute"]

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


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
        self.adapt = Adaptation(config.on_oom, config.min_concurrency)
        self._situation: Situation | None = None  # the limits and uncapped plan of the current start
        self._excused: str | None = None  # why the last end asks for no less (a neighbour's memory)
        self._deathsig_reported = False  # PR_SET_PDEATHSIG's failure is told by the first start only
        self.shape = config.shape  # the shape of the current start: the declared one, or --learned's
        self.learned: dict[str, Any] | None = None  # --learned's decision for the current start
        self.timed_out = False  # SIGKILL followed a stop signal in the current start (--stop-timeout)
        self.grace = GraceLearning(config.guard.grace if config.guard is not None else 0)
        self._planned: int | None = None  # the plan's concurrency before OOM step-downs, this start
        self._grace_note: str | None = None  # what an OOM kill in the last guard stop taught (grace.py)

    # -- signals ---------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = signum
        if self.child is not None and self.child.returncode is None:
            self._killpg(signum)
            signal.setitimer(signal.ITIMER_REAL, max(self.cfg.stop_timeout, 0.001))

    def _on_alarm(self, signum: int, frame: object) -> None:
        self.timed_out = True
        self._killpg(signal.SIGKILL)

    def _stop_worker(self) -> None:
        """The guard's stop: SIGTERM to the worker's group now, SIGKILL ``stop_timeout`` later."""
        self._killpg(signal.SIGTERM)
        signal.setitimer(signal.ITIMER_REAL, max(self.cfg.stop_timeout, 0.001))

    def _killpg(self, signum: int) -> None:
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signum)

    # -- one start -------------------------------------------------------------------------
    def _plan(self, report: Report) -> Plan | None:
        return make_plan(report, self.shape) if self.shape is not None else None

    def _prepare(self) -> tuple[Report, Plan | None, str | None]:
        """(report, plan, what was lifted), computed afresh before each start."""
        report = probe(root=self.root, budget=self.cfg.budget, margin=self.cfg.margin)
        if self.cfg.learn is not None and self.cfg.shape is not None:  # --learned: asked before each start
            self.shape, self.learned = self.cfg.learn(self.cfg.shape, report)
        fresh = self._plan({**report, "warnings": []})  # the plan before any lesson of an OOM kill
        self._situation = situation_of(report, fresh["concurrency"] if fresh else None)
        lifted = self.adapt.check(self._situation)
        b = report["budget"]
        if self.adapt.extra_margin and b["source"] == "auto" and b["safety_margin_bytes"] is not None:
            margin = b["safety_margin_bytes"] + self.adapt.extra_margin
            resolve_budget(report, budget=self.cfg.budget, margin=str(margin), env=self.root.environ())
        if report["budget"]["bytes"] is None:
            raise BudgetUnknownError("run")
        return report, self._plan(report), lifted

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

    def _isolation(self, report: Report, budget: int) -> tuple[Isolation | None, int | None]:
        """The worker's own group, if asked for and possible, and the limit the kernel holds for it."""
        if not self.cfg.isolate:
            return None, None
        limit = isolation_limit(report, budget)
        name = f"oomguard-run-{os.getpid()}"
        iso, why = Isolation.create(report, limit, name, self.root, self.cgroupfs)
        self.log.stderr.write(f"oomguard run: {'isolate: ' + why if iso else 'cannot isolate: ' + why}\n")
        return iso, (iso.limit or limit) if iso else None

    def _guard(self, report: Report, budget: int, isolation: Isolation | None, limit: int | None) -> Guard | None:
        if self.cfg.guard is None or self.child is None:
            return None
        isolated = (isolation, limit) if isolation is not None and limit is not None else None
        pid, err = self.child.pid, self.log.stderr
        fs = self.cgroupfs
        return make_guard(
            self.cfg.guard, report, budget, isolated=isolated, root=self.root, pid=pid, stderr=err, fs=fs,
            learning=self.grace, stop_timeout=self.cfg.stop_timeout,
        )  # fmt: skip

    def _wait(self, watch: OomWatch, peak: TreePeak, guard: Guard | None) -> tuple[int, int | None, float]:
        """Block until the worker exits: (returncode as Popen gives it, ru_maxrss bytes, when it ended)."""
        assert self.child is not None
        watching = lambda: self.stopping is None  # noqa: E731
        status, usage, ended = wait_worker(
            self.child.pid, watch, peak, guard=guard, watching=watching, stop=self._stop_worker
        )
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.child.returncode = os.waitstatus_to_exitcode(status)
        return self.child.returncode, usage.ru_maxrss * 1024 or None, ended

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

    def _clean_up(self, isolation: Isolation | None) -> int | None:
        """Kill and reap what is left of the run, remove its group; the group's own peak, when isolated."""
        if isolation is not None:
            isolation.kill()  # cgroup.kill: everything in the worker's group (other sessions too) dies now
        self._cleanup_group()
        peak = None
        if isolation is not None:
            peak = isolation.peak()
            if not isolation.remove():
                self.log.stderr.write(f"oomguard run: isolate: cannot remove {isolation.path}\n")
        return peak

    def _watch(self, report: Report, isolation: Isolation | None) -> OomWatch:
        """The OOM kills of the worker's group: its ``--isolate`` group, else the report's counter's."""
        oom = report["memory"]["oom"]
        source = isolation.oom_source if isolation else oom["source"] if oom else None
        version = isolation.version if isolation else report["memory"]["cgroup"]["version"]
        return OomWatch(self.root, self.cgroupfs, source, version)

    def _neighbours(
        self, verdict: Verdict, guard: Guard | None, watch: OomWatch, limit: int | None
    ) -> tuple[Outside | None, int | None]:
        """What the group's other processes held at a pressure stop (the working set then) or an OOM
        kill (the limit), and that whole; (None, None) for another end."""
        if verdict.reason == PRESSURE_STOP and guard is not None:
            return guard.outside, guard.stopped_at
        if verdict.reason == OOM_KILL:
            return watch.outside, limit
        return None, None

    def _run_once(self, report: Report, ctx: dict[str, Any], lifted: str | None) -> tuple[int, dict[str, Any], float]:
        """Start the worker, wait for it, classify its end: (returncode, event fields, uptime)."""
        budget, concurrency = ctx["budget_bytes"], ctx["concurrency"]
        values = worker_values(budget, concurrency, self.shape, self._planned)
        self._write_configs(values, ctx)
        env, args = worker_env_and_args(self.cfg.command, budget, concurrency, self.shape, values)
        isolation, iso_limit = self._isolation(report, budget)
        watch = self._watch(report, isolation)
        floor = fork_floor()
        started = self.clock()
        self.timed_out = False
        self.child = self._spawn(env, args, isolation)
        pid = self.child.pid
        tree = TreePeak(self.root, pid, floor)
        watch.started(pid)
        self.log.emit("start", pid=pid, **ctx, **start_note(report, lifted))
        guard = self._guard(report, budget, isolation, iso_limit)
        if self.stopping is not None:  # a signal between spawn and now
            self._on_signal(self.stopping, None)
        rc, maxrss, ended = self._wait(watch, tree, guard)
        e = watch.finish(ended)
        group_peak = self._clean_up(isolation)
        uptime = self.clock() - started
        verdict = classify(rc, e)
        tree_peak, unknown = tree.result(maxrss, oom_victim=verdict.reason == OOM_KILL and verdict.victim == "worker")
        peak, source = run_peak(tree_peak, group_peak, isolation.version if isolation else None)
        if guard is not None and guard.watch.stop_why is not None:  # the guard stopped it
            verdict = pressure_stopped(verdict, rc, guard.watch.stop_why)
        limit, limited_by = (iso_limit, "isolated") if iso_limit else (ctx["effective_bytes"], ctx["limited_by"])
        outside, whole = self._neighbours(verdict, guard, watch, limit)
        common = {"pid": pid, **ctx, "reason": verdict.reason, "oom_kills": e.kills, "oom_victim": verdict.victim}
        common |= exit_fields(rc) | (guard.fields() if guard is not None else {})
        stopped = guard is not None and guard.watch.stopped_ws is not None
        # after a guard stop: whether the worker ended by itself, not by SIGKILL at --stop-timeout
        # nor by the kernel's OOM killer in its shutdown
        finished = verdict.reason == PRESSURE_STOP and not self.timed_out
        common["stop_finished"] = finished if stopped else None
        self._grace_note = None
        if stopped and guard is not None:  # what this stop cost: the next start's grace (grace.py)
            killed = verdict.reason == OOM_KILL
            self.grace.learn(guard.watch.grown_after_stop, oom_killed=killed, margin=guard.watch.margin)
            if killed:
                self._grace_note = self._grace_lesson(guard)
        common["outside_bytes"] = outside.bytes if outside is not None else None
        oom = verdict.victim if verdict.reason == OOM_KILL else None
        said = [
            peak_story(
                peak,
                budget,
                limit,
                limited_by,
                source=source,
                oom=oom,
                kills=e.kills,
                unknown=unknown,
                at_least=tree.sampled if tree_peak is None else None,
            )
        ]
        said.append(verdict.note)
        share = neighbour_share(outside, whole)
        self._excused = None
        if share is not None and whole is not None:
            what = "working set" if verdict.reason == PRESSURE_STOP else "limit"
            self._excused = own_share(share, whole, budget)
            said += [neighbour_note(share, whole, what), self._excused]
        said.append(guard.summary() if guard is not None else None)
        story = "; ".join(filter(None, said)) or None
        self.log.emit("exit", duration_s=round(uptime, 3), peak_bytes=peak, peak_source=source, message=story, **common)
        return rc, common, uptime

    def _grace_lesson(self, guard: Guard) -> str:
        """The restart's words after an OOM kill in the worker's graceful stop: the grace the next start keeps."""
        w = guard.watch
        grace = self.grace.for_start(w.ceiling, w.margin)
        where = {"learned": "learned from the stops so far", "given": "--grace-bytes"}.get(grace.source or "")
        capped = "capped at half of the ceiling less the guard margin" if grace.capped else None
        said = ", ".join(filter(None, [where, capped]))
        return (
            f"after an OOM kill in the worker's graceful stop (it grew {format_size(w.grown_after_stop or 0)} after "
            f"the guard's SIGTERM): the next stop keeps {format_size(grace.bytes)} of grace"
            + (f" ({said})" if said else "")
            + "; the budget and the plan are kept"
        )

    def _workable(self, report: Report) -> Callable[[int], bool]:
        """Whether a start with an auto budget of so many bytes, under *report*, would be admitted (admit.py)."""

        def workable(budget: int) -> bool:
            trial: Report = {**report, "budget": {**report["budget"], "bytes": budget}, "warnings": []}
            return refusal(trial, budget, self._plan(trial), allow_over_limit=self.cfg.allow_over_limit) is None

        return workable

    def _write_configs(self, values: dict[str, str], ctx: dict[str, Any]) -> None:
        """``--render`` and ``--cuzk``: each config file written afresh before this start (templates.py);
        a failed write stops the run (``UsageError``, exit 2) after a give-up event."""
        for r in self.cfg.rendered:
            try:
                text = r.write(values)
            except UsageError as exc:
                self.log.emit("give-up", message=str(exc), **ctx)
                raise
            self.log.stderr.write(f"oomguard run: {r.flag}: {r.describe(text)} -> {r.output} (from {r.template})\n")

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
        for note in self.cfg.notes:
            self.log.stderr.write(f"oomguard run: {note}\n")
        while True:
            report, plan, lifted = self._prepare()
            self._planned = plan["concurrency"] if plan else None
            budget = int(report["budget"]["bytes"] or 0)
            if report["budget"]["source"] == "auto":
                budget = budget // MiB * MiB  # whole MiB, so {budget} reads "21694MiB"
            mem = report["memory"]
            ctx: dict[str, Any] = {
                "budget_bytes": budget,
                "concurrency": self.adapt.capped(plan["concurrency"]) if plan else None,
                "effective_bytes": mem["effective_bytes"],
                "limited_by": mem["limited_by"],
            }
            if self.learned is not None:
                ctx["learned"] = self.learned
            refused = self._refuse_start(report, plan, ctx)
            if refused is not None:
                return refused
            rc, common, uptime = self._run_once(report, ctx, lifted)
            if not self._restart(report, common, uptime):
                return shell_status(rc)

    def _refuse_start(self, report: Report, plan: Plan | None, ctx: dict[str, Any]) -> int | None:
        """The exit status when the worker must not start (a budget that cannot work, a stop); else None."""
        why = refusal(report, ctx["budget_bytes"], plan, allow_over_limit=self.cfg.allow_over_limit)
        if why is not None:
            self.log.emit("give-up", message=why, **ctx)
            return EXIT_THRESHOLD
        if self.stopping is not None:  # stopped while the budget was computed: start nothing
            self.log.emit("stop", message=f"stopped by signal {self.stopping} before the start", **ctx)
            return 128 + self.stopping
        return None

    def _restart(self, report: Report, common: dict[str, Any], uptime: float) -> bool:
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
        healthy = self.adapt.after_run(uptime, policy.healthy_after, common["reason"])
        taught = lesson(common["reason"], guard_stopped=common["stop_finished"] is not None)
        if taught == GRACE:  # killed in its graceful stop: more room under the stop line, the budget kept
            healthy = self._grace_note
        elif taught in STEP_DOWN and self._excused is not None:  # a neighbour's memory, not the worker's
            healthy = f"after {STEP_DOWN[common['reason']]}: {self._excused} (the rest was outside the worker's tree)"
        elif taught in STEP_DOWN:
            assert self._situation is not None
            healthy = self.adapt.after_oom(
                report, common["concurrency"], self._situation, common["reason"], workable=self._workable(report)
            )
        delay = policy.next_delay(uptime, now)
        self.log.emit("restart", delay_s=delay, message=healthy, **common)
        if not self._backoff(delay):
            self.log.emit("stop", message=f"stopped by signal {self.stopping} during backoff", **common)
            return False
        return True

    def _backoff(self, delay: float) -> bool:
        """Sleep *delay* seconds; False if an operator's signal came meanwhile."""
        end = self.clock() + delay
        while self.stopping is None:
            left = end - self.clock()
            if left <= 0:
                return True
            self.sleep(min(left, 0.1))
        return False
