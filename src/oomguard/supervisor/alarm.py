"""The kernel's wake-ups for ``run --guard``: act when usage crosses the stop line, not a sample later.

A worker that grows faster than the guard margin per sampling interval passes the stop line and
the ceiling between two samples (docs/guard.md). So, besides sampling, the guard asks the kernel
to wake it:

- **v1: a usage threshold** (Documentation/admin-guide/cgroup-v1/memory.rst, "9. Memory
  thresholds"): an eventfd registered through ``cgroup.event_control`` at *stop line + inactive
  file cache*, so that it fires when the working set (usage - inactive_file, as sampled) reaches
  the stop line. "Application will be notified through eventfd when memory usage crosses
  threshold in any direction": the guard then samples at once. The kernel checks thresholds
  while it charges pages (mm/memcontrol-v1.c, ``memcg1_check_events``, every 128 page events of
  a CPU), so the wake-up comes within about half a MiB per CPU of the crossing. v1 usage never
  exceeds the limit (at the limit the kernel reclaims, then OOM-kills), so the threshold is kept
  at most half a margin above the stop line: with more page cache than that, a threshold at the
  stop line + the cache would never be crossed. It wakes the guard early then (a sample, no
  stop). The threshold is moved when it has moved by more than a quarter of the margin, at most
  once a second: registering one waits for an RCU grace period (``synchronize_rcu`` in
  ``__mem_cgroup_usage_register_event``, 10-20 ms measured here), which would stall sampling.
- **v1: reclaim** (memory.rst, "11. Memory Pressure": "The "low" level means that the system is
  reclaiming memory for new allocations"): an eventfd registered once through
  ``cgroup.event_control`` on ``memory.pressure_level``, level ``low``, mode ``hierarchy``
  (delivered even where a descendant has a listener of its own). A worker that filled its group
  with page cache keeps the usage at the limit while its own memory replaces the cache: the usage
  no longer moves, and no threshold can see the working set grow. The kernel's limit reclaim
  runs then, and signals this eventfd about every 512 pages scanned (mm/vmpressure.c,
  ``vmpressure_win``). No RCU wait here (``vmpressure_register_event``).
- **v2: memory.events** (cgroup-v2.rst, "memory.events": "A value change in this file generates a
  file modified event"): polled for POLLPRI, it wakes the guard on ``high`` (over
  ``memory.high``, with ``--isolate``) and ``max`` (usage reached ``memory.max``: the kernel is
  reclaiming, and kills only when that fails). kernfs re-arms the notification when the file is
  read again (fs/kernfs/file.c, ``kernfs_generic_poll``). v2 has no usage threshold, so without
  ``--isolate`` the faster sampling near the ceiling is what catches fast growth (guard.py).

Everything here is best effort: where the files are missing (a fake tree, no v1 event support),
or a registration is refused, the guard samples as before, and says so once (``notes``). The
wake-ups that read an event are counted (``wakeups``): the exit event's message tells them.
"""

from __future__ import annotations

import os
import select
import time

from oomguard.sources.cgroupfs import CgroupFS, consume_notification
from oomguard.sources.root import Root

REARM_AFTER = 1.0  # seconds: a threshold is moved at most this often
RECLAIM_LEVEL = "low,hierarchy"  # memory.pressure_level: any reclaim in the group or below it


class Alarm:
    """The file descriptors that wake the guard for the group *group* (cgroup *version*)."""

    def __init__(self, root: Root, fs: CgroupFS, group: str, version: int) -> None:
        self.root, self.fs, self.group, self.version = root, fs, group, version
        self.fd: int | None = None  # the usage threshold's eventfd (v1) or memory.events (v2)
        self.reclaim: int | None = None  # v1: the memory.pressure_level eventfd
        self.threshold: int | None = None  # v1: the usage the eventfd is registered at
        self.armed_at = float("-inf")
        self.failure: str | None = None  # why the kernel's wake-ups are off
        self.notes: list[str] = []  # what the guard has to say once (taken by it)
        self.wakeups = 0  # wake-ups that read an event
        self._reclaim_tried = False

    @property
    def events(self) -> int:
        """What to poll the ``fds`` for."""
        return select.POLLIN if self.version == 1 else select.POLLPRI

    def fds(self) -> list[int]:
        """The file descriptors to poll now."""
        return [fd for fd in (self.fd, self.reclaim) if fd is not None]

    def arm(self, stop_line: int, margin: int, inactive: int | None) -> None:
        """Make the kernel wake the guard when the working set reaches *stop_line* (v1: usage at
        *stop_line* + *inactive*, at most *stop_line* + *margin* / 2, and on reclaim); a no-op
        where that is armed already or cannot be done. A v1 threshold moves when it has moved by
        more than *margin* / 4 (at most once a second)."""
        if self.failure is not None:
            return
        if self.version == 2:
            if self.fd is None:
                self._open_events()
            return
        if not self._reclaim_tried:  # the first arm
            if not self.root.exists(self.group + "/cgroup.event_control"):
                self._off(f"{self.group} has no cgroup.event_control")
                return
            self._reclaim_tried = True
            self._listen_reclaim()
        threshold = stop_line + min(inactive or 0, margin // 2)
        if self.threshold is not None:
            drift = abs(threshold - self.threshold)
            if drift * 4 <= margin or time.monotonic() - self.armed_at < REARM_AFTER:
                return
        self._register(threshold)

    def pop_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes

    def _open_events(self) -> None:
        if not self.root.exists(self.group + "/memory.events"):
            self._off(f"{self.group}/memory.events is missing")
            return
        try:
            self.fd = self.fs.open_events(self.group)
            os.read(self.fd, 4096)  # kernfs notifies the changes after this read
        except OSError as exc:
            self._off(f"cannot open {self.group}/memory.events: {exc.strerror}")

    def _listen_reclaim(self) -> None:
        why = "no wake-up while the group reclaims at its limit"
        if not self.root.exists(self.group + "/memory.pressure_level"):
            self.notes.append(f"{self.group} has no memory.pressure_level: {why}")
            return
        try:
            self.reclaim = self.fs.pressure_level(self.group, RECLAIM_LEVEL)
        except OSError as exc:
            self.notes.append(f"cannot listen to {self.group}/memory.pressure_level: {exc.strerror}: {why}")

    def _register(self, threshold: int) -> None:
        try:
            fd = self.fs.usage_threshold(self.group, threshold)
        except OSError as exc:
            self._off(f"cannot register a usage threshold on {self.group}: {exc.strerror}")
            return
        if self.fd is not None:  # the new one first, then the old: never a moment unwatched
            os.close(self.fd)
        self.fd, self.threshold, self.armed_at = fd, threshold, time.monotonic()

    def _off(self, why: str) -> None:
        self.close()
        self.failure = why
        self.notes.append(f"{why}: no wake-up from the kernel, sampling only")

    def drain(self, fd: int) -> None:
        """After *fd* woke the guard: reset the eventfd, or re-read memory.events so kernfs
        notifies again. A wake-up that reads an event counts."""
        if not consume_notification(fd, self.version):
            return  # nothing pending: a spurious wake-up
        self.wakeups += 1

    def close(self) -> None:
        """Close every file descriptor (v1: closing an eventfd unregisters it)."""
        for fd in self.fds():
            os.close(fd)
        self.fd, self.reclaim, self.threshold = None, None, None
