"""``MemoryBudget``: reservations that keep a worker inside its memory budget (threads and asyncio).

Semantics:
- ``reserve(n, timeout=None)`` blocks until *n* bytes fit, first come first served: a
  large waiting request is not overtaken by later small ones. ``TimeoutError`` on timeout.
- ``backfill=K`` (default 0: first come, first served): a later request that fits may start
  while earlier ones wait, as Slurm's backfill starts small jobs past a blocked head, but each
  waiting request is overtaken at most K times; from then on it blocks those behind it as under
  FIFO, so none starves. Requests carry no run time, so the bound is a count: a waiting request
  is delayed by at most K later grants, each for as long as it is held.
- ``await areserve(n, timeout=None)``: the same for asyncio; threads and tasks share one queue.
- ``try_reserve(n)`` never waits, and returns None while earlier requests wait (with
  ``backfill``: while one of them may be overtaken no more).
- A request larger than the total raises ``ReservationTooLarge`` (a ValueError) at once.
- ``evict(shortfall_bytes)``, when given, is called without the lock held before a request
  waits, so a cache can release reservations to make room (in ``areserve`` it may be async).
- No lost wake-ups: every state change happens under one lock, and a release grants waiting
  requests (in order) before it returns; a waiter checks its own ``granted`` flag, never a
  condition it might have missed.

Watched admission (``watch=True`` or a ``Watch``; runtime/watch.py): a daemon thread samples
the working set of this process's memory cgroup every ~100 ms, and a request is granted only
when it also fits under the hard ceiling minus a guard margin (the rule: ``Admission``).
Waiting requests are re-evaluated after every sample, in order (the head still blocks those
behind it). ``on_over_budget(working_set)`` is called from that thread when the working set
passes ``total``, once per crossing. ``close()`` (or leaving ``with budget:``) stops the
thread; so does garbage collection. A working set that cannot be read makes admission fall
back to reserved bytes only, and says so once in ``watch_warning``.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from oomguard.errors import BudgetUnknownError
from oomguard.policy.admission import Admission
from oomguard.runtime.watch import DEFAULT_INTERVAL, SamplerThread, Watch, sample_once

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterable
    from types import TracebackType

__all__ = ["MemoryBudget", "Reservation", "ReservationTooLarge"]


class ReservationTooLarge(ValueError):
    """The request is larger than the whole budget: it could never be granted."""


class _Waiter:
    __slots__ = ("event", "future", "granted", "loop", "nbytes", "overtaken")

    def __init__(
        self,
        nbytes: int,
        event: threading.Event | None = None,
        future: asyncio.Future[None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.nbytes = nbytes
        self.event = event
        self.future = future
        self.loop = loop
        self.granted = False
        self.overtaken = 0  # later requests granted while this one waited


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Reservation:
    """Bytes held in a MemoryBudget; a context manager that releases what is left on exit."""

    __slots__ = ("_budget", "held", "nbytes")

    def __init__(self, budget: MemoryBudget, nbytes: int) -> None:
        self._budget = budget
        self.nbytes = nbytes  # as granted
        self.held = nbytes  # still held

    def release(self, nbytes: int | None = None) -> None:
        """Release *nbytes* (default: all that is held). Releasing all twice is harmless;
        releasing more than is held raises ValueError."""
        self._budget._release(self, nbytes)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self._budget._release(self, None)

    def __repr__(self) -> str:
        return f"<Reservation {self.held} of {self.nbytes} bytes held>"


class MemoryBudget:
    """A budget of *total_bytes* shared by the threads and asyncio tasks of one process.

    *watch*: None (reserved bytes only), ``True`` (this process's memory cgroup, probed now)
    or a ``Watch`` (any sampler: a test's, a Root over a snapshot); the first sample is taken
    here. *on_over_budget*, with a watch only, is called with the working set when it passes
    *total_bytes*, once per crossing (from the sampler thread; from here if it already has).
    *backfill*: how many later requests may be granted before a waiting one (module doc).
    """

    def __init__(
        self,
        total_bytes: int,
        evict: Callable[[int], Any] | None = None,
        *,
        watch: Watch | bool | None = None,
        on_over_budget: Callable[[int], Any] | None = None,
        backfill: int = 0,
    ) -> None:
        if isinstance(total_bytes, bool) or not isinstance(total_bytes, int) or total_bytes < 0:
            raise ValueError(f"total_bytes must be a non-negative int, got {total_bytes!r}")
        if isinstance(backfill, bool) or not isinstance(backfill, int) or backfill < 0:
            raise ValueError(f"backfill must be a non-negative int, got {backfill!r}")
        self.backfill = backfill
        if on_over_budget is not None and not watch:
            raise ValueError("on_over_budget needs a watch (watch=True or a Watch)")
        self.total = total_bytes
        self._used = 0
        self.peak_reserved = 0  # the most bytes held at once
        self._lock = threading.Lock()
        self._waiters: deque[_Waiter] = deque()
        self._evict = evict
        self._on_over = on_over_budget
        self.watch: Watch | None = Watch.live() if watch is True else (watch or None)
        self.hook_error: BaseException | None = None  # the last exception raised by on_over_budget
        self._admission = Admission(self.watch) if self.watch is not None else None
        self._sampler: SamplerThread | None = None
        if self.watch is not None:
            self._observe(sample_once(self.watch))
            if self.watch.ceiling is not None:
                self._sampler = SamplerThread(self, self.watch)

    @classmethod
    def from_system(
        cls,
        evict: Callable[[int], Any] | None = None,
        *,
        watch: bool = False,
        guard_margin: int | str | None = None,
        interval: float = DEFAULT_INTERVAL,
        on_over_budget: Callable[[int], Any] | None = None,
        backfill: int = 0,
        **budget_options: Any,
    ) -> MemoryBudget:
        """A budget from the probe: ``budget``, ``margin``, ``root``, ``gpu`` as for ``oomguard.probe()``.

        *watch* True watches the memory cgroup the probe found (through the same root), with
        *guard_margin* (bytes or text: ``"64MiB"``, ``"2%"``; default max(64 MiB, 2% of the
        ceiling)) and a sample every *interval* seconds.
        *backfill* as for ``MemoryBudget``.
        """
        from oomguard.policy.budget import probe
        from oomguard.sources.root import Root, open_root

        root = budget_options.pop("root", None)
        r = root if isinstance(root, Root) else open_root(root)
        report = probe(r, **budget_options)
        total = report["budget"]["bytes"]
        if total is None:
            raise BudgetUnknownError("MemoryBudget.from_system", "pass budget=SIZE")
        w = Watch.from_report(report, r, margin=guard_margin, interval=interval) if watch else None
        return cls(total, evict=evict, watch=w, on_over_budget=on_over_budget, backfill=backfill)

    def close(self) -> None:
        """Stop watching: the sampler thread ends, and admission falls back to reserved bytes
        only (waiting requests are re-evaluated). Reservations stay valid; calling it again is harmless."""
        if self._sampler is not None:
            self._sampler.close()
        with self._lock:
            if self._admission is not None:
                self._admission.active = False
            if self._waiters:
                self._grant_locked()

    def __enter__(self) -> MemoryBudget:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _observe(self, ws: int | None) -> None:
        """A sample (from the sampler thread): learn, grant who now fits, call the hook on a crossing."""
        with self._lock:
            adm = self._admission
            if adm is None or not adm.active:
                return
            crossed = adm.observe(ws, self._used, self.total)
            if self._waiters:
                self._grant_locked()
        if crossed and ws is not None and self._on_over is not None:
            try:
                self._on_over(ws)
            except Exception as exc:  # the sampler thread must live on
                self.hook_error = exc

    def observation(self, profile: str, per_job: int, baseline: int = 0, outcome: str = "ok") -> dict[str, Any] | None:
        """What this budget's jobs really used, as an observation for the fleet manager's
        recommender (``POST /api/v1/observations``; ``oomguard.send_observation`` sends it), or
        None: no watch, or no overshoot learned yet (``Admission``: two samples in a row with at
        least a sixteenth of the ceiling reserved).

        The caller reserves *per_job* bytes a job (its declared size) beside *baseline*. Per job:
        *per_job* times the overshoot ratio the watch learned (the working set's rise over the
        bytes reserved, the most two samples in a row said); the baseline: the working set seen
        with nothing reserved; the concurrency: the most bytes held at once over *per_job*.
        Bias: the ratio is the largest seen, so each job reads as large as the worst moment
        (the safe way); jobs that reserve less than *per_job* read larger."""
        if isinstance(per_job, bool) or not isinstance(per_job, int) or per_job <= 0:
            raise ValueError(f"per_job must be an int above 0, got {per_job!r}")
        if self._admission is None:
            return None
        import math

        from oomguard.times import iso_now

        with self._lock:
            adm = self._admission
            if not adm.learned:
                return None
            return {
                "profile": profile,
                "declared_per_job_bytes": per_job,
                "peak_per_job_bytes": math.ceil(per_job * adm.k),
                "declared_baseline_bytes": baseline,
                "peak_baseline_bytes": adm.baseline,
                "concurrency": max(1, round(self.peak_reserved / per_job)),
                "outcome": outcome,
                "time": iso_now(),
            }

    @property
    def watch_warning(self) -> str | None:
        """Set once, when the working set could not be read (admission then uses reserved bytes only)."""
        return None if self._admission is None else self._admission.warning

    @property
    def working_set(self) -> int | None:
        """The last sampled working set in bytes (None: not watching, or unknown)."""
        adm = self._admission
        return None if adm is None or not adm.active else adm.ws

    @property
    def overshoot(self) -> float | None:
        """The ratio of real to reserved bytes that admission assumes (None: not watching)."""
        return None if self._admission is None else self._admission.factor

    @property
    def used(self) -> int:
        return self._used

    @property
    def available(self) -> int:
        return self.total - self._used

    @property
    def waiting(self) -> int:
        """How many requests are waiting."""
        return len(self._waiters)

    def __repr__(self) -> str:
        ws = "" if self.working_set is None else f", working set {self.working_set}"
        return f"<MemoryBudget used={self._used} of {self.total} bytes, {len(self._waiters)} waiting{ws}>"

    def _check(self, nbytes: int) -> None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
        if nbytes > self.total:
            raise ReservationTooLarge(f"a request of {nbytes} bytes can never fit in a budget of {self.total} bytes")

    def _fits_locked(self, nbytes: int) -> bool:
        if self._used + nbytes > self.total:
            return False
        excess = None if self._admission is None else self._admission.excess(self._used, nbytes)
        return excess is None or excess <= 0

    def _take_locked(self, nbytes: int) -> bool:
        """Take *nbytes* for a new request if they fit and it may pass every waiting one."""
        if not self._fits_locked(nbytes) or not self._may_pass(self._waiters):
            return False
        for ahead in self._waiters:
            ahead.overtaken += 1
        self._used += nbytes
        self.peak_reserved = max(self.peak_reserved, self._used)
        return True

    def _may_pass(self, ahead: Iterable[_Waiter]) -> bool:
        """Whether a request may be granted before the waiting requests *ahead* of it."""
        return all(w.overtaken < self.backfill for w in ahead)

    def try_reserve(self, nbytes: int) -> Reservation | None:
        """A reservation if *nbytes* fit now and nobody is waiting (with *backfill*: nobody who
        may be overtaken no more); else None. Never waits."""
        self._check(nbytes)
        with self._lock:
            if not self._take_locked(nbytes):
                return None
        return Reservation(self, nbytes)

    def _shortfall(self, nbytes: int) -> int:
        """Bytes missing for *nbytes*: the larger of the reserved and the watched shortfall."""
        excess = None if self._admission is None else self._admission.excess(self._used, nbytes)
        return max(self._used + nbytes - self.total, excess or 0)

    def _take_or_shortfall(self, nbytes: int) -> int | None:
        """Take *nbytes* now if they fit (None), else the bytes missing; ``reserve`` and ``areserve``."""
        self._check(nbytes)
        with self._lock:
            return None if self._take_locked(nbytes) else self._shortfall(nbytes)

    def reserve(self, nbytes: int, timeout: float | None = None) -> Reservation:
        """Wait until *nbytes* fit (first come, first served, or as *backfill* allows);
        TimeoutError after *timeout* seconds."""
        short = self._take_or_shortfall(nbytes)
        if short is None:
            return Reservation(self, nbytes)
        if self._evict is not None and short > 0:
            self._evict(short)
        waiter = _Waiter(nbytes, event=threading.Event())
        with self._lock:
            if self._take_locked(nbytes):
                return Reservation(self, nbytes)
            self._waiters.append(waiter)
        assert waiter.event is not None
        if not waiter.event.wait(timeout) and not self._abandon(waiter):
            raise TimeoutError(f"{nbytes} bytes did not fit within {timeout} s ({self!r})")
        return Reservation(self, nbytes)

    async def areserve(self, nbytes: int, timeout: float | None = None) -> Reservation:
        """``reserve`` for asyncio: the same queue, the same order."""
        import asyncio
        import inspect

        short = self._take_or_shortfall(nbytes)
        if short is None:
            return Reservation(self, nbytes)
        if self._evict is not None and short > 0:
            result = self._evict(short)
            if inspect.isawaitable(result):
                await result
        loop = asyncio.get_running_loop()
        waiter = _Waiter(nbytes, future=loop.create_future(), loop=loop)
        with self._lock:
            if self._take_locked(nbytes):
                return Reservation(self, nbytes)
            self._waiters.append(waiter)
        assert waiter.future is not None
        try:
            await asyncio.wait_for(waiter.future, timeout)
        except asyncio.TimeoutError:
            if not self._abandon(waiter):
                raise TimeoutError(f"{nbytes} bytes did not fit within {timeout} s ({self!r})") from None
        except asyncio.CancelledError:
            if self._abandon(waiter):  # granted as we were cancelled: give it back
                self._release(Reservation(self, nbytes), None)
            raise
        return Reservation(self, nbytes)

    def _abandon(self, waiter: _Waiter) -> bool:
        """Stop waiting. True when the request was granted meanwhile (the caller owns it)."""
        with self._lock:
            if waiter.granted:
                return True
            self._waiters.remove(waiter)
            self._grant_locked()  # the head may have been blocking smaller requests
            return False

    def _grant_locked(self) -> None:
        """Grant the waiting requests that fit, in order; with *backfill*, past those that do not
        fit, while each of those may still be overtaken."""
        ahead: list[_Waiter] = []  # looked at, still waiting
        for w in list(self._waiters):
            if not self._may_pass(ahead):  # one of them may be overtaken no more: nobody behind it starts
                return
            if not self._fits_locked(w.nbytes):
                ahead.append(w)
                continue
            for a in ahead:
                a.overtaken += 1
            self._waiters.remove(w)
            self._used += w.nbytes
            self.peak_reserved = max(self.peak_reserved, self._used)
            w.granted = True
            if w.event is not None:
                w.event.set()
            else:
                assert w.loop is not None and w.future is not None
                try:
                    w.loop.call_soon_threadsafe(_resolve, w.future)
                except RuntimeError:  # its event loop is closed: nobody will take it
                    w.granted = False
                    self._used -= w.nbytes

    def _release(self, reservation: Reservation, nbytes: int | None) -> None:
        with self._lock:
            n = reservation.held if nbytes is None else nbytes
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
            if n > reservation.held:
                raise ValueError(f"cannot release {n} bytes: the reservation holds {reservation.held}")
            reservation.held -= n
            self._used -= n
            if self._admission is not None:
                self._admission.released += n
            if self._waiters:
                self._grant_locked()
                if self._waiters and self._sampler is not None:
                    self._sampler.poke()  # usage may have fallen: look now, not in up to 100 ms
