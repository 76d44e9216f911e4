"""Group commit: one writer thread; the writes that queue up while a commit runs share the next one.

Each caller returns only after the transaction holding its write is committed, so a 2xx always
means durable; under load many writes share one fsync. If a batch fails, its writes are retried
one transaction each, so one bad write never sinks the others.

Bounded: the writes held (queued, and in the batch being committed) count their bytes (a
report's JSON, an event's, plus ``JOB_OVERHEAD`` each), and past ``max_bytes`` a write is
refused at once with ``QueueFull`` (a timeout to the routes: 503 with Retry-After), so a hung
database cannot make the queue grow without end. A write whose caller stops waiting (the route's
time-out cancels its await, and the client gets 503) is withdrawn from the queue if the writer
has not taken it yet: it is never committed, and its bytes are released at once. One the writer
had already taken into a transaction may still be committed after its 503; it is also not tried
again alone after a failed batch. The agent retries a 503 with the same ingest id, and each
write is idempotent by that id (``writer``), so such a write is stored once either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import TimeoutError as PoolTimeout

from oomguard.manager.settings import WRITE_QUEUE_BYTES_DEFAULT

DEFAULT_MAX_BYTES = WRITE_QUEUE_BYTES_DEFAULT  # the writes held at once, in bytes (``--write-queue-bytes``)
JOB_OVERHEAD = 1024  # bytes counted for every write beyond its payload: its objects, its rows
_QUEUED, _TAKEN, _WITHDRAWN = "queued", "taken", "withdrawn"


class QueueFull(PoolTimeout):
    """The writer holds ``max_bytes`` of writes already: this one is refused (503, Retry-After).
    A pool timeout's kind (``store.health.classify``: ``timeout``), as a full pool is too."""

    code = None  # no "Background on this error" link in the one line


class _Job:
    """One write waiting for its commit; a coroutine awaits ``future``. ``state`` and ``fn`` change
    under the committer's lock only."""

    __slots__ = ("abandoned", "error", "fn", "future", "loop", "result", "size", "state")

    def __init__(self, fn: Any, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.fn = fn  # a callable(conn), or a payload for the committer's bulk writer
        self.loop = loop
        self.size = size
        self.state = _QUEUED
        self.abandoned = False  # its caller stopped waiting
        self.future: asyncio.Future[Any] = loop.create_future()
        self.result: Any = None
        self.error: BaseException | None = None

    def finish(self) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody waits
            self.loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        if self.future.done():  # cancelled: its caller got a 503
            return
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.result)


class GroupCommitter:
    """The one writer thread. A job is ``fn(connection)``, or a payload that *bulk* writes with the
    other payloads of its batch in one go (``bulk(connection, payloads) -> results``). At most
    *max_bytes* of jobs are held at once (``QueueFull`` beyond; a lone job always fits)."""

    def __init__(
        self,
        engine: Engine,
        max_batch: int = 500,
        on_rollback: Callable[[], None] = lambda: None,
        bulk: Callable[[Connection, list[Any]], list[Any]] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.on_rollback = on_rollback
        self.bulk = bulk
        self.max_bytes = max_bytes
        self.held_bytes = 0  # of the jobs queued and in the running batch
        self.withdrawn = 0  # jobs withdrawn before the writer took them (never committed)
        self.refused = 0  # jobs refused with QueueFull
        self._jobs: deque[_Job] = deque()
        self._stale = 0  # withdrawn jobs still in ``_jobs`` (skipped when met; compacted now and then)
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="oomguard-writer", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        """How many jobs wait for the writer (withdrawn ones not counted)."""
        with self._cond:
            return len(self._jobs) - self._stale

    async def submit_async(self, fn: Any, size: int = 0) -> Any:
        """Run *fn* (``fn(connection)``, or a bulk payload; *size*: its payload's bytes) in the next
        commit; its result once committed. No thread waits while the commit runs. ``QueueFull``
        at once when the held jobs would pass ``max_bytes``; withdrawn when the await is cancelled
        before the writer took it."""
        job = _Job(fn, asyncio.get_running_loop(), JOB_OVERHEAD + max(0, size))
        with self._cond:
            if self.held_bytes and self.held_bytes + job.size > self.max_bytes:
                self.refused += 1
                raise QueueFull(
                    f"the writer holds {self.held_bytes} bytes of writes, its cap {self.max_bytes} "
                    "(--write-queue-bytes): the database is not keeping up"
                )
            self.held_bytes += job.size
            self._jobs.append(job)
            self._cond.notify()
        try:
            return await job.future
        except asyncio.CancelledError:
            self._withdraw(job)
            raise

    def _withdraw(self, job: _Job) -> None:
        with self._cond:
            job.abandoned = True
            if job.state != _QUEUED:
                return  # taken into a transaction already: it may still commit (stored once, by its id)
            job.state, job.fn = _WITHDRAWN, None  # the payload is freed now, not when the writer meets it
            self.held_bytes -= job.size
            self.withdrawn += 1
            self._stale += 1
            if self._stale > 1000 and 2 * self._stale > len(self._jobs):
                self._jobs = deque(j for j in self._jobs if j.state == _QUEUED)
                self._stale = 0

    def _take(self) -> list[_Job]:
        """The next batch: up to ``max_batch`` queued jobs, in order, marked taken; waits for one."""
        with self._cond:
            while True:
                batch: list[_Job] = []
                while self._jobs and len(batch) < self.max_batch:
                    job = self._jobs.popleft()
                    if job.state == _WITHDRAWN:
                        self._stale -= 1
                        continue
                    job.state = _TAKEN
                    batch.append(job)
                if batch:
                    return batch
                self._cond.wait()

    def _loop(self) -> None:
        while True:
            batch = self._take()
            try:
                self._run(batch)
            finally:
                # The bytes are released before any caller hears back: a client that writes again
                # as soon as it has its answer must find them gone (with a tiny cap, a lone write
                # after another's answer was refused while they were still counted).
                with self._cond:
                    self.held_bytes -= sum(job.size for job in batch)
                    for job in batch:
                        job.fn = None
                for job in batch:
                    job.finish()

    def _apply(self, conn: Connection, batch: list[_Job]) -> list[Any]:
        bulk_jobs = [job for job in batch if not callable(job.fn)]
        results: dict[int, Any] = {}
        if bulk_jobs:
            assert self.bulk is not None
            for job, result in zip(bulk_jobs, self.bulk(conn, [job.fn for job in bulk_jobs]), strict=True):
                results[id(job)] = result
        return [results[id(job)] if id(job) in results else job.fn(conn) for job in batch]

    def _run(self, batch: list[_Job]) -> None:
        try:
            with self.engine.begin() as conn:
                results = self._apply(conn, batch)
            for job, result in zip(batch, results, strict=True):
                job.result = result
        except Exception:  # one bad write: retry each alone, so the others still commit
            self.on_rollback()
            for job in batch:
                if job.abandoned:  # its caller got a 503 and will retry: not written behind its back
                    continue
                try:
                    with self.engine.begin() as conn:
                        job.result = self._apply(conn, [job])[0]
                except Exception as exc:
                    job.error = exc
