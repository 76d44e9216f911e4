"""MemoryBudget(watch=...): admission by the working set, with a fake sampler, a fake tree and a real v1 cgroup."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomguard import MemoryBudget, Reservation
from oomguard.policy.admission import MAX_OVERSHOOT
from oomguard.policy.budget import guard_margin
from oomguard.runtime.watch import Watch, read_working_set
from oomguard.sources.root import DirRoot
from tests.conftest import REPO
from tests.helpers.realcgroup import Group, limited_group, writable_parent
from tests.helpers.trees import make_tree
from tests.helpers.wait import wait_until

MiB = 1024 * 1024


class Box:
    """A working set the test sets; the sampler reads it."""

    def __init__(self, value: int | None) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> int | None:
        self.calls += 1
        return self.value


def sampled_again(box: Box, times: int = 3) -> None:
    """Wait until the sampler has read *box* *times* more times: what it decided since is settled."""
    n = box.calls
    wait_until(lambda: box.calls >= n + times, interval=0.002, what=f"{times} more samples of the working set")


def watched(total: int, box: Box, ceiling: int = 1000, margin: int = 100, **kw: object) -> MemoryBudget:
    w = Watch(box, ceiling, margin_bytes=margin, interval=0.01, learn=False)
    return MemoryBudget(total, watch=w, **kw)  # type: ignore[arg-type]


def test_both_rules_must_hold() -> None:
    box = Box(100)
    with watched(1000, box) as b:
        assert b.working_set == 100 and b.watch_warning is None
        r = b.try_reserve(500)  # nothing reserved: 100 + 500 <= 900
        assert r is not None
        # reserved 500 + 400 <= 1000, but max(100, 100 + 500) + 400 > 900
        assert b.try_reserve(400) is None
        assert b.try_reserve(300) is not None  # 600 + 300 <= 900
        r.release()
    with watched(300, Box(0)) as b:
        assert b.try_reserve(200) is not None
        assert b.try_reserve(200) is None  # the working set is low, but the reserved total binds


def test_a_waiter_is_woken_when_usage_falls() -> None:
    box = Box(850)
    with watched(1000, box) as b:
        assert b.try_reserve(100) is None  # 850 + 100 > 900, though nothing is reserved
        got: list[Reservation] = []
        t = threading.Thread(target=lambda: got.append(b.reserve(100, timeout=5)))
        t.start()
        wait_until(lambda: b.waiting == 1, what="the thread to queue")
        sampled_again(box)
        assert not got  # several samples later, still waiting
        box.value = 700
        t.join(5)
        assert got and got[0].held == 100 and b.waiting == 0


def test_timeout_when_usage_stays_high() -> None:
    with watched(1000, Box(890)) as b, pytest.raises(TimeoutError):
        b.reserve(50, timeout=0.05)


def test_fifo_the_head_blocks_those_behind() -> None:
    box = Box(600)
    with watched(1000, box) as b:
        order: list[int] = []
        lock = threading.Lock()

        def req(n: int) -> None:
            r = b.reserve(n, timeout=5)
            with lock:
                order.append(n)
            r.release()

        head = threading.Thread(target=req, args=(400,))  # 600 + 400 > 900: waits
        head.start()
        wait_until(lambda: b.waiting == 1)
        tail = threading.Thread(target=req, args=(100,))  # would fit (700 <= 900), but queues behind
        tail.start()
        wait_until(lambda: b.waiting == 2, what="both threads to queue")
        sampled_again(box)
        assert order == []
        box.value = 450  # the head fits (850 <= 900); the tail then does not (850 + 100) until it ends
        head.join(5)
        tail.join(5)
        assert order == [400, 100]


def test_hook_is_called_once_per_crossing() -> None:
    box = Box(100)
    seen: list[int] = []
    with watched(500, box, on_over_budget=seen.append) as b:
        for value in (600, 700, 650, 400, 300, 800):
            box.value = value
            sampled_again(box, 2)  # a sample taken after the change was observed
        wait_until(lambda: len(seen) == 2, what="two crossings")
        sampled_again(box)
        assert seen == [600, 800]
        assert b.hook_error is None


def test_a_failing_hook_does_not_stop_the_sampler() -> None:
    box = Box(100)

    def hook(ws: int) -> None:
        raise RuntimeError("evictor broke")

    with watched(500, box, on_over_budget=hook) as b:
        box.value = 600
        wait_until(lambda: b.hook_error is not None)
        box.value = 850
        wait_until(lambda: b.working_set == 850)  # still sampling
        assert isinstance(b.hook_error, RuntimeError)


def test_hook_needs_a_watch() -> None:
    with pytest.raises(ValueError, match="needs a watch"):
        MemoryBudget(100, on_over_budget=print)


def test_asyncio_waits_for_the_fall() -> None:
    box = Box(880)

    async def main(b: MemoryBudget) -> int:
        task = asyncio.ensure_future(b.areserve(50, timeout=60))
        # Waited for in a thread, so that this loop runs the task meanwhile.
        await asyncio.to_thread(wait_until, lambda: b.waiting == 1, what="the task to queue")
        await asyncio.to_thread(sampled_again, box)
        assert not task.done() and b.waiting == 1
        box.value = 100
        r = await task
        return r.held

    with watched(1000, box) as b:
        assert asyncio.run(main(b)) == 50


def test_threads_and_tasks_share_the_watched_queue() -> None:
    box = Box(850)

    async def task(b: MemoryBudget, out: list[str]) -> None:
        await b.areserve(200, timeout=5)
        out.append("task")

    with watched(1000, box) as b:
        out: list[str] = []

        def thread() -> None:
            b.reserve(300, timeout=5)
            out.append("thread")

        t = threading.Thread(target=thread)
        t.start()
        wait_until(lambda: b.waiting == 1)
        at = threading.Thread(target=lambda: asyncio.run(task(b, out)))
        at.start()
        wait_until(lambda: b.waiting == 2)
        box.value = 450  # the thread's 300 fits (750); the task's 200 then does not (750 + 200)
        t.join(5)
        assert out == ["thread"] and b.waiting == 1
        box.value = 100  # max(100, 100 + 300) + 200 <= 900
        at.join(5)
        assert out == ["thread", "task"] and b.used == 500


@pytest.mark.parametrize("sampler", [Box(None), lambda: 1 // 0])
def test_unknown_working_set_falls_back_to_the_static_rule(sampler: object) -> None:
    w = Watch(sampler, 1000, margin_bytes=100, interval=0.01)  # type: ignore[arg-type]
    with MemoryBudget(1000, watch=w) as b:
        assert b.watch_warning == "sampler gave no value: admitting by reserved bytes only"
        assert b.working_set is None
        assert b.reserve(1000, timeout=1).held == 1000  # never blocks on what it cannot see


def test_unreadable_later_releases_waiters() -> None:
    box = Box(890)
    with watched(1000, box) as b:
        got: list[Reservation] = []
        t = threading.Thread(target=lambda: got.append(b.reserve(100, timeout=5)))
        t.start()
        wait_until(lambda: b.waiting == 1)
        box.value = None  # the file went away: static rule, the waiter gets in
        t.join(5)
        assert got and b.watch_warning is not None


def test_close_stops_the_thread_and_falls_back() -> None:
    box = Box(890)
    b = watched(1000, box)
    got: list[Reservation] = []
    t = threading.Thread(target=lambda: got.append(b.reserve(100, timeout=5)))
    t.start()
    wait_until(lambda: b.waiting == 1)
    assert b._sampler is not None
    thread = b._sampler.thread
    assert thread.is_alive()
    b.close()
    assert not thread.is_alive()
    t.join(5)
    assert got  # re-evaluated by the static rule at close
    assert b.working_set is None  # the sampler thread is gone (above): nothing samples any more
    b.close()  # twice is harmless


def test_garbage_collection_stops_the_thread() -> None:
    b = watched(1000, Box(0))
    assert b._sampler is not None
    thread = b._sampler.thread
    assert thread.is_alive()
    del b
    gc.collect()
    thread.join(2)
    assert not thread.is_alive()


def test_overshoot_is_learned_and_capped() -> None:
    box = Box(100)
    w = Watch(box, 2000, margin_bytes=0, interval=0.01, warmup_bytes=0)
    with MemoryBudget(2000, watch=w) as b:
        r = b.reserve(400)  # 400 * 16 >= 2000: large enough to learn from
        box.value = 100 + 500  # the job uses 25% more than it declared
        wait_until(lambda: b.overshoot == 1.25)
        # max(600, 100 + 1.25 * 400) + 1.25 * 1000 = 1850 <= 2000
        assert b.try_reserve(1000) is not None
        # max(600, 100 + 1.25 * 1400) + 1.25 * 200 = 2100 > 2000, though 1600 + 200 reserved fits
        assert b.try_reserve(200) is None
        box.value = 100 + 4000
        wait_until(lambda: b.overshoot == MAX_OVERSHOOT)
        r.release()


def test_a_one_sample_spike_teaches_nothing() -> None:
    """A release sampled before its memory is freed: one sample, not two in a row."""
    from oomguard.policy.admission import Admission

    adm = Admission(Watch(Box(0), 1600, margin_bytes=0, learn=True, warmup_bytes=0))
    adm.observe(100, 0, 10_000)  # the baseline
    for ws, reserved in ((500, 400), (1300, 400), (500, 400), (580, 400), (580, 400)):
        adm.observe(ws, reserved, 10_000)
    assert adm.k == 1.2  # (580 - 100) / 400 twice in a row; the 3.0 spike was alone


def test_small_reservations_teach_nothing() -> None:
    box = Box(100)
    w = Watch(box, 1600, margin_bytes=0, interval=0.01, warmup_bytes=0)
    with MemoryBudget(1600, watch=w) as b:
        b.reserve(99)  # 99 * 16 < 1600
        box.value = 400
        wait_until(lambda: b.working_set == 400)
        assert b.overshoot == 1.0


def test_warm_up_assumes_the_largest_overshoot_until_a_ceiling_was_released() -> None:
    box = Box(0)
    with MemoryBudget(1000, watch=Watch(box, 1000, margin_bytes=0, interval=0.01)) as b:
        assert b.overshoot == MAX_OVERSHOOT
        first = b.reserve(400)
        # max(0, 0 + 1.5 * 400) + 1.5 * 300 = 1050 > 1000: the first jobs may all overshoot
        assert b.try_reserve(300) is None
        assert b.try_reserve(200) is not None  # 600 + 300 = 900
        first.release()
        assert b.overshoot == MAX_OVERSHOOT  # 400 of 1000 released
        for _ in range(3):
            b.reserve(200).release()
        assert b.overshoot == 1.0  # 1000 released: the learned ratio (nothing learned: 1.0)
    w = Watch(box, 1000, margin_bytes=0, interval=0.01, learn=False)
    assert MemoryBudget(10, watch=w).overshoot == 1.0  # no learning, no warm-up


def test_evict_gets_the_watched_shortfall() -> None:
    asked: list[int] = []
    w = Watch(Box(800), 1000, margin_bytes=100, interval=0.01, learn=False)
    with MemoryBudget(1000, evict=asked.append, watch=w) as b, pytest.raises(TimeoutError):
        b.reserve(300, timeout=0.02)
    assert asked == [200]  # 800 + 300 - 900


def test_watch_checks_its_arguments() -> None:
    for kw in ({"interval": 0}, {"overshoot": 0.9}, {"overshoot": 2.5}, {"margin_bytes": -1}):
        with pytest.raises(ValueError):
            Watch(Box(0), 100, **kw)
    assert Watch(Box(0), 100 * 1024 * MiB).margin == 2 * 1024 * MiB  # 2% of 100 GiB
    assert guard_margin(1024 * MiB) == 64 * MiB and guard_margin(10 * MiB) is None


def test_a_margin_that_leaves_no_room_admits_by_reserved_bytes_and_says_so() -> None:
    """Below the guard margin's floor the watch stands aside, as run --guard does (docs/guard.md)."""
    for w in (Watch(Box(0), 10 * MiB), Watch(Box(0), 100 * MiB, margin_bytes=100 * MiB)):
        assert w.margin is None and "leaves no room under the" in (w.unknown_reason or "")
        with MemoryBudget(8 * MiB, watch=w) as b:
            r = b.try_reserve(8 * MiB)  # the static rule alone: it fits the budget
            assert r is not None and r.held == 8 * MiB
            assert b.watch_warning is not None and "leaves no room under the" in b.watch_warning


# --- a Root over a fake tree whose files the test rewrites ------------------------------------


def test_from_system_watches_the_tree(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)  # cgroup v2, memory.max 512 MiB
    cur = tree / "sys/fs/cgroup/memory.current"
    cur.write_text(str(300 * MiB))
    (tree / "sys/fs/cgroup/memory.stat").write_text(f"anon {250 * MiB}\ninactive_file {50 * MiB}\n")
    root = DirRoot(str(tree))
    with MemoryBudget.from_system(root=root, budget="500MiB", watch=True, guard_margin="2%", interval=0.01) as b:
        assert b.watch is not None and b.watch.ceiling == 512 * MiB
        assert b.watch.margin == int(512 * MiB * 0.02)
        assert b.working_set == 250 * MiB
        assert b.try_reserve(260 * MiB) is None  # 250 + 260 MiB > 512 MiB - 10.24 MiB
        cur.write_text(str(100 * MiB))
        r = b.reserve(260 * MiB, timeout=5)
        assert r.held == 260 * MiB and b.working_set == 50 * MiB


def test_the_level_whose_limit_binds_is_watched() -> None:
    """Slurm v1: the 8 GiB limit is on the job, whose usage counts a sibling step's 6.5 GiB."""
    from tests.conftest import FIXTURES

    GiB = 1024 * MiB
    root = DirRoot(str(FIXTURES / "slurm_v1_job_limit_sibling_step_uses_most" / "root"))
    with MemoryBudget.from_system(root=root, budget="6GiB", watch=True, gpu=False) as b:
        assert b.watch is not None and b.watch.source.endswith("/job_9031 (cgroup v1)")
        assert b.watch.ceiling == 8 * GiB and b.watch.margin == int(8 * GiB * 0.02)
        assert b.working_set == 7 * GiB  # 7.5 GiB usage - 512 MiB total_inactive_file
        assert b.try_reserve(1 * GiB) is None  # fits the 6 GiB budget, not the job's group
        assert b.try_reserve(512 * MiB) is not None


def test_from_system_default_margin_and_unknown_usage(tmp_path: Path) -> None:
    root = DirRoot(str(make_tree(tmp_path)))  # no memory.current in the tree
    with MemoryBudget.from_system(root=root, watch=True) as b:
        assert b.watch is not None and b.watch.margin == 64 * MiB
        assert b.watch_warning == ("the working set of /sys/fs/cgroup cannot be read: admitting by reserved bytes only")
        assert b.reserve(b.total, timeout=1).held == b.total


def test_no_watch_by_default(tmp_path: Path) -> None:
    b = MemoryBudget.from_system(root=str(make_tree(tmp_path)))
    assert b.watch is None and b.working_set is None and b.overshoot is None and b._sampler is None


def test_read_working_set_v1_and_v2(tmp_path: Path) -> None:
    g = tmp_path / "g"
    g.mkdir()
    root = DirRoot(str(tmp_path))
    (g / "memory.usage_in_bytes").write_text("1000\n")
    (g / "memory.stat").write_text("inactive_file 50\ntotal_inactive_file 300\n")
    assert read_working_set(root, "/g", 1) == 700  # the hierarchical total_ counter
    (g / "memory.current").write_text("1000\n")
    (g / "memory.stat").write_text("anon 900\ninactive_file 100\n")
    assert read_working_set(root, "/g", 2) == 900
    (g / "memory.stat").unlink()
    assert read_working_set(root, "/g", 2) == 1000
    assert read_working_set(root, "/missing", 2) is None


@given(st.text(max_size=200), st.text(max_size=200), st.sampled_from([1, 2]))
def test_read_working_set_never_raises(usage: str, stat: str, version: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        name = "memory.current" if version == 2 else "memory.usage_in_bytes"
        Path(d, name).write_text(usage, errors="surrogateescape")
        Path(d, "memory.stat").write_text(stat, errors="surrogateescape")
        ws = read_working_set(DirRoot(d), "/", version)
        assert ws is None or ws >= 0


# --- a real v1/v2 cgroup ----------------------------------------------------------------------

VERSION, PARENT = writable_parent()

CHILD = r"""
import json
from oomguard import MemoryBudget
from tests.helpers.wait import wait_until
MiB = 1 << 20
out = {}
with MemoryBudget.from_system(budget="200MiB", watch=True, guard_margin="16MiB", interval=0.02, gpu=False) as b:
    out["ceiling"] = b.watch.ceiling
    out["warning"] = b.watch_warning
    out["static_would"] = b.used + 100 * MiB <= b.total
    blob = b"\x01" * (150 * MiB)  # real memory outside any reservation
    out["ws_held"] = wait_until(lambda: (b.working_set or 0) >= 150 * MiB and b.working_set, what="the blob sampled")
    out["refused"] = b.try_reserve(100 * MiB) is None
    del blob
    r = b.reserve(100 * MiB, timeout=60)  # granted once the blob was freed (a hang would end here)
    out["ws_after"] = b.working_set
    held = b"\x01" * (90 * MiB)  # the reservation, used
    out["granted"] = r.held
print(json.dumps(out))
"""


@pytest.fixture
def group() -> Iterator[Group]:
    with limited_group() as g:
        yield g


def test_real_cgroup_admits_by_what_the_kernel_sees(group: Group) -> None:
    group.set_limit(256 * MiB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")}
    env["PYTHONPATH"] = os.pathsep.join((str(REPO / "src"), str(REPO)))  # the child waits with tests.helpers.wait
    proc = group.run(sys.executable, "-c", CHILD, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ceiling"] == 256 * MiB and out["warning"] is None
    assert out["static_would"]  # the reserved total alone would have admitted it
    assert 150 * MiB <= out["ws_held"] < 230 * MiB  # the interpreter plus the 150 MiB blob
    assert out["refused"]  # ws + 100 MiB > 256 - 16 MiB
    assert out["ws_after"] < 100 * MiB  # granted once the blob was freed
    assert out["granted"] == 100 * MiB
