"""Group commit: one writer thread; the writes that queue up while a commit runs share the next one.

Each caller returns only after the transaction holding its write is committed, so a 2xx always
means durable; under load many writes share one fsync. If a batch fails, its writes are retried
one transaction each, so one bad write never sinks the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine


class _Job:
    """One write waiting for its commit; a coroutine awaits ``future``."""

    __slots__ = ("error", "fn", "future", "loop", "result")

    def __init__(self, fn: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.fn = fn  # a callable(conn), or a payload for the committer's bulk writer
        self.loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.result: Any = None
        self.error: BaseException | None = None

    def finish(self) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody waits
            self.loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        if self.future.done():
            return
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.result)


class GroupCommitter:
    """The one writer thread. A job is ``fn(connection)``, or a payload that *bulk* writes with the
    other payloads of its batch in one go (``bulk(connection, payloads) -> results``)."""

    def __init__(
        self,
        engine: Engine,
        max_batch: int = 500,
        on_rollback: Callable[[], None] = lambda: None,
        bulk: Callable[[Connection, list[Any]], list[Any]] | None = None,
    ) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.on_rollback = on_rollback
        self.bulk = bulk
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="oomguard-writer", daemon=True)
        self._thread.start()

    async def submit_async(self, fn: Any) -> Any:
        """Run *fn* (``fn(connection)``, or a bulk payload) in the next commit; its result once
        committed. No thread waits while the commit runs."""
        job = _Job(fn, asyncio.get_running_loop())
        self._queue.put(job)
        return await job.future

    def _loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._run(batch)

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
                try:
                    with self.engine.begin() as conn:
                        job.result = self._apply(conn, [job])[0]
                except Exception as exc:
                    job.error = exc
        for job in batch:
            job.finish()
