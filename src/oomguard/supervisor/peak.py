"""The peak memory of one run, and where it comes from (the exit event's ``peak_bytes``, ``peak_source``).

- **The worker's own group** (``--isolate``: it holds the worker's tree alone, since just before
  its exec): the kernel's peak of the group, v2 ``memory.peak`` ("The max memory usage recorded
  for the cgroup and its descendants since the creation of the cgroup", cgroup-v2.rst 5-2-1,
  "Memory Interface Files"; Linux >= 5.19), v1 ``memory.max_usage_in_bytes`` ("show max memory
  usage recorded", cgroup-v1/memory.rst, "Brief summary of control files"). Source
  ``memory.peak`` / ``memory.max_usage_in_bytes``.
- **Otherwise** the largest ``VmHWM`` of a process of the worker's tree (proc(5): "Peak resident
  set size"), source ``vmhwm``. Not the group's peak: the group holds the supervisor and maybe
  others, and its peak counts since the group was made.

``ru_maxrss`` of the reaped worker (getrusage(2), ``wait4``) cannot be taken as it is: the kernel
keeps the maximum across execve (fs/exec.c, ``exec_mmap``: ``setmax_mm_hiwater_rss(&tsk->signal->
maxrss, old_mm)``), so it includes the supervisor's fork before the exec, a whole Python
interpreter (``run -- /bin/true``: 11.2 MiB, where ``/usr/bin/time`` says 1 MiB). ``VmHWM`` is
the current memory map's only, but it can be read only while the process lives: ``TreePeak``
samples the tree while it runs (after 10, 50, 100, 250 and 500 ms, then every second; not at
once: just after the exec the dynamic loader has not run yet, and ``/bin/true`` showed 16 KiB
there), and whenever the kernel wakes the supervisor about the group (``oomwatch.py``: v1 as it
runs out of memory, before the OOM killer acts; v2 on ``memory.events``, whose ``max`` counts each
time usage reaches ``memory.max``, cgroup-v2.rst 5-2-1) or the guard stops the worker: the moments
a fast grower peaks. ``ru_maxrss`` is taken where it is above what the fork can have held (the
supervisor's own ``ru_maxrss`` at the start, + 1 MiB): that is a peak after the exec (an
OOM-killed worker in a 64 MiB v2 group: 59.4 and 60 MiB, against 66 MiB from a small parent).
What this cannot see: a victim the OOM reaper empties before it exits itself (mm/oom_kill.c,
``__oom_reap_task_mm`` unmaps without updating the high-water mark; it waits ``OOM_REAPER_DELAY``,
2 s, first) has a stale ``ru_maxrss``: seen in the VM while the host was loaded (7.4 and 7.9 MiB
for a worker killed at a 64 MiB limit), never here. It is told apart: the OOM killer picks the
process with the most memory (mm/oom_kill.c, ``oom_badness``: rss + swap + page tables), and the
supervisor beside it holds its own ``ru_maxrss``, so a worker that was the victim with a
``ru_maxrss`` under the fork's floor had it emptied; its peak is then unknown (null), and the
message says the last sample as the lower bound it is, never as the peak. A worker smaller than
the supervisor and gone before its first sample has no peak (null): the exit message says
``ru_maxrss`` only as the bound it is.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

from oomguard.probes.counters import read_children, read_peak_rss
from oomguard.sources.root import Root
from oomguard.units import MiB, format_size

VMHWM = "vmhwm"
CGROUP_SOURCES = {1: "memory.max_usage_in_bytes", 2: "memory.peak"}
SCHEDULE = (0.01, 0.05, 0.1, 0.25, 0.5)  # seconds after the start of the first samples; then every EVERY
EVERY = 1.0
FORK_SLACK = MiB  # what the pre-exec child may touch beyond the supervisor's own peak
MAX_TREE = 256  # processes sampled at most


def fork_floor() -> int:
    """The most the supervisor's pre-exec fork can have held: its own peak RSS, + 1 MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 + FORK_SLACK


class TreePeak:
    """The largest ``VmHWM`` seen in the tree of *pid* (read through *root*), and the fork's floor."""

    def __init__(self, root: Root, pid: int, floor: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.root, self.pid, self.floor, self.clock = root, pid, floor, clock
        self.sampled: int | None = None
        self.start = clock()
        self._due = iter(SCHEDULE[1:])
        self._next = self.start + SCHEDULE[0]

    def tree(self) -> list[int]:
        """*pid* and its descendants (``/proc/PID/task/TID/children``), at most ``MAX_TREE``."""
        seen, todo = [self.pid], [self.pid]
        while todo and len(seen) < MAX_TREE:
            for child in read_children(self.root, todo.pop()):
                if child not in seen:
                    seen.append(child)
                    todo.append(child)
        return seen[:MAX_TREE]

    def sample(self) -> None:
        """Read the tree's VmHWM now (a process that is gone or a zombie has none), off the schedule too:
        ``waiting.py`` does when the kernel wakes the supervisor (the group at its limit) and at a stop."""
        for p in self.tree():
            hwm = read_peak_rss(self.root, p)
            if hwm is not None and (self.sampled is None or hwm > self.sampled):
                self.sampled = hwm

    def interval(self) -> float:
        return max(0.0, self._next - self.clock())

    def tick(self) -> None:
        """Sample where the schedule says so."""
        if self.clock() >= self._next:
            self.sample()
            nxt = next(self._due, None)
            self._next = self.start + nxt if nxt is not None else self.clock() + EVERY

    def result(self, ru_maxrss: int | None, *, oom_victim: bool = False) -> tuple[int | None, str | None]:
        """The tree's peak: ``ru_maxrss`` (bytes) where it is above the fork's floor, else the samples;
        and, without either, what ``ru_maxrss`` says (a bound that counts the supervisor's fork). A worker
        the OOM killer chose (*oom_victim*) with ``ru_maxrss`` under the floor was emptied by the OOM
        reaper before it exited: unknown, with the last sample as a lower bound."""
        if ru_maxrss is not None and ru_maxrss > self.floor:
            return max(ru_maxrss, self.sampled or 0), None
        if oom_victim and ru_maxrss is not None:
            seen = f"at least {format_size(self.sampled)}, its last sample" if self.sampled else "never sampled"
            return None, (
                f"peak unknown: the OOM reaper emptied the worker before it exited, so its high-water mark "
                f"({format_size(ru_maxrss)}) is stale ({seen})"
            )
        if self.sampled is None and ru_maxrss is not None:
            return None, (
                f"peak unknown: the worker ended before its VmHWM was sampled (at most {format_size(ru_maxrss)}, "
                "its ru_maxrss, which counts the supervisor's fork before the exec)"
            )
        return self.sampled, None


def run_peak(tree: int | None, group: int | None, version: int | None) -> tuple[int | None, str | None]:
    """(peak, source) of a run: the worker's own group's peak where there is one, else the tree's."""
    if group is not None and version in CGROUP_SOURCES:
        return group, CGROUP_SOURCES[version]
    return tree, VMHWM if tree is not None else None
