"""``MemoryBudget``: reservations that keep a worker inside its memory budget (threads and asyncio).

Semantics:
- ``reserve(n, timeout=None)`` blocks until *n* bytes fit, first come first served: a
  large waiting request is not overtaken by later small ones. ``TimeoutError`` on timeout.
- ``await areserve(n, timeout=None)``: the same for asyncio; threads and tasks share one queue.
- ``try_reserve(n)`` never waits, and returns None while earlier requests wait.
- A request larger than the total raises ``ReservationTooLarge`` (a ValueError) at once.
- ``evict(shortfall_bytes)``, when given, is called without the lock held before a request
  waits, so a cache can release reservations to make room (in ``areserve`` it may be async).
- No lost wake-ups: every state change happens under one lock, and a release grants waiting
  requests (in order) before it returns; a waiter checks its own ``granted`` flag, never a
  condition it might have missed.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from oomguard.errors import BudgetUnknownError

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable
    from types import TracebackType

__all__ = ["MemoryBudget", "Reservation", "ReservationTooLarge"]


class ReservationTooLarge(ValueError):
    """The request is larger than the whole budget: it could never be granted."""


class _Waiter:
    __slots__ = ("event", "future", "granted", "loop", "nbytes")

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
    """A budget of *total_bytes* shared by the threads and asyncio tasks of one process."""

    def __init__(self, total_bytes: int, evict: Callable[[int], Any] | None = None) -> None:
        if isinstance(total_bytes, bool) or not isinstance(total_bytes, int) or total_bytes < 0:
            raise ValueError(f"total_bytes must be a non-negative int, got {total_bytes!r}")
        self.total = total_bytes
        self._used = 0
        self._lock = threading.Lock()
        self._waiters: deque[_Waiter] = deque()
        self._evict = evict

    @classmethod
    def from_system(cls, evict: Callable[[int], Any] | None = None, **budget_options: Any) -> MemoryBudget:
        """A budget from the probe: ``budget``, ``margin`` and ``root`` as for ``oomguard.probe()``."""
        from oomguard.policy.budget import probe

        report = probe(**budget_options)
        total = report["budget"]["bytes"]
        if total is None:
            raise BudgetUnknownError("MemoryBudget.from_system", "pass budget=SIZE")
        return cls(total, evict=evict)

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
        return f"<MemoryBudget used={self._used} of {self.total} bytes, {len(self._waiters)} waiting>"

    def _check(self, nbytes: int) -> None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
        if nbytes > self.total:
            raise ReservationTooLarge(f"a request of {nbytes} bytes can never fit in a budget of {self.total} bytes")

    def _take_locked(self, nbytes: int) -> bool:
        if not self._waiters and self._used + nbytes <= self.total:
            self._used += nbytes
            return True
        return False

    def try_reserve(self, nbytes: int) -> Reservation | None:
        """A reservation if *nbytes* fit now and nobody is waiting; else None. Never waits."""
        self._check(nbytes)
        with self._lock:
            if not self._take_locked(nbytes):
                return None
        return Reservation(self, nbytes)

    def _shortfall(self, nbytes: int) -> int:
        return self._used + nbytes - self.total

    def reserve(self, nbytes: int, timeout: float | None = None) -> Reservation:
        """Wait until *nbytes* fit (first come, first served); TimeoutError after *timeout* seconds."""
        self._check(nbytes)
        with self._lock:
            if self._take_locked(nbytes):
                return Reservation(self, nbytes)
            short = self._shortfall(nbytes)
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

        self._check(nbytes)
        with self._lock:
            if self._take_locked(nbytes):
                return Reservation(self, nbytes)
            short = self._shortfall(nbytes)
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
        waiters = self._waiters
        while waiters and self._used + waiters[0].nbytes <= self.total:
            w = waiters.popleft()
            self._used += w.nbytes
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
            if self._waiters:
                self._grant_locked()
