"""How fast `oomguard run --guard` acts (issue 24, item 2): from the working set crossing the stop
line to the worker's SIGTERM, over many trials, in a real limited cgroup.

Creates a child of this process's memory cgroup (v1 or v2) limited to --limit (default 384 MiB),
as tests/helpers/realcgroup.py does, and removes it at the end. Each trial starts a fresh
``oomguard run --guard --guard-margin MARGIN --restart never --stop-timeout 2s`` inside it, whose
worker (this script, ``--worker``):

1. with ``cache`` present, reads a 64 MiB file, so the group holds page cache (charged to it;
   the working set leaves its inactive part out, the usage does not);
2. fills anonymous or shmem pages (a memfd: the stand-in for CUDA-pinned host memory, which the
   memory cgroup charges as shmem) quickly to 60 % of the stop line;
3. then grows at the trial's rate (0.25-4 GiB/s), 1 MiB at a time, reading its group's working
   set (``memory.usage_in_bytes`` or ``memory.current``, less ``inactive_file``: the guard's
   formula, its own reads) after every MiB: the first reading at or past the stop line is the
   crossing;
4. takes SIGTERM in a handler that notes the time; the latency is that time less the crossing's
   (``time.monotonic``, one clock for every process of the machine).

The stop line is the group's limit less the margin, as the guard computes it for a group whose
own limit binds. A trial whose worker never saw SIGTERM (the kernel OOM-killed it, or the guard
did not act) counts as such; the group's OOM kills (``memory.oom_control`` or ``memory.events``)
are read before and after every trial.

The guard's CPU: ``run --guard -- sleep S`` in the same group, the supervisor's CPU time (its
rusage, the child's excluded: ``sleep`` uses none) over S, at its normal rate (the group nearly
empty) and near the ceiling (a resident filler within four margins of the line, where it samples
every 20 ms), each against ``run`` without ``--guard``.

Usage: python bench/guard_latency.py [--trials 1000] [--limit 384MiB] [--margin 16MiB]
       [--seconds 10] [--seed 1]   (root)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

MiB = 1 << 20
GiB = 1 << 30
RATES = (0.25, 0.5, 1.0, 2.0, 4.0)  # GiB/s
KINDS = ("anon", "shmem")
CACHE = (False, True)
CACHE_BYTES = 64 * MiB
APPROACH = 0.6  # of the stop line, filled fast before the measured ramp


# --- the worker, inside the group ---------------------------------------------------------------


def own_group() -> tuple[str, int]:
    """This process's memory cgroup directory and the hierarchy's version (``tests.helpers.realcgroup``)."""
    from tests.helpers.realcgroup import own_memory_cgroup

    version, where = own_memory_cgroup()
    if version is None:
        raise SystemExit(f"no memory cgroup: {where}")
    return str(where), version


def worker(opts: argparse.Namespace) -> int:
    from oomguard.probes.counters import read_working_set
    from oomguard.sources.root import LiveRoot

    got: dict[str, float] = {}
    signal.signal(signal.SIGTERM, lambda *_: got.setdefault("signal", time.monotonic()))
    root, (group, version) = LiveRoot(), own_group()
    if opts.cache:
        with open(opts.cache, "rb") as f:
            while f.read(4 * MiB):
                pass
    held: list[bytes] = []
    fd = os.memfd_create("pinned-stand-in") if opts.kind == "shmem" else -1

    def grow() -> None:
        if fd < 0:
            held.append(b"\x01" * MiB)  # a new object, every page written
        else:
            os.write(fd, b"\x01" * MiB)  # shmem pages, charged to the group

    def ws() -> int:
        return read_working_set(root, group, version) or 0

    while ws() < APPROACH * opts.line:
        grow()
    start, grown = time.monotonic(), 0
    per_mib = MiB / (opts.rate * GiB)
    crossed, at = None, None
    deadline = start + 30
    while "signal" not in got and time.monotonic() < deadline:
        grow()
        grown += 1
        now_ws = ws()
        if crossed is None and now_ws >= opts.line:
            crossed, at = time.monotonic(), now_ws
        delay = start + grown * per_mib - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    result = {"crossed": crossed, "signal": got.get("signal"), "ws_at_cross": at, "grown_mib": grown}
    Path(opts.result).write_text(json.dumps(result))
    return 0


def filler(opts: argparse.Namespace) -> int:
    """Hold the group's working set at --line or a little above it (growing, never shrinking)
    for --seconds: the near-ceiling state of the CPU measurement."""
    from oomguard.probes.counters import read_working_set
    from oomguard.sources.root import LiveRoot

    root, (group, version) = LiveRoot(), own_group()
    held, end = [], time.monotonic() + opts.seconds
    while time.monotonic() < end:
        while (read_working_set(root, group, version) or 0) < opts.line:
            held.append(b"\x01" * MiB)
        time.sleep(0.05)
    return 0


# --- the outer bench ----------------------------------------------------------------------------


def trial(group: Any, opts: argparse.Namespace, rate: float, kind: str, cache: str | None) -> dict[str, Any]:
    line = opts.limit - opts.margin
    with tempfile.TemporaryDirectory() as d:
        result = Path(d, "result.json")
        work = [sys.executable, str(Path(__file__).resolve()), "--worker", "--rate", str(rate), "--kind", kind]
        work += ["--line", str(line), "--result", str(result)] + (["--cache", cache] if cache else [])
        run = [sys.executable, "-m", "oomguard", "run", "--guard", "--guard-margin", str(opts.margin)]
        run += ["--restart", "never", "--stop-timeout", "2s", "--events", str(Path(d, "events.jsonl")), "--", *work]
        env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")}
        env["PYTHONPATH"] = str(REPO / "src")
        before = group.oom_kills()
        script = f'echo $$ > "{group.dir / "cgroup.procs"}" && exec "$@"'
        done = subprocess.run(
            ["/bin/sh", "-c", script, "sh", *run], check=False, capture_output=True, text=True, env=env, timeout=90
        )
        out = json.loads(result.read_text()) if result.exists() else {}
        events = Path(d, "events.jsonl")
        reasons = [json.loads(x).get("reason") for x in events.read_text().splitlines()] if events.exists() else []
    latency = None
    if out.get("crossed") is not None and out.get("signal") is not None:
        latency = out["signal"] - out["crossed"]
    return {
        "rate": rate,
        "kind": kind,
        "cache": bool(cache),
        "latency_s": latency,
        "signalled": out.get("signal") is not None,
        "crossed": out.get("crossed") is not None,
        "oom_kills": group.oom_kills() - before,
        "pressure_stop": "pressure-stop" in reasons,
        "rc": done.returncode,
        "stderr": done.stderr[-600:],
    }


def cpu_share(group: Any, opts: argparse.Namespace, guard: bool, filler: int) -> float:
    """The supervisor's CPU (user + system) over ``--seconds`` of ``run [--guard] -- sleep``,
    as a share of one core, with *filler* bytes held resident in the group meanwhile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")}
    env["PYTHONPATH"] = str(REPO / "src")
    hold = None
    script = f'echo $$ > "{group.dir / "cgroup.procs"}" && exec "$@"'
    if filler:
        fill = [sys.executable, str(Path(__file__).resolve()), "--fill", "--line", str(filler)]
        hold = subprocess.Popen(["/bin/sh", "-c", script, "sh", *fill, "--seconds", str(opts.seconds + 5)], env=env)
        time.sleep(2)
    cmd = [sys.executable, "-m", "oomguard", "run", "--restart", "never"]
    cmd += ["--guard", "--guard-margin", str(opts.margin)] if guard else []
    cmd += ["--", "sleep", str(opts.seconds)]
    p = subprocess.Popen(
        ["/bin/sh", "-c", script, "sh", *cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, _, usage = os.wait4(p.pid, 0)
    if hold is not None:
        hold.kill()
        hold.wait()
    return float(usage.ru_utime + usage.ru_stime) / float(opts.seconds)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def line_of(xs: list[float]) -> str:
    if not xs:
        return "no latency measured"
    ms = [x * 1000 for x in xs]
    return f"p50 {statistics.median(ms):6.1f} ms, p99 {pct(ms, 0.99):6.1f} ms, max {max(ms):6.1f} ms"


def report(results: list[dict[str, Any]], cpu: dict[str, float]) -> None:
    lat = [r["latency_s"] for r in results if r["latency_s"] is not None]
    print(f"{len(results)} trials; latency from crossing the stop line to SIGTERM: {line_of(lat)}")
    early = [r for r in results if r["signalled"] and not r["crossed"]]
    missed = [r for r in results if not r["signalled"]]
    print(f"kernel OOM kills: {sum(r['oom_kills'] for r in results)}; trials not signalled: {len(missed)}")
    print(
        f"trials signalled before the worker's own reading crossed the line (latency <= 0, not counted): {len(early)}"
    )
    for r in missed[:5]:
        print(f"  missed: {r['rate']} GiB/s {r['kind']} cache={r['cache']} rc={r['rc']}: {r['stderr'][-200:]!r}")
    print("| rate | pages | page cache | trials | p50 | p99 | max | OOM kills |")
    print("|---|---|---|---|---|---|---|---|")
    for rate in RATES:
        for kind in KINDS:
            for cache in CACHE:
                mine = [r for r in results if (r["rate"], r["kind"], r["cache"]) == (rate, kind, cache)]
                xs = [r["latency_s"] * 1000 for r in mine if r["latency_s"] is not None]
                if not mine:
                    continue
                cells = (
                    f"{statistics.median(xs):.1f} ms | {pct(xs, 0.99):.1f} ms | {max(xs):.1f} ms" if xs else "- | - | -"
                )
                on = "present" if cache else "absent"
                kills = sum(r["oom_kills"] for r in mine)
                print(f"| {rate:g} GiB/s | {kind} | {on} | {len(mine)} | {cells} | {kills} |")
    for kind in KINDS:
        print(
            f"{kind}: {line_of([r['latency_s'] for r in results if r['kind'] == kind and r['latency_s'] is not None])}"
        )
    plain = cpu.get("run without --guard")
    for name, share in cpu.items():
        more = "" if plain is None or share is plain else f" ({share - plain:+.2%} for the guard)"
        print(f"supervisor CPU, {name}: {share:.2%} of one core{more}")


def options() -> argparse.Namespace:
    from oomguard.units import parse_size

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fill", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--line", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--trials", type=int, default=1000, help="trials, spread over the grid (default 1000)")
    parser.add_argument("--limit", type=parse_size, default=parse_size("384MiB"), help="the group's limit")
    parser.add_argument("--margin", type=parse_size, default=parse_size("16MiB"), help="--guard-margin")
    parser.add_argument("--seconds", type=float, default=10.0, help="each CPU measurement (default 10)")
    parser.add_argument("--seed", type=int, default=1, help="the order of the trials (default 1)")
    return parser.parse_args()


def main() -> int:
    opts = options()
    if opts.worker:
        return worker(opts)
    if opts.fill:
        return filler(opts)
    from tests.helpers.realcgroup import Group, writable_parent

    version, parent = writable_parent()
    if version is None:
        print(f"cannot run: {parent}")
        return 1
    grid = [(rate, kind, cache) for rate in RATES for kind in KINDS for cache in CACHE]
    plan = [grid[i % len(grid)] for i in range(opts.trials)]
    random.Random(opts.seed).shuffle(plan)
    group = Group(version, Path(parent))
    started = time.monotonic()
    try:
        group.set_limit(opts.limit)
        limit, margin = opts.limit / MiB, opts.margin / MiB
        print(f"cgroup v{version} group {group.dir} limited to {limit:.0f} MiB, margin {margin:.0f} MiB")
        with tempfile.NamedTemporaryFile(dir="/var/tmp") as cache:
            cache.write(os.urandom(CACHE_BYTES))
            cache.flush()
            results = [trial(group, opts, rate, kind, cache.name if on else None) for rate, kind, on in plan]
        # the filler holds the group at 3.5 margins under the ceiling; with the supervisor's own
        # memory the working set is then within four margins of it (the 20 ms rate), under the line
        near = opts.limit - 7 * opts.margin // 2
        cpu = {
            "run without --guard": cpu_share(group, opts, False, 0),
            "--guard, normal rate (group nearly empty)": cpu_share(group, opts, True, 0),
            "--guard, near the ceiling (20 ms sampling)": cpu_share(group, opts, True, near),
        }
        report(results, cpu)
        print(f"({time.monotonic() - started:.0f} s)")
    finally:
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
