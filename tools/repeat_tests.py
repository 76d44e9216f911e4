"""The flake finder: run the real-process tests N times under a CPU hog, print each test's failure rate.

    .venv/bin/python tools/repeat_tests.py                 # 5 runs, a spinner on every CPU
    .venv/bin/python tools/repeat_tests.py -n 3 --hogs 0 -- tests/integration/test_guard.py -k stop
    make test-repeat REPEAT=5                             # the same, from make

A test that passes on a quiet machine and fails beside other load judges the machine's speed
(CONTRIBUTING.md, "Tests wait for events"). So each run starts one busy-looping process per CPU
(``--hogs``, default ``os.cpu_count()``), at the tests' own priority, and runs pytest over the
tests that start real processes: the test modules (outside tests/integration/vm) whose text starts a
subprocess, makes a real cgroup or starts a real manager (``default_targets``), over
``--workers`` pytest-xdist workers as ``make test`` does. Each run's results are read back from
pytest's JUnit XML (test-artifacts/repeat/run-K.xml), and the table printed at the end lists every
test that failed at least once, with its count; the exit status is 1 when any did.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "test-artifacts" / "repeat"
# What makes a test module a real-process one: it starts a program, a thread, a manager or a database
# server, makes a cgroup, or waits for an event (tests/helpers: supervise, miniature, wait).
REAL = re.compile(
    r"subprocess\.|Popen\(|limited_group\(|running_manager\(|ManagerProcess|threading\.|pg_or_skip|"
    r"helpers\.supervise|helpers\.miniature|helpers\.wait|\.run\(sys\.executable"
)
HOG = "while True: pass"


def default_targets() -> list[str]:
    """The test modules outside tests/integration/vm whose text starts real processes (``REAL``), relative paths."""
    found = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        rel = path.relative_to(REPO)
        if "vm" in rel.parts:
            continue
        if REAL.search(path.read_text(encoding="utf-8")):
            found.append(rel.as_posix())
    return found


def failures(xml_path: Path) -> tuple[int, list[str]]:
    """(tests run, the ids of those that failed or errored) from one JUnit XML file."""
    if not xml_path.exists():
        return 0, []
    root = ET.parse(xml_path).getroot()
    run, failed = 0, []
    for case in root.iter("testcase"):
        run += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    return run, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=5, help="how many runs (default 5)")
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy processes (default: one per CPU)")
    parser.add_argument("--workers", default=str(os.cpu_count() or 2), help="pytest-xdist workers (default: CPUs)")
    parser.add_argument("pytest_args", nargs="*", help="test paths and pytest options (default: default_targets())")
    args = parser.parse_args(argv)
    targets = args.pytest_args or default_targets()
    OUT.mkdir(parents=True, exist_ok=True)
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    counts: Counter[str] = Counter()
    ran = []
    try:
        for k in range(1, args.runs + 1):
            xml = OUT / f"run-{k}.xml"
            xml.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-n", args.workers]
            cmd += ["--dist", "loadfile", f"--junitxml={xml}", *targets]
            started = time.monotonic()
            rc = subprocess.run(cmd, cwd=REPO, check=False).returncode
            n, failed = failures(xml)
            ran.append(n)
            counts.update(failed)
            took = time.monotonic() - started
            print(f"== run {k} of {args.runs}: {n} tests, {len(failed)} failed, pytest exit {rc}, {took:.0f} s")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(
        f"\n== {args.runs} runs beside {args.hogs} busy processes: {sum(ran)} test runs, {sum(counts.values())} failed"
    )
    for test, n in counts.most_common():
        print(f"  {n}/{args.runs}  {test}")
    return 1 if counts else 0


if __name__ == "__main__":
    sys.exit(main())
