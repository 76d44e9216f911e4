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
  a CPU), so the wake-up comes within about half a MiB per CPU of the crossing. The threshold is
  moved when the inactive file cache has moved by more than a quarter of the margin, at most once
  a second: registering one waits for an RCU grace period (``synchronize_rcu`` in
  ``__mem_cgroup_usage_register_event``, 10-20 ms measured here), which would stall sampling.
- **v2: memory.events** (cgroup-v2.rst, "memory.events": "A value change in this file generates a
  file modified event"): polled for POLLPRI, it wakes the guard on ``high`` (over
  ``memory.high``, with ``--isolate``) and ``max`` (usage reached ``memory.max``: the kernel is
  reclaiming, and kills only when that fails). kernfs re-arms the notification when the file is
  read again (fs/kernfs/file.c, ``kernfs_generic_poll``). v2 has no usage threshold, so without
  ``--isolate`` the faster sampling near the ceiling is what catches fast growth (guard.py).

Everything here is best effort: where the files are missing (a fake tree, no v1 event support),
or a registration is refused, the guard samples as before, and says so once.
"""

from __future__ import annotations

import contextlib
import os
import select
import time

from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import Root

REARM_AFTER = 1.0  # seconds: a threshold is moved at most this often


class Alarm:
    """The file descriptors that wake the guard for the group *group* (cgroup *version*)."""

    def __init__(self, root: Root, fs: CgroupFS, group: str, version: int) -> None:
        self.root, self.fs, self.group, self.version = root, fs, group, version
        self.fd: int | None = None  # the eventfd (v1) or memory.events (v2)
        self.threshold: int | None = None  # v1: the usage the eventfd is registered at
        self.armed_at = float("-inf")
        self.failure: str | None = None  # why the kernel's wake-ups are off (said once)
        self.wakeups = 0

    @property
    def events(self) -> int:
        """What to poll ``fd`` for."""
        return select.POLLIN if self.version == 1 else select.POLLPRI

    def arm(self, stop_line: int, margin: int, inactive: int | None) -> None:
        """Make the kernel wake the guard when the working set reaches *stop_line* (v1: usage at
        *stop_line* + *inactive*); a no-op where that is armed already or cannot be done. A v1
        threshold moves when *inactive* has moved by more than *margin* / 4 (at most once a second)."""
        if self.failure is not None:
            return
        if self.version == 2:
            if self.fd is None:
                self._open_events()
            return
        threshold = stop_line + (inactive or 0)
        if self.threshold is not None:
            drift = abs(threshold - self.threshold)
            if drift * 4 <= margin or time.monotonic() - self.armed_at < REARM_AFTER:
                return
        self._register(threshold)

    def _open_events(self) -> None:
        if not self.root.exists(self.group + "/memory.events"):
            self.failure = f"{self.group}/memory.events is missing"
            return
        try:
            self.fd = self.fs.open_events(self.group)
            os.read(self.fd, 4096)  # kernfs notifies the changes after this read
        except OSError as exc:
            self._off(f"cannot open {self.group}/memory.events: {exc.strerror}")

    def _register(self, threshold: int) -> None:
        if not self.root.exists(self.group + "/cgroup.event_control"):
            self.failure = f"{self.group} has no cgroup.event_control"
            return
        try:
            fd = self.fs.usage_threshold(self.group, threshold)
        except OSError as exc:
            self._off(f"cannot register a usage threshold on {self.group}: {exc.strerror}")
            return
        self.close()  # the new one first, then the old: never a moment unwatched
        self.fd, self.threshold, self.armed_at = fd, threshold, time.monotonic()

    def _off(self, why: str) -> None:
        self.close()
        self.failure = why

    def drain(self) -> None:
        """After a wake-up: reset the eventfd, or re-read memory.events so kernfs notifies again."""
        if self.fd is None:
            return
        self.wakeups += 1
        with contextlib.suppress(OSError):  # EAGAIN: nothing pending (a spurious wake-up)
            if self.version == 1:
                os.read(self.fd, 8)
            else:
                os.lseek(self.fd, 0, os.SEEK_SET)
                os.read(self.fd, 4096)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # v1: closing the eventfd unregisters the threshold
            self.fd, self.threshold = None, None
