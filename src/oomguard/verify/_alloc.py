"""Child process of ``oomguard verify``: allocate and touch its shares, report, hold until told.

Protocol: ``python -m oomguard.verify._alloc SHARES...`` (started by ``launch.start_child``), each
argument a run of equal shares, ``COUNTxBYTES`` (``3x1073741824``: three jobs of 1 GiB), or
``BYTES`` alone for one share; ``verify/shares.py`` decides them, so a plan of 32,768 jobs is a
few children, not 32,768. The child raises its own oom_score_adj to 1000 (proc(5): the OOM
killer then picks it first, not the caller), maps the sum N of its shares as one anonymous
mapping and writes every page, printing ``{"progress": BYTES, "seconds": S}`` every
``PROGRESS_EVERY`` seconds meanwhile (what ``verify`` shows, ``verify/progress.py``); then it
prints the final JSON line ``{"touched": N, "shares": K, "seconds": S}`` (K: how many shares
those N bytes held), holds the memory until its stdin closes and exits 0.

When the mapping or a write fails it prints ``{"error": "..."}`` and exits ``EXIT_ALLOC_FAILED``.
That status is the child's, read only by ``verify/runner.py`` (the child's ``outcome`` becomes
"allocation-failed"); it never becomes oomguard's own exit status, whose table is in errors.py
(``oomguard verify`` exits 4, ``EXIT_VERIFY_FAILED``, when a child failed). Its value, 71, is
sysexits.h's EX_OSERR ("an operating system error", here mmap or a page fault refused), apart
from every code in that table so a child's status cannot be mistaken for one of them.
"""

from __future__ import annotations

import json
import mmap
import sys
import time

CHUNK = 16 * 1024 * 1024
EXIT_ALLOC_FAILED = 71  # EX_OSERR; the child protocol's, see above
PROGRESS_EVERY = 0.5  # seconds between two progress lines


def _touch(m: mmap.mmap, n: int, start: float) -> None:
    """Write every page of *m*, saying how far it got every ``PROGRESS_EVERY`` seconds."""
    buf = b"\xa5" * min(CHUNK, n)
    said = start
    for off in range(0, n, CHUNK):
        end = min(off + CHUNK, n)
        m[off:end] = buf[: end - off]
        now = time.perf_counter()
        if now - said >= PROGRESS_EVERY and end < n:
            print(json.dumps({"progress": end, "seconds": now - start}), flush=True)
            said = now


def parse_runs(argv: list[str]) -> list[tuple[int, int]]:
    """``["2x4096", "512"]`` -> ``[(2, 4096), (1, 512)]``; ValueError for anything else."""
    runs = []
    for arg in argv:
        count, _, size = arg.rpartition("x")
        run = (int(count) if count else 1, int(size))
        if run[0] < 0 or run[1] < 0:
            raise ValueError(f"a negative share: {arg!r}")
        runs.append(run)
    return runs


def main(argv: list[str]) -> int:
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    start = time.perf_counter()
    try:
        runs = parse_runs(argv)
        n, shares = sum(c * b for c, b in runs), sum(c for c, _ in runs)
        m = mmap.mmap(-1, max(n, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        _touch(m, n, start)
    except (OSError, MemoryError, ValueError, OverflowError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return EXIT_ALLOC_FAILED
    print(json.dumps({"touched": n, "shares": shares, "seconds": time.perf_counter() - start}), flush=True)
    sys.stdin.read()  # hold until the parent closes our stdin
    m.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
