"""When the worker's group had its OOM kills, and whom they can have hit: the kernel's notifications.

The ``oom_kill`` counter says how many processes the OOM killer ended, not when (``exits.py``).
Read only before the start and after the end, a neighbour's OOM kill long before an operator's
``kill -9`` of the worker looks like the worker's own. So while the worker runs, ``OomWatch``
asks the kernel to say when the group runs out of memory, and reads the counter then:

- v1: an eventfd on ``memory.oom_control`` registered through ``cgroup.event_control``
  (Documentation/admin-guide/cgroup-v1/memory.rst §10, "OOM Control": "The application will be
  notified through eventfd when OOM happens"). The kernel signals it before it picks a victim
  (mm/memcontrol-v1.c, ``memcg1_oom_prepare`` -> ``mem_cgroup_oom_notify``), so the counter is
  read again every 10 ms until it moved (at most ``PENDING_FOR``). The root group has none.
- v2: ``memory.events``, polled for POLLPRI (cgroup-v2.rst 5-2-1, "memory.events": "A value
  change in this file generates a file modified event"; fs/kernfs/file.c re-arms it at each
  read). It changes on ``high`` and ``max`` too: after a wake-up it is left out for 20 ms
  (``waiting.py``), and the counter read at the next tick catches a kill meanwhile.
- where neither can be had (a fake tree, a read-only ``cgroup.event_control``): the counter is
  read at every tick (``POLL_EVERY``), and said so in ``how``.

At each rise of the counter it looks at once at who can have been hit. The OOM killer sends
SIGKILL before it counts the kill (mm/oom_kill.c, ``__oom_kill_process``), so its victim is then
gone, a zombie, exiting, or has SIGKILL pending (``probes/counters.parse_dying``):

- the worker's own process: if it runs on with no SIGKILL pending, the kill was not its own
  (``spared``). Where its state cannot be read, a kill seen more than ``GRACE`` seconds before the
  worker's end counts as spared.
- the group's processes outside the worker's tree (``members.py``), snapshot before the start,
  every ``MARK_EVERY`` second (up to every 5 s where a snapshot is slow: a joiner is seen, and one
  that left before the last snapshot is not a victim) and at each rise: those gone or dying since
  the last snapshot may have been victims.
- their anonymous memory (``members.outside_memory``): how much of the group the neighbours held
  at the kill, for the exit event (``outside``).

Reads go through a ``Root``, the v1 registration through a ``CgroupFS``; nothing here raises.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from typing import NamedTuple

from oomguard.probes.counters import read_dying, read_oom_kills
from oomguard.sources.cgroupfs import CgroupFS, consume_notification
from oomguard.sources.root import Root
from oomguard.supervisor.exits import Evidence
from oomguard.supervisor.members import Members, Outside, dying, gone, outside_memory, outsiders

MARK_EVERY = 1.0  # seconds between two snapshots of the group's other processes
POLL_EVERY = 0.25  # seconds between two counter reads where the kernel cannot notify
PENDING_FOR = 1.0  # v1: how long after a notification the counter is re-read until it moves
PENDING_EVERY = 0.01
# A kill seen this long before the worker's end was not its own, where its state cannot be read: the OOM
# killer's victim dies at once (mm/oom_kill.c: SIGKILL, and the OOM reaper frees its memory meanwhile);
# measured here (v1, 256 MiB group, 5 runs), the killed worker was reaped 45-136 ms after the kill was
# seen. A large memory map takes longer to tear down: the state check above does not depend on it.
GRACE = 2.0
MARK_BUDGET = 0.01  # a snapshot that takes longer makes the next ones rarer (1% of a CPU at most) ...
MARK_EVERY_MAX = 5.0  # ... down to one every 5 s (0.7 ms here with 4 processes; 10-20 ms under the VM's TCG)


class Rise(NamedTuple):
    """One rise of the counter, as seen: when (monotonic), by how much, whether the worker was hit
    (True: gone or dying; False: running on; None: unknown), outsiders gone or dying since the
    last snapshot (None: unknown), and whether the kernel's notification told it."""

    time: float
    kills: int
    worker_hit: bool | None
    others_gone: int | None
    notified: bool


class OomWatch:
    """The OOM kills of the group whose counter is *source* (``memory.events`` or ``memory.oom_control``)."""

    def __init__(
        self,
        root: Root,
        fs: CgroupFS | None,
        source: str | None,
        version: int | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root, self.source, self.version, self.clock = root, source, version, clock
        self.group = os.path.dirname(source) if source else None
        self.me = os.getpid()
        self.mark: Members | None = outsiders(root, self.group, version, self.me)
        self.before = read_oom_kills(root, source)
        self.count = self.before
        self.rises: list[Rise] = []
        self.outside: Outside | None = None  # the neighbours' memory at the last rise
        self.pid: int | None = None
        self.fd: int | None = None
        self.how = "polled"
        self.wakes = 0  # the kernel's notifications read
        self._pending: float | None = None  # v1: notified at, the counter not moved yet
        self._next_poll = self._next_mark = 0.0
        self._mark_every = MARK_EVERY
        if fs is not None and source is not None and self.before is not None:
            self._listen(fs)

    def _listen(self, fs: CgroupFS) -> None:
        assert self.group is not None
        try:
            if self.version == 1:
                self.fd, self.how = fs.oom_notification(self.group), "cgroup.event_control"
            elif self.version == 2:
                self.fd, self.how = fs.open_events(self.group), "memory.events"
                os.read(self.fd, 4096)  # kernfs notifies the changes after this read
        except OSError:
            self.close()
            self.fd, self.how = None, "polled"

    # -- the waker interface of waiting.exit_waiter ---------------------------------------------
    quiet = 0.1  # seconds left out after a wake-up: a group at its memory.max changes memory.events often

    @property
    def events(self) -> int:
        return select.POLLIN if self.version == 1 else select.POLLPRI

    def fds(self) -> list[int]:
        return [] if self.fd is None else [self.fd]

    def drain(self, fd: int) -> None:
        """The kernel woke us: reset the eventfd (v1) or re-read memory.events (v2), then the counter."""
        if not consume_notification(fd, self.version or 2):
            return  # nothing pending
        self.wakes += 1
        now = self.clock()
        if not self._check(now, notified=True) and self.version == 1:
            self._pending = self._pending or now

    # -- the run ----------------------------------------------------------------------------
    def started(self, pid: int) -> None:
        """The worker *pid* started now."""
        self.pid = pid
        now = self.clock()
        self._next_poll = now + (POLL_EVERY if self.fd is None else MARK_EVERY)
        self._next_mark = now + self._mark_every

    def interval(self) -> float:
        """Seconds to the next ``tick``."""
        now = self.clock()
        if self._pending is not None:
            return PENDING_EVERY
        due = self._next_mark if self.fd is not None else min(self._next_mark, self._next_poll)
        return max(0.0, due - now)

    def tick(self) -> None:
        """Read the counter where it is due (a v1 notification pending, no notification at all, v2's
        quiet time), then snapshot the group's other processes where that is due."""
        now = self.clock()
        if self._pending is not None:
            if self._check(now, notified=True) or now - self._pending >= PENDING_FOR:
                self._pending = None
        elif now >= self._next_poll:  # polled; with the kernel's notification, once a second as a safety net
            self._check(now, notified=self.fd is not None)
            self._next_poll = now + (POLL_EVERY if self.fd is None else MARK_EVERY)
        if now >= self._next_mark:
            t0 = time.perf_counter()
            self.mark = outsiders(self.root, self.group, self.version, self.me)
            took = time.perf_counter() - t0
            self._mark_every = MARK_EVERY * min(MARK_EVERY_MAX, max(1.0, took / MARK_BUDGET))
            self._next_mark = self.clock() + self._mark_every

    def _check(self, now: float, *, notified: bool, ended: bool = False) -> bool:
        """Read the counter; True when it rose (the rise is recorded, with who may have been hit)."""
        n = read_oom_kills(self.root, self.source)
        if n is None or self.count is None or n <= self.count:
            if n is not None and self.count is not None and n < self.count:
                self.count = n  # the group was made anew: count from here
            return False
        kills, self.count = n - self.count, n
        fresh = outsiders(self.root, self.group, self.version, self.me)
        out = self.mark
        leaving = dying(self.root, fresh) if fresh is not None else frozenset()
        others = gone(out, fresh)  # left since the last snapshot, and (below) on their way out now
        others = None if others is None else others + len(leaving)
        hit: bool | None = True if ended or self.pid is None else read_dying(self.root, self.pid)
        self.rises.append(Rise(now, kills, hit, others, notified))
        if fresh is not None:
            self.mark = Members(fresh.known - leaving, fresh.unseen)
        self.outside = outside_memory(self.root, self.group, self.me)
        return True

    def finish(self, ended_at: float) -> Evidence:
        """After the worker was reaped (at *ended_at*, monotonic): the last reading, and the evidence."""
        self._check(self.clock(), notified=False, ended=True)
        self.close()
        if self.before is None or self.count is None:
            return Evidence(None, None)
        kills = sum(r.kills for r in self.rises)
        known = all(r.others_gone is not None for r in self.rises)
        others = sum(r.others_gone or 0 for r in self.rises) if known else None
        inside = at_end = spared = 0
        outlived: float | None = None
        for r in self.rises:
            here = max(0, r.kills - (r.others_gone or 0)) if r.others_gone is not None else 0
            inside += here
            ran_on = r.worker_hit is False or (r.worker_hit is None and ended_at - r.time > GRACE)
            if ran_on:
                spared += r.kills
                outlived = ended_at - r.time
            else:
                at_end += here
        return Evidence(kills, others, inside, at_end, spared, outlived)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
