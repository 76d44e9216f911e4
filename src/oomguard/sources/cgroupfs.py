"""Writes to a cgroup file system: the only place oomguard changes files under /sys/fs/cgroup.

Reads go through a ``Root`` (``sources/root.py``); the few writes ``run --isolate`` needs
(make a sub-group, set its limit, move a process into it, enable a controller for children,
kill what is in a group, remove it) go through a ``CgroupFS``. Paths are absolute as on the
system ("/sys/fs/cgroup/a/b"); *base* "/" is the live system, a directory is a fake tree for
tests (the same tree a ``DirRoot`` reads). Errors are ``OSError``: the caller decides what a
refused write means. ``drain`` (kill what is in a group, then remove it) reads the group through a
``Root`` and writes through a ``CgroupFS``.

Kernel interface (Documentation/admin-guide/cgroup-v2.rst, "Basic Operations"; cgroup-v1/cgroups.rst):
a sub-group is created with mkdir(2) and removed with rmdir(2) once it has no processes; a
process is moved by writing its PID to the destination's ``cgroup.procs``; a limit is set by
writing a number to ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1); v2 controllers are
enabled for the children by writing "+memory" to ``cgroup.subtree_control``; writing "1" to a
v2 group's ``cgroup.kill`` (Linux >= 5.14) SIGKILLs every process in it and below it.

The file descriptors ``run`` polls are opened here too: for ``--guard`` (supervisor/alarm.py) a
v1 usage threshold and a v1 memory pressure level, for every run a v1 OOM notification
(supervisor/oomwatch.py), each registered by a write to ``cgroup.event_control``; and a v2
group's ``memory.events``.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Iterable

from oomguard.sources.root import Root


class CgroupFS:
    """Write access to the cgroup files under *base* ("/" for the live system)."""

    def __init__(self, base: str = "/") -> None:
        self.base = os.path.abspath(base)

    def _path(self, path: str) -> str:
        return os.path.join(self.base, path.lstrip("/"))

    def write_text(self, path: str, value: str) -> None:
        """Write *value* to the control file *path* in one write(2), as the kernel expects.

        Opened as ``open(path, "w")`` would (O_CREAT|O_TRUNC): cgroupfs ignores both for an
        existing control file, and a fake tree gets the file made.
        """
        fd = os.open(self._path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def usage_threshold(self, group: str, nbytes: int) -> int:
        """An eventfd the kernel signals when *group*'s v1 usage crosses *nbytes*, either way.

        Documentation/admin-guide/cgroup-v1/memory.rst, "9. Memory thresholds": "create an
        eventfd using eventfd(2); open memory.usage_in_bytes ...; write string like "<event_fd>
        <fd of memory.usage_in_bytes> <threshold>" to cgroup.event_control. Application will be
        notified through eventfd when memory usage crosses threshold in any direction." Closing
        the eventfd unregisters it. Non-blocking, close-on-exec; ``OSError`` if refused.
        """
        return self._event_control(group, "memory.usage_in_bytes", str(int(nbytes)))

    def pressure_level(self, group: str, level: str) -> int:
        """An eventfd the kernel signals at reclaim of *level* (e.g. "low,hierarchy") in *group*.

        memory.rst, "11. Memory Pressure": "write string as "<event_fd> <fd of
        memory.pressure_level> <level[,mode]>" to cgroup.event_control". Non-blocking,
        close-on-exec; ``OSError`` if refused.
        """
        return self._event_control(group, "memory.pressure_level", level)

    def oom_notification(self, group: str) -> int:
        """An eventfd the kernel signals when *group* runs out of memory (an OOM of the group or of an
        ancestor whose limit it shares).

        cgroup-v1/memory.rst §10 "OOM Control": "write string like "<event_fd> <fd of
        memory.oom_control>" to cgroup.event_control. The application will be notified through
        eventfd when OOM happens. OOM notification doesn't work for the root cgroup." The kernel
        signals the group that ran out and every group below it (mm/memcontrol-v1.c,
        ``mem_cgroup_oom_notify``), before the OOM killer picks its victim. Non-blocking,
        close-on-exec; ``OSError`` if refused.
        """
        return self._event_control(group, "memory.oom_control", None)

    def _event_control(self, group: str, name: str, argument: str | None) -> int:
        """A v1 notification: an eventfd registered for *group*'s file *name* with *argument*."""
        efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            ufd = os.open(self._path(group + "/" + name), os.O_RDONLY | os.O_CLOEXEC)
            try:
                line = f"{efd} {ufd}" + ("" if argument is None else f" {argument}")
                self.write_text(group + "/cgroup.event_control", line)
            finally:
                os.close(ufd)  # the kernel holds its own reference for the registration
        except BaseException:
            os.close(efd)
            raise
        return efd

    def open_events(self, group: str) -> int:
        """A v2 group's ``memory.events``, opened to be polled for POLLPRI (cgroup-v2.rst,
        "memory.events": "A value change in this file generates a file modified event")."""
        return os.open(self._path(group + "/memory.events"), os.O_RDONLY | os.O_CLOEXEC)

    def mkdir(self, path: str) -> None:
        os.mkdir(self._path(path))

    def rmdir(self, path: str) -> None:
        os.rmdir(self._path(path))

    def kill_pids(self, pids: Iterable[int]) -> int:
        """SIGKILL each PID (v1 has no ``cgroup.kill``); how many were signalled.

        A process already gone, or not ours to signal, is skipped: the caller reads the group
        again to see what is left. PIDs are those of the caller's PID namespace.
        """
        sent = 0
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            sent += 1
        return sent


# -- clean-up: kill what is in a group, then remove it --------------------------------------------


def consume_notification(fd: int, version: int) -> bool:
    """After *fd* woke a poll: reset the v1 eventfd (an 8-byte counter, eventfd(2)) or re-read the v2
    file from its start (kernfs notifies a poller again only after a read: cgroup-v2.rst, "a value
    change in this file generates a file modified event"). False when nothing was pending (EAGAIN)."""
    try:
        if version == 1:
            os.read(fd, 8)
        else:
            os.lseek(fd, 0, os.SEEK_SET)
            os.read(fd, 4096)
    except OSError:
        return False
    return True


def group_pids(root: Root, path: str) -> list[int]:
    """The PIDs in *path*'s ``cgroup.procs``, one a line (0: a process outside this PID namespace)."""
    text = root.text(path + "/cgroup.procs") or ""
    return [int(w) for w in text.split() if w.isascii() and w.isdigit()]


def group_tree(root: Root, path: str) -> list[str]:
    """*path* and every group below it, deepest first (a group is a directory with ``cgroup.procs``)."""
    below: list[str] = []
    for name in root.names(path):
        sub = os.path.join(path, name)
        if root.exists(sub + "/cgroup.procs"):
            below += group_tree(root, sub)
    return [*below, path]


def _kill(root: Root, fs: CgroupFS, path: str, pids: list[int]) -> None:
    """SIGKILL everything in *path*'s tree.

    cgroup-v2.rst, ``cgroup.kill`` (Linux >= 5.14): "Writing "1" to the file causes the cgroup
    and all descendant cgroups to be killed ... via SIGKILL", atomically against forks. Where it
    is missing (v1, older kernels) each PID read from ``cgroup.procs`` gets SIGKILL, and the
    caller reads again for processes forked meanwhile. This process itself is never signalled.
    """
    if os.getpid() not in pids and root.exists(path + "/cgroup.kill"):
        try:
            fs.write_text(path + "/cgroup.kill", "1")
            return
        except OSError:
            pass
    fs.kill_pids(p for p in pids if p > 0 and p != os.getpid())


def _rmdir_tree(fs: CgroupFS, groups: list[str], deadline: float) -> str | None:
    """rmdir each group, deepest first; EBUSY (processes still leaving) is retried until *deadline*."""
    for group in groups:
        while True:
            try:
                fs.rmdir(group)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                    return f"cannot remove {group}: {exc.strerror}"
                time.sleep(0.01)
    return None


def drain(root: Root, fs: CgroupFS, path: str, timeout: float = 2.0, remove: bool = True) -> tuple[int, str | None]:
    """Kill every process in *path*'s tree until none is left, then (with *remove*) remove the tree.

    Returns (the number of processes found in it, None or why it stays). *timeout* 0 sends one
    round of SIGKILL and does not wait.
    """
    deadline = time.monotonic() + timeout
    found: int | None = None
    while True:
        groups = group_tree(root, path)
        pids = [p for g in groups for p in group_pids(root, g)]
        left = [p for p in pids if p != os.getpid()]
        found = len(left) if found is None else found
        if not left:
            break
        _kill(root, fs, path, pids)
        if time.monotonic() >= deadline:
            if remove:
                return found, f"{len(left)} process(es) still in {path} after SIGKILL"
            return found, None
        time.sleep(0.01)
    if os.getpid() in pids:  # the caller sits in the group: it stays, and waiting will not change that
        deadline = time.monotonic()
    return found, _rmdir_tree(fs, groups, deadline) if remove else None
