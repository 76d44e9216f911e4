"""``oomguard run --guard``: watch the worker's memory cgroup and act before the kernel does.

Every ``interval`` (100 ms) the supervisor samples the worker's group: its ``--isolate`` group,
else the group whose limit binds, its own or an ancestor, where a charge fails (as
``MemoryBudget(watch=True)`` does, runtime/watch.py). ``probes/counters.read_sample`` reads v2
``memory.current``, ``memory.stat``, ``memory.events``, ``memory.pressure``; v1
``memory.usage_in_bytes``, ``memory.stat``. The working set is usage - inactive_file, as the
probe computes it. ``GuardState`` (``guard_state.py``) decides on each sample (pure: tested on
numbers); ``Guard`` here reads and acts (docs/guard.md); ``waiting.py`` waits for the worker
between samples. The flags become a ``GuardSettings`` in ``config.py``.

- **at the budget** (working set >= budget), once per crossing: ``--on-pressure`` (default none)
  goes to the worker's main process, and with ``--isolate`` on v2 the group's ``memory.high``
  is set to the budget. The crossing re-arms when the working set falls below 95% of it.
- **near the ceiling** (working set >= ceiling - ``--guard-margin``; default max(64 MiB, 2% of
  the ceiling)): stop. The supervisor sends SIGTERM to the worker's process group, SIGKILL
  ``--stop-timeout`` later, and records ``pressure-stop``. The line is lower by the grace, room
  for the worker's graceful stop (``--grace-bytes``, or learned from earlier stops: ``grace.py``);
  while the worker stops, with ``--isolate`` on v2, ``memory.high`` is half a guard margin under
  the limit (``Guard._grace_high``).
- **stalled under memory.high**: cgroup-v2.rst, "memory.high": "Going over the high limit never
  invokes the OOM killer and under extreme conditions the limit may be breached. The high
  limit should be used in scenarios where an external process monitors the limited cgroup to
  alleviate heavy reclaim pressure." The kernel throttles a group over ``memory.high`` by
  sleeping its allocating tasks (mm/memcontrol.c, ``mem_cgroup_handle_over_high``, counted as
  memory stall in PSI): a worker that cannot shed load crawls just above its budget and never
  reaches the ceiling. So once the group's PSI ``full`` time (all its tasks stalled on memory,
  Documentation/accounting/psi.rst) grows by ``stall_limit`` (10 s) during one crossing, that
  is a stop too.

The ceiling is the isolated group's limit with ``--isolate``, else the hard ceiling the budget
was computed from (``memory.effective_bytes``), which is that group's limit.

**Fast growth.** A worker that grows by more than the margin between two samples would pass the
stop line and the ceiling unseen, and the kernel would act first. So near the ceiling (the working
set within ``NEAR_MARGINS`` (4) guard margins of it) the guard samples every ``fast_interval``
(20 ms), and it asks the kernel to wake it between samples (``alarm.py``): on v1 a usage threshold
at the stop line, and reclaim at the group's limit (``memory.pressure_level``, for a group full of
page cache, whose usage stays at the limit); on v2 ``memory.events`` changes, ``high`` (over
``memory.high``, set with ``--isolate``) and ``max`` (usage at ``memory.max``, past the stop line):
v2 has no wake-up at the stop line itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import TextIO

from oomguard.policy.budget import guard_margin
from oomguard.probes.counters import MemorySample, read_sample
from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import Root
from oomguard.supervisor.alarm import Alarm
from oomguard.supervisor.config import GuardSettings
from oomguard.supervisor.grace import Grace, GraceLearning
from oomguard.supervisor.guard_state import HIGH, PRESSURE, STOP, GuardState
from oomguard.supervisor.members import Outside, outside_memory
from oomguard.units import format_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Report
    from oomguard.supervisor.isolate import Isolation


class Guard:
    """Samples *group* through *root* for the worker *pid* and acts on what ``GuardState`` decides."""

    def __init__(
        self,
        settings: GuardSettings,
        watch: GuardState,
        *,
        root: Root,
        group: str,
        version: int,
        pid: int,
        stderr: TextIO,
        isolation: Isolation | None = None,
        alarm: Alarm | None = None,
        grace: Grace | None = None,
        stop_timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.watch, self.root, self.group, self.version = settings, watch, root, group, version
        self.pid, self.stderr, self.isolation, self.alarm = pid, stderr, isolation, alarm
        self.grace = grace if grace is not None else Grace(watch.grace, "given" if watch.grace else None)
        self.stop_timeout, self.clock = stop_timeout, clock
        self.grace_high: int | None = None  # memory.high while the worker stops (v2, --isolate)
        self.first: MemorySample | None = None
        self.last: MemorySample | None = None
        self.blind = False  # said once: the working set cannot be read
        self.samples = 0
        self.stopped_at: int | None = None  # the working set the stop was decided at
        self.outside: Outside | None = None  # the neighbours' memory then (members.outside_memory)

    def tick(self) -> bool:
        """Sample once and act; True when the worker must be stopped now (once)."""
        s = read_sample(self.root, self.group, self.version)
        self.samples += 1
        if s.working_set is None and not self.blind:
            self.blind = True
            self._say(f"cannot read the usage of {self.group}: nothing to act on while it stays unreadable")
        if s.working_set is not None:
            self.first, self.last = self.first or s, s
        actions = self.watch.step(s, self.clock())
        if self.alarm is not None and s.working_set is not None and self.watch.stop_why is None:
            self._arm(s)
        if PRESSURE in actions:
            self._pressure(s)
        if HIGH in actions and self.isolation is not None:
            self._high()
        if STOP in actions:
            self.stopped_at = s.working_set
            self.outside = outside_memory(self.root, self.group, os.getpid())
            self._say(f"pressure stop: {self.watch.stop_why}{self._rate_note()}; SIGTERM to the worker's process group")
            self._grace_high()
        return STOP in actions

    def _rate_note(self) -> str:
        """The growth at the stop, and the time to the ceiling at that rate against ``--stop-timeout``."""
        rate, ws = self.watch.stop_rate, self.watch.stopped_ws
        if rate is None or rate <= 0 or ws is None:
            return ""
        seconds = max(0, self.watch.ceiling - ws) / rate
        away = f"{seconds:.3g}" if seconds < 100 else f"{seconds:.0f}"
        note = f"; growing {format_size(int(rate))}/s, the ceiling {away}s away at that rate"
        if self.stop_timeout is not None and seconds < self.stop_timeout:
            note += f", within --stop-timeout {self.stop_timeout:g}s: the stop must curb the growth"
        return note

    def _grace_high(self) -> None:
        """While the worker stops: v2 ``memory.high`` just below the ceiling (half a guard margin), so
        the kernel throttles and reclaims before it kills; it also lifts a ``memory.high`` set at
        the budget, which would throttle the worker's graceful stop itself."""
        if self.isolation is None or self.version != 2:
            why = "cgroup v1 has no memory.high" if self.version == 1 else "without --isolate, not oomguard's group"
            self._say(f"no throttle during the stop ({why}): the room under the stop line is all it has")
            return
        high = self.watch.ceiling - self.watch.margin // 2
        try:
            self.isolation.set_high(high)
        except OSError as exc:
            self._say(f"cannot set {self.isolation.path}/memory.high: {exc.strerror}")
            return
        self.grace_high = high
        self._say(f"memory.high of {self.isolation.path} set to {format_size(high)} while the worker stops")

    def _arm(self, s: MemorySample) -> None:
        assert self.alarm is not None
        self.alarm.arm(self.watch.stop_line, self.watch.margin, s.inactive_file)
        for note in self.alarm.pop_notes():
            self._say(note)

    def interval(self) -> float:
        """Seconds to the next sample: ``fast_interval`` near the ceiling and while the worker stops
        (its growth after the signal is measured), else ``interval``."""
        ws = None if self.last is None else self.last.working_set
        if self.watch.stop_why is not None or (ws is not None and ws >= self.watch.near):
            return self.settings.fast_interval
        return self.settings.interval

    def close(self) -> None:
        if self.alarm is not None:
            self.alarm.close()

    def _say(self, text: str) -> None:
        self.stderr.write(f"oomguard run: guard: {text}\n")
        self.stderr.flush()

    def _pressure(self, s: MemorySample) -> None:
        sig = self.settings.on_pressure
        what = f"working set {format_size(s.working_set)} reached the budget {format_size(self.watch.budget)}"
        if sig is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, sig)
            what += f"; {signal.Signals(sig).name} sent to pid {self.pid}"
        self._say(what)

    def _high(self) -> None:
        assert self.isolation is not None
        try:
            self.isolation.set_high(self.watch.budget)
        except OSError as exc:
            self._say(f"cannot set {self.isolation.path}/memory.high: {exc.strerror}")
            return
        self._say(f"memory.high of {self.isolation.path} set to {format_size(self.watch.budget)}")

    def fields(self) -> dict[str, int | str | None]:
        """The exit event's guard fields (``supervisor/events.py``)."""
        w = self.watch
        out: dict[str, int | str | None] = {"guard_margin_bytes": w.margin, "working_set_peak_bytes": w.peak}
        out |= {"grace_bytes": w.grace, "grace_source": self.grace.source, "grace_high_bytes": self.grace_high}
        rate = None if w.stop_rate is None else int(w.stop_rate)
        out |= {"stop_working_set_bytes": w.stopped_ws, "stop_rate_bytes_per_s": rate}
        return out | {"grown_after_stop_bytes": w.grown_after_stop}

    def summary(self) -> str | None:
        """What the guard saw, for the exit event's message."""
        w, first, last = self.watch, self.first, self.last
        parts = [f"the working set reached the budget {w.crossings} time(s)"] if w.crossings else []
        if w.high_set and first is not None and last is not None and "high" in last.events:
            parts.append(f"memory.high events +{last.events['high'] - first.events.get('high', 0)}")
        if first is not None and last is not None and last.stall_us is not None and first.stall_us is not None:
            stall = (last.stall_us - first.stall_us) / 1e6
            if stall >= 0.05:
                parts.append(f"memory stall {stall:.1f}s")
        if self.alarm is not None and self.alarm.wakeups:
            parts.append(f"woken by the kernel {self.alarm.wakeups} time(s)")
        return ("guard: " + ", ".join(parts)) if parts else None


def _given_margin(spec: tuple[int | None, float | None], ceiling: int) -> str:
    size, pct = spec
    if size is not None:
        return format_size(size)
    return f"{pct:g}% of the ceiling" if pct is not None else "max(64 MiB, 2% of the ceiling)"


def _grace_said(grace: Grace) -> str:
    if grace.source != "learned":
        return "grace"
    cap = ", capped at half of the ceiling less the margin" if grace.capped else ""
    return "grace learned from earlier stops" + cap


def binding_group(report: Report) -> tuple[str | None, int | None]:
    """(directory, version) of the memory cgroup whose limit is the hard ceiling, else this process's own.

    A charge fails at whichever level reaches its limit first (cgroup-v2.rst, "memory.current":
    "the total amount of memory currently being used by the cgroup and its descendants"), so
    that level's working set is the one to compare with its limit. v1's
    ``memory.stat:hierarchical_memory_limit`` names the leaf's own file: the leaf is read then.
    """
    mem = report["memory"]
    cg = mem["cgroup"]
    group = cg["dir"]
    if cg["limit_file"] is not None and mem["limited_by"] == f"cgroup-v{cg['version']}":
        group = cg["limit_file"].rpartition("/")[0]
    return group, cg["version"]


def make_guard(
    settings: GuardSettings,
    report: Report,
    budget: int,
    *,
    isolated: tuple[Isolation, int] | None,
    root: Root,
    pid: int,
    stderr: TextIO,
    fs: CgroupFS | None = None,
    learning: GraceLearning | None = None,
    stop_timeout: float | None = None,
) -> Guard | None:
    """The guard of one run (*isolated*: the worker's group and its limit), or None when it cannot
    watch anything (said in one line). *fs*: where the kernel's wake-ups are registered (none
    without it, or with ``kernel_alarm`` off); *learning*: the grace learned from earlier stops
    (``grace.py``; without it, ``--grace-bytes`` alone)."""
    group: str | None
    version: int | None
    ceiling: int | None
    if isolated is not None:
        group, version, ceiling = isolated[0].path, isolated[0].version, isolated[1]
    else:
        (group, version), ceiling = binding_group(report), report["memory"]["effective_bytes"]
    if group is None or version is None or ceiling is None:
        stderr.write("oomguard run: guard: no memory cgroup or no ceiling to watch; the guard is off\n")
        return None
    margin = guard_margin(ceiling, *settings.margin)
    if margin is not None and margin + settings.grace >= ceiling:
        stderr.write(
            f"oomguard run: guard: the guard margin {format_size(margin)} and --grace-bytes "
            f"{format_size(settings.grace)} leave no stop line under the ceiling {format_size(ceiling)}; "
            "the guard is off\n"
        )
        return None
    if margin is None:  # policy.budget.guard_margin: no room under the ceiling, no line to guard
        given = _given_margin(settings.margin, ceiling)
        stderr.write(
            f"oomguard run: guard: the guard margin {given} is not below the ceiling "
            f"{format_size(ceiling)}; the guard is off\n"
        )
        return None
    grace = (learning or GraceLearning(settings.grace)).for_start(ceiling, margin)
    high = isolated is not None and version == 2
    watch = GuardState(budget, ceiling, margin, set_high=high, stall_limit=settings.stall_limit, grace=grace.bytes)
    iso = isolated[0] if isolated is not None else None
    alarm = Alarm(root, fs, group, version) if fs is not None and settings.kernel_alarm else None
    guard = Guard(
        settings, watch, root=root, group=group, version=version, pid=pid, stderr=stderr, isolation=iso, alarm=alarm,
        grace=grace, stop_timeout=stop_timeout,
    )  # fmt: skip
    sig = signal.Signals(settings.on_pressure).name if settings.on_pressure is not None else "none"
    guard._say(
        f"watching {group} every {settings.interval * 1000:g} ms ({settings.fast_interval * 1000:g} ms above "
        f"{format_size(max(0, watch.near))}): at the budget {format_size(budget)} "
        f"--on-pressure {sig}{', memory.high' if high else ''}; stop at {format_size(watch.stop_line)} "
        f"({format_size(ceiling)} limit - {format_size(margin)} guard margin"
        + (f" - {format_size(grace.bytes)} {_grace_said(grace)})" if grace.bytes else ")")
    )
    return guard
