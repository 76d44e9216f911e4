"""MemoryBudget: uncontended speed, and scheduling quality against fixed concurrency.

1. Uncontended reserve/release pairs per second in one thread (goal: >= 500k/s).
2. 200 synthetic jobs of mixed sizes and durations under one budget, all submitted at once
   in a fixed order: the makespan when each job holds a MemoryBudget reservation while it
   runs (one thread per job, first come first served), against the ideal lower bound
   max(sum(size x duration) / budget, longest job) and against fixed concurrency
   floor(budget / largest job) (a worker pool taking jobs in the same order).

Usage: python bench/reserve.py [--seed N]
"""

from __future__ import annotations

import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from oomguard import MemoryBudget

GiB = 1024**3


def uncontended(n: int = 500_000) -> float:
    b = MemoryBudget(64 * GiB)
    t = time.perf_counter()
    for _ in range(n):
        b.reserve(GiB).release()
    return n / (time.perf_counter() - t)


def make_jobs(seed: int, n: int = 200) -> list[tuple[int, float]]:
    rnd = random.Random(seed)
    sizes = [1, 2, 4, 8, 14, 24]  # GiB
    return [(rnd.choice(sizes) * GiB, rnd.uniform(0.005, 0.05)) for _ in range(n)]


def run_budget(jobs: list[tuple[int, float]], budget: int) -> float:
    b = MemoryBudget(budget)
    start = time.perf_counter()

    def job(size: int, duration: float) -> None:
        with b.reserve(size):
            time.sleep(duration)

    threads = []
    for size, duration in jobs:  # submitted in order: each thread queues before the next starts
        t = threading.Thread(target=job, args=(size, duration))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return time.perf_counter() - start


def run_fixed(jobs: list[tuple[int, float]], workers: int) -> float:
    queue = list(reversed(jobs))
    lock = threading.Lock()
    start = time.perf_counter()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                _, duration = queue.pop()
            time.sleep(duration)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def main() -> None:
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    rates = [uncontended() for _ in range(3)]
    print(f"uncontended reserve+release: {statistics.median(rates):,.0f} pairs/s (median of 3 x 500k; goal >= 500k)")
    budget = 64 * GiB
    jobs = make_jobs(seed)
    largest = max(s for s, _ in jobs)
    fixed_workers = budget // largest
    ideal = max(sum(s * d for s, d in jobs) / budget, *(d for _, d in jobs))
    mb = statistics.median(run_budget(jobs, budget) for _ in range(3))
    fx = statistics.median(run_fixed(jobs, fixed_workers) for _ in range(3))
    print(f"200 jobs, sizes 1-24 GiB, 5-50 ms each, budget 64 GiB (seed {seed}; median of 3 runs):")
    print(f"  ideal lower bound                     {ideal:6.3f} s   1.00x")
    print(f"  MemoryBudget (FIFO reservations)      {mb:6.3f} s   {mb / ideal:.2f}x")
    print(f"  fixed concurrency {fixed_workers} (64 / 24 GiB)      {fx:6.3f} s   {fx / ideal:.2f}x")


if __name__ == "__main__":
    main()
