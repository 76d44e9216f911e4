"""MemoryBudget: semantics, fairness, timeouts, partial release, threads and asyncio together;
the bounded backfill (``backfill=K``: a later request that fits starts past a waiting one that
does not, each waiting request overtaken at most K times; K=0 is first come, first served), with
threads, with asyncio, and as a property over random sequences."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomguard import MemoryBudget, Reservation, ReservationTooLarge
from tests.helpers.fuzz import examples
from tests.helpers.wait import wait_until


def test_reserve_release_accounting() -> None:
    b = MemoryBudget(100)
    r = b.reserve(60)
    assert (b.used, b.available, b.waiting) == (60, 40, 0)
    r.release(20)  # partial
    assert (r.held, b.used) == (40, 40)
    r.release()
    r.release()  # releasing all twice is harmless
    assert b.used == 0 and r.held == 0
    with pytest.raises(ValueError, match="cannot release 1 bytes"):
        r.release(1)
    with b.reserve(100) as r2:
        assert isinstance(r2, Reservation) and b.available == 0
    assert b.used == 0


def test_too_large_fails_at_once() -> None:
    b = MemoryBudget(100)
    # At once: a request that waited would end in TimeoutError at the timeout, not in this error.
    with pytest.raises(ReservationTooLarge, match="can never fit"):
        b.reserve(101, timeout=60)
    with pytest.raises(ValueError):
        b.try_reserve(101)
    with pytest.raises(ReservationTooLarge):
        asyncio.run(b.areserve(101, timeout=60))
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError):
            b.reserve(bad)  # type: ignore[arg-type]


def test_timeout() -> None:
    b = MemoryBudget(100)
    held = b.reserve(80)
    t = time.monotonic()
    with pytest.raises(TimeoutError):
        b.reserve(30, timeout=0.05)
    assert 0.04 < time.monotonic() - t < 60  # it waited for its timeout (the upper bound only bounds a hang)
    assert b.waiting == 0 and b.used == 80  # the abandoned request left nothing behind
    with pytest.raises(TimeoutError):
        asyncio.run(b.areserve(30, timeout=0.05))
    assert b.waiting == 0 and b.used == 80
    held.release()
    assert b.reserve(30, timeout=0).held == 30


def test_try_reserve_never_jumps_the_queue() -> None:
    b = MemoryBudget(100)
    held = b.reserve(90)
    got: list[Reservation] = []
    t = threading.Thread(target=lambda: got.append(b.reserve(50)))
    t.start()
    wait_until(lambda: b.waiting == 1)
    assert b.try_reserve(5) is None  # 5 bytes fit, but a request is waiting
    held.release()
    t.join(5)
    assert got and got[0].held == 50 and b.used == 50


def test_first_come_first_served() -> None:
    """A large waiting request is not starved by a stream of small ones."""
    b = MemoryBudget(100)
    small_holders = [b.reserve(10) for _ in range(10)]  # full
    big_done = threading.Event()

    def big() -> None:
        with b.reserve(100):
            big_done.set()

    threading.Thread(target=big).start()
    wait_until(lambda: b.waiting == 1)
    late: list[Reservation] = []
    t_small = threading.Thread(target=lambda: late.append(b.reserve(10)))
    t_small.start()
    wait_until(lambda: b.waiting == 2)
    # Releasing small pieces one by one must not let the later small request in first.
    for r in small_holders:
        r.release()
        assert not late, "a later small request overtook the waiting large one"
    assert big_done.wait(5)
    t_small.join(5)
    assert late and b.used == 10


def test_abandoned_head_unblocks_the_rest() -> None:
    b = MemoryBudget(100)
    held = b.reserve(60)
    got: list[Reservation] = []
    timed_out: list[bool] = []

    def head_request() -> None:
        try:
            b.reserve(100, timeout=0.1)
        except TimeoutError:
            timed_out.append(True)

    head = threading.Thread(target=head_request)
    head.start()
    wait_until(lambda: b.waiting == 1)
    tail = threading.Thread(target=lambda: got.append(b.reserve(30)))
    tail.start()
    wait_until(lambda: b.waiting == 2)
    head.join(5)
    tail.join(5)
    assert timed_out == [True]
    assert got and got[0].held == 30  # 60 + 30 fit once the 100-byte head gave up
    held.release()


def test_evict_is_called_without_the_lock_and_can_make_room() -> None:
    b: MemoryBudget
    cache: list[Reservation] = []
    asked: list[int] = []

    def evict(shortfall: int) -> None:
        asked.append(shortfall)
        assert b.try_reserve(0) is not None  # the lock is not held here (else this would deadlock)
        while cache and b.available < shortfall:
            cache.pop().release()

    b = MemoryBudget(100, evict=evict)
    cache.extend(b.reserve(25) for _ in range(4))
    r = b.reserve(50, timeout=1)
    assert asked == [50] and r.held == 50 and b.used <= 100


def test_async_evict_may_be_a_coroutine() -> None:
    async def main() -> int:
        cache: list[Reservation] = []
        calls: list[int] = []

        async def evict(shortfall: int) -> None:
            calls.append(shortfall)
            cache.pop().release()

        b = MemoryBudget(10, evict=evict)
        cache.append(b.reserve(10))
        r = await b.areserve(4, timeout=1)
        return r.held + len(calls)

    assert asyncio.run(main()) == 5


def test_async_cancel_returns_a_grant() -> None:
    async def main() -> MemoryBudget:
        b = MemoryBudget(10)
        held = b.reserve(10)
        task = asyncio.ensure_future(b.areserve(5))
        # Waited for in a thread, so that this loop runs the task meanwhile.
        await asyncio.to_thread(wait_until, lambda: b.waiting == 1, what="the task to queue")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        held.release()
        return b

    b = asyncio.run(main())
    assert b.used == 0 and b.waiting == 0


def test_threads_and_asyncio_share_one_queue() -> None:
    b = MemoryBudget(1000)
    peak = [0]
    lock = threading.Lock()

    def note() -> None:
        with lock:
            peak[0] = max(peak[0], b.used)

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(200):
            with b.reserve(rnd.randint(0, 400), timeout=30):
                note()

    async def task(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(200):
            r = await b.areserve(rnd.randint(0, 400), timeout=30)
            note()
            await asyncio.sleep(0)
            r.release(r.held // 2)
            r.release()

    async def tasks() -> None:
        await asyncio.gather(*(task(100 + i) for i in range(8)))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    threads.append(threading.Thread(target=lambda: asyncio.run(tasks())))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a request never finished (lost wake-up)"
    assert 0 < peak[0] <= 1000 and b.used == 0 and b.waiting == 0


def test_stress_random_sizes_never_exceed_the_total() -> None:
    b = MemoryBudget(10_000)
    over = []

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(500):
            n = rnd.choice((1, 10, 100, 1000, 5000, 10_000))
            r = b.reserve(n, timeout=60) if rnd.random() < 0.8 else b.try_reserve(n)
            if r is None:
                continue
            if b.used > b.total:
                over.append(b.used)
            if rnd.random() < 0.3:
                r.release(n // 2)
            r.release()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    assert not over and b.used == 0 and b.waiting == 0


def test_from_system(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.helpers.trees import make_tree

    b = MemoryBudget.from_system(root=str(make_tree(tmp_path)))
    assert b.total == 256 * 1024**2
    assert MemoryBudget.from_system(root=str(make_tree(tmp_path)), budget="100MiB").total == 100 * 1024**2


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_backfill_must_be_a_count(bad: object) -> None:
    with pytest.raises(ValueError, match="backfill"):
        MemoryBudget(100, backfill=bad)  # type: ignore[arg-type]


def test_threads_a_blocked_head_is_overtaken_at_most_k_times() -> None:
    b = MemoryBudget(100, backfill=2)
    held = b.reserve(60)
    head: list[Reservation] = []
    t = threading.Thread(target=lambda: head.append(b.reserve(50)))
    t.start()
    wait_until(lambda: b.waiting == 1)
    first = b.try_reserve(30)  # fits beside the 60: starts past the waiting 50
    second = b.try_reserve(10)
    assert first is not None and second is not None and b.used == 100
    second.release()
    assert b.try_reserve(5) is None  # 5 fit, but the head was overtaken twice: its turn
    late: list[Reservation] = []
    t2 = threading.Thread(target=lambda: late.append(b.reserve(5)))
    t2.start()
    wait_until(lambda: b.waiting == 2)
    assert not late  # waits behind the head like FIFO
    held.release()  # 30 + 50 fit: the head, then the 5 behind it
    t.join(5)
    t2.join(5)
    assert head and late and b.used == 30 + 50 + 5 and b.waiting == 0


def test_asyncio_the_same_order() -> None:
    async def main() -> list[str]:
        b = MemoryBudget(100, backfill=2)
        held = await b.areserve(60)
        order: list[str] = []

        async def want(name: str, n: int) -> None:
            await b.areserve(n)
            order.append(name)

        head = asyncio.ensure_future(want("head", 50))
        await asyncio.sleep(0)
        assert b.waiting == 1
        await want("a", 30)
        r = b.try_reserve(10)
        assert r is not None
        order.append("b")
        r.release()
        late = asyncio.ensure_future(want("late", 5))
        await asyncio.sleep(0)
        assert b.waiting == 2 and order == ["a", "b"]
        held.release()
        await asyncio.gather(head, late)
        return order

    assert asyncio.run(main()) == ["a", "b", "head", "late"]


def test_fifo_is_the_default() -> None:
    b = MemoryBudget(100)
    held = b.reserve(60)
    t = threading.Thread(target=lambda: b.reserve(50))
    t.start()
    wait_until(lambda: b.waiting == 1)
    assert b.try_reserve(1) is None
    held.release()
    t.join(5)


@settings(max_examples=examples(300), deadline=None)
@given(
    k=st.integers(0, 4),
    ops=st.lists(st.one_of(st.integers(1, 100), st.just(-1), st.just(-2)), min_size=1, max_size=40),
)
def test_property_bounded_overtaking_no_lost_grants(k: int, ops: list[int]) -> None:
    """Requests (a size) and releases (-1: the oldest held, -2: the newest) in any order, in one
    event loop: never more than the total held; no request overtaken more than *k* times by later
    ones (K=0: granted in request order); all granted once everything is released."""

    async def main() -> None:
        b = MemoryBudget(100, backfill=k)
        made: list[int] = []  # request ids in the order made
        granted: list[int] = []  # in the order granted
        held: list[Reservation] = []
        tasks = []

        async def want(i: int, n: int) -> None:
            r = await b.areserve(n)
            granted.append(i)
            held.append(r)

        for op in ops:
            if op > 0:
                made.append(len(made))
                tasks.append(asyncio.ensure_future(want(made[-1], op)))
            elif held:
                held.pop(0 if op == -1 else -1).release()
            for _ in range(3):  # let the granted tasks run
                await asyncio.sleep(0)
            assert b.used <= b.total
        while len(granted) < len(made):
            assert held, "requests wait with nothing held: a lost grant"
            held.pop(0).release()
            for _ in range(3):
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        for i in made:
            later_first = sum(1 for j in granted[: granted.index(i)] if j > i)
            assert later_first <= k, (i, granted)
        if k == 0:
            assert granted == made

    asyncio.run(main())
