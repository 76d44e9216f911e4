#!/usr/bin/env python3
"""A stand-in worker for deploy/worker/Dockerfile: replace it with yours.

Defense in depth: the budget comes from oomguard (``--budget {budget}``, computed before each
start from the real cgroup limits), and the worker keeps a detection of its own as a second
layer: it plans with the smaller of the two. Here that detection is deliberately the naive one
most workers have (fixed cgroup paths, then MemTotal), which is what oomguard exists to correct.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def parse_size(text: str) -> int:
    """``21694MiB``, ``332GiB`` or bytes: the forms ``{budget}`` and ``{budget_bytes}`` take."""
    for unit in sorted(UNITS, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)].isdigit():
            return int(text[: -len(unit)]) * UNITS[unit]
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"not a size: {text!r}")


def own_limit() -> int | None:
    """The worker's own guess: cgroup v2, then v1 (fixed paths), then MemTotal."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            return int(text)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def main() -> int:
    parser = argparse.ArgumentParser(prog="example-worker")
    parser.add_argument("--budget", type=parse_size, help="memory budget from oomguard: {budget}")
    parser.add_argument("--duration", type=float, default=None, help="stop after SECONDS (default: run for ever)")
    args = parser.parse_args()
    sources = {"oomguard --budget": args.budget, "own detection": own_limit()}
    if env := os.environ.get("OOMGUARD_BUDGET_BYTES"):
        sources["OOMGUARD_BUDGET_BYTES"] = int(env)
    known = {k: v for k, v in sources.items() if v is not None}
    if not known:
        print("example-worker: no budget and no limit found", file=sys.stderr)
        return 2
    source, plan = min(known.items(), key=lambda kv: kv[1])
    print(f"example-worker: planning with {plan} bytes (from {source}; {known})", flush=True)
    deadline = None if args.duration is None else time.monotonic() + args.duration
    while deadline is None or time.monotonic() < deadline:
        time.sleep(0.05 if deadline is not None else 60)  # the real work goes here
    return 0


if __name__ == "__main__":
    sys.exit(main())
