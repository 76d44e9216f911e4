#!/usr/bin/env python3
"""A mutation pass by hand: change one comparison, run the tests that should notice, say whether they did.

    .venv/bin/python tools/mutate.py --list
    .venv/bin/python tools/mutate.py NAME [NAME ...] [--no-baseline] [--timeout S] [-- PYTEST ARGS]
    .venv/bin/python tools/mutate.py --all

Each mutation in ``MUTATIONS`` is (name, file, original snippet, mutated snippet, tests). For each
one named, the tool

1. copies ``src/`` once into a temporary directory (the snapshot: the baseline and every mutant
   start from the same files, however the working tree changes meanwhile) and refuses to start
   unless the file holds the original snippet exactly once and the mutated one nowhere (a file
   edited since the entry was written, or a mutation left in place);
2. copies the snapshot again and applies the mutation **there**: files under ``src/`` are only
   ever read, so people editing the working tree at the same time are not disturbed, and an
   interrupted pass leaves nothing behind (the copies are removed in ``finally``);
3. runs ``python -m pytest TESTS`` (the entry's tests, or the arguments after ``--``) with
   ``PYTHONPATH`` starting with the copy, and a small plugin that checks, inside that pytest, that
   ``oomguard`` and the mutated module are imported from the copy and that the module's file holds
   the mutated snippet (oomguard is installed editable in .venv; PYTHONPATH comes before that
   ``.pth`` entry, and the plugin proves it each run). A mismatch is an error, never "survived";
4. reports ``KILLED`` (pytest exit 1, with the failing tests), ``SURVIVED`` (exit 0), ``TIMEOUT``
   (counted as killed) or ``ERROR`` (any other exit: collection errors, usage errors, the import
   check). Before the first mutation of a test selection, the same selection runs once on an
   unmutated copy (the baseline): a selection that fails already proves nothing.

Exit status: 0 when every mutation was killed, 1 when one survived, 2 on a refusal, an error or a
failing baseline.

Tests that start ``python -m oomguard`` through ``tests.conftest.run_oomguard`` set their own
``PYTHONPATH`` to the checkout's ``src/``: they run the unmutated code and cannot kill anything
here, so the selections below are in-process tests.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
PLUGIN = "_oomguard_mutate_check"
BOUNDARIES = "tests/policy/test_mutation_boundaries.py"


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository
    original: str
    mutated: str
    tests: tuple[str, ...]
    why: str

    @property
    def module(self) -> str:
        rel = Path(self.file).relative_to("src").with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        return ".".join(parts)


MUTATIONS = (
    # -- the three that survived the suite (issue 19, item 6) --------------------------------------
    Mutation(
        "memcg-v1-hierarchical-flip",
        "src/oomguard/probes/memcg.py",
        "(limit is None or hier_value < limit)",
        "(limit is None or hier_value > limit)",
        (BOUNDARIES, "tests/probes/test_fixtures.py"),
        "v1: hierarchical_memory_limit replaces the walked limit when it is smaller, not larger",
    ),
    Mutation(
        "guard-stop-line",
        "src/oomguard/supervisor/guard_state.py",
        "if ws >= self.stop_line:",
        "if ws > self.stop_line:",
        (BOUNDARIES,),
        "a working set exactly at ceiling - margin stops the worker",
    ),
    Mutation(
        "manager-offline-boundary",
        "src/oomguard/manager/alerts.py",
        "silent > MISSED_INTERVALS * interval",
        "silent >= MISSED_INTERVALS * interval",
        (BOUNDARIES,),
        "a node silent for exactly three intervals is still online",
    ),
    # -- more in probes/ and policy/ ---------------------------------------------------------------
    Mutation(
        "memcg-v1-hierarchical-equal",
        "src/oomguard/probes/memcg.py",
        "(limit is None or hier_value < limit)",
        "(limit is None or hier_value <= limit)",
        (BOUNDARIES, "tests/probes/test_fixtures.py"),
        "an equal hierarchical limit keeps the walk's own file as limit_file",
    ),
    Mutation(
        "memcg-walk-minimum",
        "src/oomguard/probes/memcg.py",
        "(best is None or n < best)",
        "(best is None or n > best)",
        ("tests/probes/test_fixtures.py",),
        "the walk keeps the lowest limit of the levels, not the highest",
    ),
    Mutation(
        "memory-limit-at-host",
        "src/oomguard/probes/memory.py",
        "(host is None or limit < host)",
        "(host is None or limit <= host)",
        ("tests/probes/test_fixtures.py", "tests/probes/test_detection.py", "tests/policy/test_boundaries.py"),
        "a cgroup limit equal to MemTotal does not bind: MemTotal does (limit-above-host-memory)",
    ),
    Mutation(
        "memlock-low-boundary",
        "src/oomguard/probes/memlock.py",
        "values[0] < MEMLOCK_LOW_BYTES",
        "values[0] <= MEMLOCK_LOW_BYTES",
        ("tests/policy/test_boundaries.py",),
        "a memlock soft limit of exactly 64 MiB is not low",
    ),
    Mutation(
        "budget-margin-floor",
        "src/oomguard/policy/budget.py",
        "max(MARGIN_MIN, int(basis * MARGIN_RATIO))",
        "min(MARGIN_MIN, int(basis * MARGIN_RATIO))",
        ("tests/probes/test_fixtures.py",),
        "the default margin is at least 256 MiB",
    ),
    Mutation(
        "budget-exceeds-limit-boundary",
        "src/oomguard/policy/budget.py",
        'value > mem["effective_bytes"]',
        'value >= mem["effective_bytes"]',
        (BOUNDARIES, "tests/probes/test_fixtures.py"),
        "an explicit budget equal to the limit is not above it",
    ),
    Mutation(
        "plan-cpu-epsilon",
        "src/oomguard/policy/plan.py",
        "int(cpus / cpus_per_job + CPU_EPSILON)",
        "int(cpus / cpus_per_job)",
        ("tests/policy/test_boundaries.py",),
        "0.7 CPUs fit 7 jobs of 0.1 (binary rounding: 6.999999999999999)",
    ),
)
BY_NAME = {m.name: m for m in MUTATIONS}

# Loaded into the pytest run (-p): proves the code under test is the copy, as the mutation left it.
PLUGIN_SOURCE = """\
import importlib
import os
from pathlib import Path

import pytest


def pytest_configure(config):
    copy = Path(os.environ["OOMGUARD_MUTATE_SRC"]).resolve()
    import oomguard

    mod = importlib.import_module(os.environ["OOMGUARD_MUTATE_MODULE"])
    seen = []
    for m in (oomguard, mod):
        where = Path(m.__file__).resolve()
        if copy not in where.parents:
            raise pytest.UsageError(f"mutate: {m.__name__} imported from {where}, not from the copy {copy}")
        seen.append(str(where))
    if os.environ["OOMGUARD_MUTATE_EXPECT"] not in Path(mod.__file__).read_text():
        raise pytest.UsageError(f"mutate: {mod.__file__} does not hold the snippet under test")
    Path(os.environ["OOMGUARD_MUTATE_SEEN"]).write_text("\\n".join(seen) + "\\n")
"""


class Refused(Exception):
    """The repository's file is not as the mutation entry expects."""


def check_clean(m: Mutation, src: Path) -> str:
    """*m*'s file under *src* (the snapshot of src/), after checking it holds the original snippet
    once and the mutated one nowhere."""
    path = src / Path(m.file).relative_to("src")
    if not path.is_file():
        raise Refused(f"{m.name}: {m.file} does not exist")
    text = path.read_text()
    n = text.count(m.original)
    if n != 1:
        raise Refused(f"{m.name}: {m.file} holds the original snippet {m.original!r} {n} times, not once")
    if m.mutated not in m.original and m.mutated in text:
        raise Refused(f"{m.name}: {m.file} already holds the mutated snippet {m.mutated!r}: a mutation left in place?")
    return text


@contextmanager
def workspace() -> Iterator[Path]:
    """A temporary directory: ``snapshot/src`` (src/ copied once, so the baseline and every mutant
    start from the same files while others edit the working tree) and ``plugin/`` (the import
    check). Removed on the way out, whatever happens inside."""
    tmp = Path(tempfile.mkdtemp(prefix="oomguard-mutate-"))
    try:
        shutil.copytree(
            SRC, tmp / "snapshot" / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        )
        (tmp / "plugin").mkdir()
        (tmp / "plugin" / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def mutant(tmp: Path, m: Mutation, text: str) -> Iterator[Path]:
    """``tmp/mutant/src``: the snapshot copied again, *m* applied there only; removed afterwards."""
    tree = tmp / "mutant"
    try:
        shutil.copytree(tmp / "snapshot" / "src", tree / "src")
        target = (tree / "src" / Path(m.file).relative_to("src")).resolve()
        assert tmp.resolve() in target.parents, target  # never a file of the working tree
        target.write_text(text.replace(m.original, m.mutated, 1))
        yield tree
    finally:
        shutil.rmtree(tree, ignore_errors=True)


@dataclass
class Outcome:
    status: str  # KILLED, SURVIVED, TIMEOUT, ERROR
    failed: list[str]
    seen: list[str]
    seconds: float
    tail: str


def run_pytest(tree: Path, plugin: Path, module: str, expect: str, *, tests: list[str], timeout: float) -> Outcome:
    """pytest *tests* against ``tree/src`` (the check plugin from *plugin*)."""
    seen_file = tree / "seen.txt"
    seen_file.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(plugin), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OOMGUARD_MUTATE_SRC": str(tree / "src"),
        "OOMGUARD_MUTATE_MODULE": module,
        "OOMGUARD_MUTATE_EXPECT": expect,
        "OOMGUARD_MUTATE_SEEN": str(seen_file),
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-p", PLUGIN, *tests]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Outcome("TIMEOUT", [], [], time.monotonic() - t0, "")
    seconds = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.MULTILINE)
    seen = seen_file.read_text().split() if seen_file.exists() else []
    tail = "\n".join(out.strip().splitlines()[-15:])
    if not seen:
        return Outcome("ERROR", failed, seen, seconds, tail)  # the import check did not pass
    status = {0: "SURVIVED", 1: "KILLED"}.get(proc.returncode, "ERROR")
    return Outcome(status, failed, seen, seconds, tail)


def show(m: Mutation) -> str:
    return f"{m.name}: {m.file}\n    - {m.original}\n    + {m.mutated}\n    ({m.why})"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] | None = None
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description="Apply one mutation at a time to a copy of src/ and run the tests.")
    p.add_argument("names", nargs="*", metavar="NAME", help="mutations to run (--list shows them)")
    p.add_argument("--all", action="store_true", help="every mutation in the table")
    p.add_argument("--list", action="store_true", help="list the mutations and exit")
    p.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of each test selection")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one pytest run may take (default 600)")
    args = p.parse_args(argv)
    if args.list:
        for m in MUTATIONS:
            print(show(m) + f"\n    tests: {' '.join(m.tests)}")
        return 0
    names = [m.name for m in MUTATIONS] if args.all else args.names
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        p.error(f"unknown mutation(s): {', '.join(unknown)}" if unknown else "name a mutation, or --all, or --list")
    chosen = [BY_NAME[n] for n in names]
    with workspace() as tmp:
        return report(run_all(tmp, chosen, extra, args.no_baseline, args.timeout))


def run_all(
    tmp: Path, chosen: list[Mutation], extra: list[str] | None, no_baseline: bool, timeout: float
) -> dict[str, str]:
    """Each mutation's status (or ``REFUSED`` for all, before any run, when a file is not clean)."""
    snapshot = tmp / "snapshot"
    try:
        texts = {m.name: check_clean(m, snapshot / "src") for m in chosen}  # refuse before running anything
    except Refused as why:
        print(f"mutate: refused: {why}", file=sys.stderr)
        return {"": "REFUSED"}
    results: dict[str, str] = {}
    baselines: dict[tuple[str, ...], bool] = {}
    for m in chosen:
        tests = list(extra if extra else m.tests)
        print(show(m) + f"\n    tests: {' '.join(tests)}", flush=True)
        key = tuple(tests)
        if not no_baseline and key not in baselines:
            base = run_pytest(snapshot, tmp / "plugin", m.module, m.original, tests=tests, timeout=timeout)
            baselines[key] = base.status == "SURVIVED"  # unmutated: every test passes
            if not baselines[key]:
                print(f"    baseline {base.status}: the selection does not pass unmutated (src/ mid-edit? run again)")
                print(base.tail)
        if not no_baseline and not baselines[key]:
            results[m.name] = "ERROR"
            continue
        with mutant(tmp, m, texts[m.name]) as tree:
            out = run_pytest(tree, tmp / "plugin", m.module, m.mutated, tests=tests, timeout=timeout)
        results[m.name] = out.status
        print(f"    imported: {', '.join(out.seen) or '(import check failed)'}")
        print(f"    {out.status} in {out.seconds:.1f}s" + (f" by {len(out.failed)} test(s):" if out.failed else ""))
        for name in out.failed:
            print(f"      {name}")
        if out.status == "ERROR":
            print(out.tail)
    return results


def report(results: dict[str, str]) -> int:
    """The summary lines; the exit status."""
    if "REFUSED" in results.values():
        return 2
    counts = {s: sum(1 for v in results.values() if v == s) for s in ("KILLED", "TIMEOUT", "SURVIVED", "ERROR")}
    print("summary: " + ", ".join(f"{n} {s.lower()}" for s, n in counts.items()))
    for name, status in results.items():
        print(f"  {status:8} {name}")
    if counts["ERROR"]:
        return 2
    return 1 if counts["SURVIVED"] else 0


if __name__ == "__main__":
    sys.exit(main())
