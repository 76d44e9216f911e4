"""Start-up and probe cost of ``oomguard check``.

1. Whole-process time of the installed console script ``oomguard check --json`` and of
   ``python -m oomguard check --json`` against ``python -c pass``, interleaved in the same run
   (goal, ../shared/DESIGN.md: the console script <= 1.5x ``python -c 'import argparse, json'``, the
   floor the standard library's own tools set; the command line is argparse, the output json.dumps),
   bytecode compiled first as after an install; also ``python -m`` of an empty module (the cost
   of ``-m`` itself: runpy) and ``python -c 'import argparse, json'`` (the floor those two set).
2. In-process time of ``oomguard.probe()`` (goal: under 2 ms).

Usage: python bench/startup.py [--runs N]   (from the repository root, with the package installed)
"""

from __future__ import annotations

import compileall
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOAL = 1.5  # oomguard check --json (console script) against python -c 'import argparse, json'
SCRIPT = "oomguard check --json (script)"
FLOOR = "python -c 'import argparse, json'"  # what the standard library's tools cost alone


def shown(path: str) -> str:
    """The interpreter's path as printed: relative to the checkout, never this machine's absolute path."""
    p = Path(path).absolute()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else p.name


def wall(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - t


def main() -> None:
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 200
    compileall.compile_dir(str(REPO / "src" / "oomguard"), quiet=1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")}
    py = sys.executable
    empty = tempfile.mkdtemp()
    Path(empty, "oomguard_bench_empty.py").write_text("")
    script = str(Path(py).parent / "oomguard")
    cmds = {
        "python -c pass": ([py, "-c", "pass"], env),
        "python -m <empty module>": ([py, "-m", "oomguard_bench_empty"], {**env, "PYTHONPATH": empty}),
        FLOOR: ([py, "-c", "import argparse, json"], env),
        "python -m oomguard check --json": ([py, "-m", "oomguard", "check", "--json"], env),
        SCRIPT: ([script, "check", "--json"], env),
    }
    if not os.path.exists(script):
        del cmds[SCRIPT]
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for i in range(runs + 10):  # interleaved, so machine noise hits all alike; 10 warm-up rounds
        for name, (cmd, e) in cmds.items():
            t = wall(cmd, e)
            if i >= 10:
                times[name].append(t)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    b = med["python -c pass"]

    import oomguard

    oomguard.probe()
    samples = []
    for _ in range(2000):
        t = time.perf_counter()
        oomguard.probe()
        samples.append(time.perf_counter() - t)
    samples.sort()
    print(f"python {platform.python_version()} ({shown(py)}), {os.cpu_count()} CPUs, {runs} interleaved runs")
    for name, m in med.items():
        print(f"{name:<34} median {m * 1e3:7.2f} ms   ratio to -c pass {m / b:6.3f}")
    mod = med["python -m oomguard check --json"] / med["python -m <empty module>"]
    print(f"{'-m oomguard vs -m <empty module>':<34} ratio {mod:6.3f}   (what oomguard adds to -m)")
    if SCRIPT in med:
        own = med[SCRIPT] / med[FLOOR]
        print(f"{'script vs import argparse, json':<34} ratio {own:6.3f}   (what oomguard adds to argparse + json)")
        print(f"goal: {SCRIPT} <= {GOAL}x {FLOOR}: {own:.3f}x, {'met' if own <= GOAL else 'NOT met'}")
    print(
        f"in-process probe()                median {statistics.median(samples) * 1e3:7.3f} ms, "
        f"p90 {samples[int(len(samples) * 0.9)] * 1e3:.3f} ms   (goal < 2 ms)"
    )


if __name__ == "__main__":
    main()
