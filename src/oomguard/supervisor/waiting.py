"""Waiting for the worker: its exit, the kernel's wake-ups, and what is sampled meanwhile.

The supervisor does not block in ``wait4`` while the worker runs: it polls a pidfd of the worker
(Linux >= 5.3; where there is none it sleeps between checks), the file descriptors through which
the kernel wakes it (the OOM notification of ``oomwatch.py``; with ``--guard`` the guard's alarm,
``alarm.py``), and times out for what is sampled on a clock: the guard (100 ms, 20 ms near the
ceiling), the group's other processes (``oomwatch.py``, every second) and the worker tree's
``VmHWM`` (``peak.py``). Without ``--guard`` that is about one wake-up a second.

A waker is anything with ``fds()``, ``events`` (what to poll them for) and ``drain(fd)`` (called
once one of its fds is ready). After a wake-up, a waker is left out for its ``quiet`` seconds
(``FAST_QUIET``, 20 ms, by default; the OOM watch 100 ms), then polled again within the same wait:
a v2 group throttled over ``memory.high`` or at its ``memory.max`` changes ``memory.events`` up to
100 times a second (kernfs rate-limits its notifications to one per 10 ms), a v1 group reclaiming
at its limit signals about every 2 MiB scanned. So the guard's alarm wakes the supervisor at most
50 times a second, the OOM watch 10 times. Each wake-up of the OOM watch, and each stop by the
guard, also samples the worker tree's VmHWM (``peak.py``): the group is at its limit then.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import time
from collections.abc import Callable, Iterator
from typing import Protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard.supervisor.guard import Guard
    from oomguard.supervisor.oomwatch import OomWatch
    from oomguard.supervisor.peak import TreePeak

FAST_QUIET = 0.02  # seconds a waker is not polled after it woke the supervisor
# The longest single poll: poll(2) takes an int of milliseconds (CPython's select.poll raises
# OverflowError "timeout is too large" above INT_MAX ms, 24.8 days); a longer wait (a backoff of
# --backoff-max 30d) polls again, as after any early wake-up.
POLL_MAX_S = 86400.0


class Waker(Protocol):
    @property
    def events(self) -> int: ...

    def fds(self) -> list[int]: ...

    def drain(self, fd: int) -> None: ...


@contextlib.contextmanager
def exit_waiter(pid: int, *wakers: Waker | None) -> Iterator[Callable[[float], None]]:
    """A function that waits up to N seconds, or until *pid* exits (a pidfd) or a waker's fd is
    ready (then drained, and that waker left out for ``FAST_QUIET``); it sleeps where it has none."""
    try:
        fd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    live = [w for w in wakers if w is not None]
    quiet_until = [float("-inf")] * len(live)

    def wait(seconds: float) -> None:
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end:
            owner: dict[int, int] = {}
            for i, w in enumerate(live):
                if now >= quiet_until[i]:
                    owner |= {f: i for f in w.fds()}
            wake_at = min([end, *(q for q in quiet_until if q > now)])
            span = min(wake_at - now, POLL_MAX_S)
            if fd is None and not owner:
                time.sleep(span)
                continue
            poller = select.poll()  # afresh each time: a moved threshold is a new eventfd
            if fd is not None:
                poller.register(fd, select.POLLIN)
            for f, i in owner.items():
                poller.register(f, live[i].events)
            ready = [f for f, _ in poller.poll(span * 1000)]
            woke = [f for f in ready if f in owner]
            for f in woke:
                waker = live[owner[f]]
                waker.drain(f)
                quiet_until[owner[f]] = time.monotonic() + getattr(waker, "quiet", FAST_QUIET)
            if ready:  # the worker exited, or the kernel woke us
                return

    try:
        yield wait
    finally:
        if fd is not None:
            os.close(fd)


def wait_worker(
    pid: int,
    watch: OomWatch,
    peak: TreePeak,
    *,
    guard: Guard | None = None,
    watching: Callable[[], bool] = lambda: True,
    stop: Callable[[], None] = lambda: None,
) -> tuple[int, resource.struct_rusage, float]:
    """Wait for the child *pid* while *watch* follows the group's OOM kills, *peak* samples the
    tree and *guard* (while *watching*) samples the group, calling ``stop`` when the guard says so.
    Returns the wait status, the resource usage (as ``os.wait4``) and when it ended (monotonic)."""
    try:
        with exit_waiter(pid, watch, guard.alarm if guard is not None else None) as wait_exit:
            while True:
                done, status, usage = os.wait4(pid, os.WNOHANG)
                if done:
                    return status, usage, time.monotonic()
                peak.tick()
                watch.tick()
                if guard is not None and watching() and guard.tick():
                    stop()
                    peak.sample()  # the working set at the stop line: the worker's peak is now
                due = [peak.interval(), watch.interval()] + ([guard.interval()] if guard is not None else [])
                wakes = watch.wakes
                wait_exit(max(0.001, min(due)))
                if watch.wakes != wakes:  # the kernel said the group ran out (v1) or hit memory.max (v2)
                    peak.sample()
    finally:
        if guard is not None:
            guard.close()
