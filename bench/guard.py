"""Pressure guard: jobs that use more than they declared, in a real limited cgroup, admitted several ways.

Creates a child of this process's memory cgroup (v1 or v2) limited to --limit (default
768 MiB), as tests/helpers/realcgroup.py does, and removes it at the end. A seeded job mix: each job
declares a size (32-128 MiB) but really uses 10-25% more; it is a child process that fills
its real peak gradually over its ramp (0.2-0.5 s), holds it 1.0 s and exits. A coordinator
inside the group (oom_score_adj -1000; the jobs +1000, so the OOM killer picks a job) asks
MemoryBudget for every job's reservation at once, in the jobs' order (asyncio: the requests
queue in that order), and starts each job as its reservation is granted:

  (a) static MemoryBudget, budget = limit - --static-margin (default 10%: today's default
      ratio; its 256 MiB floor would leave a third of this small limit unused), first come,
      first served
  (b) MemoryBudget(watch=True), budget = limit - --guard-margin (default 2%), the same guard margin
  (b') as (b) without learning the overshoot (the rule as first specified: working set + n)
  (c) the (a) worker under `oomguard run --guard --guard-margin 2% --margin 10%`: a pressure stop
      (SIGTERM) loses the jobs in flight; the restarted worker reruns them with a larger margin
  (d) as (b), with MemoryBudget(backfill=--backfill) (default 8): a later job that fits starts
      past a waiting one, each waiting one overtaken at most that many times
  (e) as (a), with the same backfill

Reported per way: kernel OOM kills (the group's oom_kill counter, before and after), pressure
stops (run's events), jobs completed, makespan against the bounds below, time-averaged slack
(1 - the integral of the group's working set / (limit x makespan), the working set sampled
every 20 ms), wasted work (the job-seconds that jobs killed by the kernel or stopped with their
worker had run, over the job-seconds of the whole mix), and the peak working set.

The bounds, from the real peaks (clairvoyant: no start-up cost, no coordinator):
- the area bound: max(sum of real job-seconds / (limit - guard margin), the longest job): no
  schedule that keeps the real peaks under the line beats it;
- the FIFO floor: the jobs started in order, each as soon as its real peak fits beside the real
  peaks of those running; no schedule that starts the jobs in order beats it (by induction:
  greedy starts job i no later than any such schedule does, as the jobs it has running then are
  a subset of that schedule's), whatever admission samples;
- the oracle: the best of four greedy schedules that may reorder (at each job's end, start every
  waiting job whose real peak fits, scanning in the jobs' order, by decreasing peak, by
  decreasing duration, by decreasing peak x duration). It is a schedule, so it is an upper bound
  on the optimum; the area bound is the lower one.

Usage: python bench/guard.py [--seed N | --seeds 1,2,...] [--jobs N] [--limit SIZE]
       [--modes a,b,b',c,d,e] [--backfill K] [--verbose]   (root)
       [--warmup BYTES]: (b)'s warm-up (Watch.warmup_bytes; default the ceiling, 0: none)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

MiB = 1 << 20
INTERP = 4 * MiB  # what a `python -S` job child is charged before it allocates (anon, page tables)
HOLD = 1.0  # seconds each job holds its peak
RAMP = (0.2, 0.5)  # seconds each job takes to reach it

JOB = r"""
import sys, time
real, ramp, hold = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
with open("/proc/self/oom_score_adj", "w") as f:
    f.write("1000")
chunk = 4 << 20
steps = max(1, real // chunk)
held = []
t0 = time.monotonic()
for i in range(steps):
    held.append(b"\x01" * chunk)  # written, so every page is charged
    delay = t0 + ramp * (i + 1) / steps - time.monotonic()
    if delay > 0:
        time.sleep(delay)
time.sleep(hold)
"""


def make_jobs(seed: int, n: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    jobs = []
    for i in range(n):
        declared = rnd.randint(32, 128) * MiB
        jobs.append(
            {"id": i, "declared": declared, "real": int(declared * rnd.uniform(1.10, 1.25)), "ramp": rnd.uniform(*RAMP)}
        )
    return jobs


# --- the coordinator, inside the group -------------------------------------------------------------


def make_budget(admit: str, total: int, guard_margin: str, warmup: str | None, backfill: int) -> Any:
    from oomguard import MemoryBudget
    from oomguard.policy.budget import probe
    from oomguard.runtime.watch import Watch
    from oomguard.sources.root import LiveRoot

    if admit == "static":
        return MemoryBudget(total, backfill=backfill)
    root = LiveRoot()
    watch = Watch.from_report(probe(root, gpu=False), root, margin=guard_margin)
    watch.learn = admit == "watch"
    if warmup is not None:
        watch.warmup_bytes = int(warmup)
    return MemoryBudget(total, watch=watch, backfill=backfill)


def coordinator(argv: list[str]) -> int:
    opts = dict(zip(argv[::2], argv[1::2], strict=False))
    with contextlib.suppress(OSError):  # where not allowed: the jobs' +1000 makes the OOM killer pick them first
        Path("/proc/self/oom_score_adj").write_text("-1000")
    total = int(opts.get("--budget") or os.environ["OOMGUARD_BUDGET_BYTES"])
    progress = Path(opts["--progress"])
    done = set(progress.read_text().split()) if progress.exists() else set()
    jobs = [j for j in json.loads(Path(opts["--jobs"]).read_text()) if str(j["id"]) not in done]
    backfill = int(opts.get("--backfill", "0"))
    budget = make_budget(opts["--admit"], total, opts.get("--guard-margin", "2%"), opts.get("--warmup"), backfill)
    running: dict[Any, float] = {}  # each job child: when it started (monotonic)
    counts: dict[str, Any] = {"completed": 0, "killed": 0, "wasted_s": 0.0, "out_of_order": 0}
    waiting = [j["id"] for j in jobs]  # not granted yet, in the jobs' order

    def on_term(signum: int, frame: object) -> None:  # a pressure stop: the jobs in flight are lost
        now = time.monotonic()
        for p, started in list(running.items()):
            p.kill()
            counts["killed"] += 1
            counts["wasted_s"] += now - started
        print(json.dumps(counts), flush=True)
        os._exit(143)

    signal.signal(signal.SIGTERM, on_term)

    async def one(job: dict[str, Any]) -> None:
        reservation = await budget.areserve(job["declared"])
        counts["out_of_order"] += waiting[0] != job["id"]  # granted past an earlier job still waiting
        waiting.remove(job["id"])
        try:
            args = [str(job["real"] - INTERP), str(job["ramp"]), str(HOLD)]
            p = await asyncio.create_subprocess_exec(sys.executable, "-S", "-c", JOB, *args)
            running[p] = started = time.monotonic()
            rc = await p.wait()
            del running[p]
            if rc == 0:
                counts["completed"] += 1
                with progress.open("a") as f:
                    f.write(f"{job['id']}\n")
            else:  # killed by the kernel: its work so far is lost
                counts["killed"] += 1
                counts["wasted_s"] += time.monotonic() - started
        finally:
            reservation.release()

    async def everyone() -> None:
        # The tasks start in this order and each asks at its first step: the requests queue in
        # the jobs' order (a grant that fits at once returns without waiting).
        await asyncio.gather(*(one(job) for job in jobs))

    asyncio.run(everyone())
    counts["overshoot"] = budget.overshoot
    print(json.dumps(counts), flush=True)
    return 0


# --- the outer bench ----------------------------------------------------------------------------


class Peak(threading.Thread):
    """The group's working set, sampled every 20 ms: its highest, and its integral over time
    (``area``, byte-seconds: each sample held until the next)."""

    def __init__(self, group_dir: Path, version: int) -> None:
        super().__init__(daemon=True)
        self.group_dir, self.version, self.peak, self.stop = str(group_dir), version, 0, threading.Event()
        self.area = 0.0

    def run(self) -> None:
        from oomguard.runtime.watch import read_working_set
        from oomguard.sources.root import LiveRoot

        root = LiveRoot()
        last, ws = time.monotonic(), 0
        while not self.stop.wait(0.02):
            now = time.monotonic()
            self.area += ws * (now - last)
            ws = read_working_set(root, self.group_dir, self.version) or 0
            self.peak, last = max(self.peak, ws), now


def oom_kills(group_dir: Path, version: int) -> int:
    from oomguard.probes.counters import read_oom_kills
    from oomguard.sources.root import LiveRoot

    name = "memory.events" if version == 2 else "memory.oom_control"
    return read_oom_kills(LiveRoot(), str(group_dir / name)) or 0


def run_mode(mode: str, group: Any, limit: int, tmp: Path, opts: dict[str, str]) -> dict[str, Any]:
    jobs_file, progress, events = tmp / "jobs.json", tmp / f"progress-{mode}", tmp / f"events-{mode}.jsonl"
    static_total = limit - int(limit * float(opts["--static-margin"].rstrip("%")) / 100)
    guard_total = limit - int(limit * float(opts["--guard-margin"].rstrip("%")) / 100)
    me = [sys.executable, str(Path(__file__).resolve()), "--inner"]
    common = ["--jobs", str(jobs_file), "--progress", str(progress), "--guard-margin", opts["--guard-margin"]]
    if mode in ("d", "e"):
        common += ["--backfill", opts["--backfill"]]
    if "--warmup" in opts:
        common += ["--warmup", opts["--warmup"]]
    if mode == "c":
        run = [sys.executable, "-m", "oomguard", "run", "--guard", "--guard-margin", opts["--guard-margin"]]
        run += ["--margin", opts["--static-margin"], "--events", str(events), "--backoff-initial", "200ms"]
        cmd = [*run, "--stop-timeout", "2s", "--", *me, "--admit", "static", *common]
    else:
        ways = {"a": ("static", static_total), "b": ("watch", guard_total), "b'": ("literal", guard_total)}
        ways |= {"d": ways["b"], "e": ways["a"]}
        admit, total = ways[mode]
        cmd = [*me, "--admit", admit, "--budget", str(total), *common]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")}
    env["PYTHONPATH"] = str(REPO / "src")
    before, peak = oom_kills(group.dir, group.version), Peak(group.dir, group.version)
    peak.start()
    t = time.monotonic()
    script = f'echo $$ > "{group.dir / "cgroup.procs"}" && exec "$@"'
    sh = ["/bin/sh", "-c", script, "sh", *cmd]
    proc = subprocess.run(sh, check=False, capture_output=True, text=True, env=env, timeout=300)
    makespan = time.monotonic() - t
    peak.stop.set()
    peak.join()
    if mode == "c" and "unrecognized arguments: --guard" in proc.stderr:
        return {"mode": mode, "skipped": "run --guard not available"}
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    ev = [json.loads(x) for x in events.read_text().splitlines()] if events.exists() else []
    return {
        "mode": mode,
        "rc": proc.returncode,
        "oom_kills": oom_kills(group.dir, group.version) - before,
        "pressure_stops": sum(1 for e in ev if e["event"] == "exit" and e["reason"] == "pressure-stop"),
        "worker_oom_kills": sum(1 for e in ev if e["event"] == "exit" and e["reason"] == "oom-kill"),
        "completed": len(progress.read_text().split()) if progress.exists() else 0,
        "jobs_lost": sum(x.get("killed", 0) for x in lines),
        "wasted_s": sum(x.get("wasted_s", 0.0) for x in lines),
        "out_of_order": sum(x.get("out_of_order", 0) for x in lines),
        "makespan": makespan,
        "slack": 1 - peak.area / (limit * makespan),
        "peak": peak.peak,
        "overshoot": next((x["overshoot"] for x in lines if x.get("overshoot")), None),
        "stderr": proc.stderr[-3000:] if proc.returncode != 0 or "--verbose" in sys.argv else "",
    }


LABELS = {
    "a": "(a) static MemoryBudget",
    "b": "(b) MemoryBudget(watch=True)",
    "b'": "(b') watch, overshoot not learned",
    "c": "(c) static under run --guard",
    "d": "(d) watch, backfill",
    "e": "(e) static, backfill",
}


def duration(job: dict[str, Any]) -> float:
    return float(job["ramp"]) + HOLD


def greedy(jobs: list[dict[str, Any]], usable: int, *, skip: bool) -> float:
    """The makespan of the greedy schedule by real peaks (clairvoyant, no start-up cost): at time 0
    and at each job's end, start the waiting jobs in *jobs*' order while their real peaks fit
    beside those running; past one that does not fit when *skip*, else not (in order)."""
    t, used, pending = 0.0, 0, list(jobs)
    running: list[tuple[float, int]] = []  # (end, real)
    while pending:
        for j in list(pending):
            if used + j["real"] <= usable:
                pending.remove(j)
                running.append((t + duration(j), j["real"]))
                used += j["real"]
            elif not skip:
                break
        if pending:
            if not running:
                raise ValueError(f"a job of {pending[0]['real']} bytes never fits under {usable}")
            end, size = min(running)
            running.remove((end, size))
            t, used = max(t, end), used - size
    return max(end for end, _ in running)


def fifo_floor(jobs: list[dict[str, Any]], usable: int) -> float:
    """The greedy in-order schedule by real peaks (module doc)."""
    return greedy(jobs, usable, skip=False)


ORACLE_ORDERS = {
    "in order": lambda j: 0,
    "largest peak first": lambda j: -j["real"],
    "longest first": lambda j: -duration(j),
    "largest peak x duration first": lambda j: -j["real"] * duration(j),
}


ORACLE_SHUFFLES = 500  # random orders tried besides those above (seeded: the same every run)


def oracle(jobs: list[dict[str, Any]], usable: int) -> tuple[float, str]:
    """The best of the reordering greedy schedules (module doc): (its makespan, its order)."""
    made = {name: greedy(sorted(jobs, key=key), usable, skip=True) for name, key in ORACLE_ORDERS.items()}
    rnd = random.Random(0)
    for i in range(ORACLE_SHUFFLES):
        order = rnd.sample(jobs, len(jobs))
        made[f"random order {i + 1} of {ORACLE_SHUFFLES}"] = greedy(order, usable, skip=True)
    best = min(made, key=lambda name: made[name])
    return made[best], best


def ramped_area(job: dict[str, Any]) -> float:
    """A job's working set integrated over its life (byte-seconds): a linear ramp to its real peak,
    then the hold."""
    return float(job["real"]) * (float(job["ramp"]) / 2 + HOLD)


def bounds(jobs: list[dict[str, Any]], limit: int, opts: dict[str, str]) -> dict[str, Any]:
    usable = limit - int(limit * float(opts["--guard-margin"].rstrip("%")) / 100)
    longest = max(duration(j) for j in jobs)
    best, order = oracle(jobs, usable)
    return {
        "usable": usable,
        "ideal": max(sum(j["declared"] * duration(j) for j in jobs) / usable, longest),
        "area": max(sum(j["real"] * duration(j) for j in jobs) / usable, longest),
        "fifo": fifo_floor(jobs, usable),
        "oracle": best,
        "oracle_order": order,
        "oracle_slack": 1 - sum(ramped_area(j) for j in jobs) / (limit * best),
        "job_seconds": sum(duration(j) for j in jobs),
    }


def report(results: list[dict[str, Any]], jobs: list[dict[str, Any]], limit: int, opts: dict[str, str]) -> None:
    b = bounds(jobs, limit, opts)
    ideal, usable = b["ideal"], b["usable"]
    print(f"ideal lower bound: {ideal:.2f} s (declared job-seconds / {usable / MiB:.0f} MiB, or the longest job)")
    print(f"area bound, real sizes: {b['area']:.2f} s (no schedule that stays under the line beats it)")
    fifo, best = b["fifo"], b["oracle"]
    print(f"FIFO floor: {fifo:.2f} s = {fifo / ideal:.2f}x the ideal (in order, each job as soon as its real peak")
    print("fits; clairvoyant, no start-up cost: no in-order schedule by real peaks beats it)")
    print(
        f"oracle: {best:.2f} s = {best / b['area']:.2f}x the area bound (reordering, clairvoyant: {b['oracle_order']});"
    )
    print(f"its slack with the jobs' ramps: {b['oracle_slack']:.1%} (each job's working set rises over its ramp)")
    print()
    head = "| way | kernel OOM kills | pressure stops | jobs completed | jobs lost | makespan | / ideal | / oracle |"
    print(head + " slack | wasted work | started out of order | peak working set |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "skipped" in r:
            print(f"({r['mode']}) skipped: {r['skipped']}")
            continue
        print(
            f"| {LABELS[r['mode']]} | {r['oom_kills']} | {r['pressure_stops']} | {r['completed']}/{len(jobs)} | "
            f"{r['jobs_lost']} | {r['makespan']:.1f} s | {r['makespan'] / ideal:.2f}x | "
            f"{r['makespan'] / b['oracle']:.2f}x | {r['slack']:.1%} | {r['wasted_s'] / b['job_seconds']:.1%} | "
            f"{r['out_of_order']} | "
            f"{r['peak'] / MiB:.0f} MiB ({100 * r['peak'] / limit:.1f}%) |"
        )
    for r in results:
        if r.get("worker_oom_kills"):
            print(
                f"({r['mode']}) {r['worker_oom_kills']} of the kernel's OOM kills ended the worker (run restarted it)"
            )
        if r.get("overshoot"):
            print(f"({r['mode']}) overshoot ratio learned: {r['overshoot']:.3f}")
        if r.get("stderr"):
            print(f"\n({r['mode']}) exit {r['rc']}; stderr tail:\n{r['stderr']}")


def summary(runs: list[tuple[int, list[dict[str, Any]], dict[str, Any]]]) -> None:
    """Per way over the seeds: makespan over the oracle (min, median, max), slack and wasted
    work (median, max), kernel OOM kills and jobs not completed (summed)."""
    print(f"\nover {len(runs)} seeds ({', '.join(str(seed) for seed, _, _ in runs)}):")
    print("| way | makespan / oracle: min, median, max | slack: median, max | wasted work: median, max |", end="")
    print(" kernel OOM kills | jobs not completed |")
    print("|---|---|---|---|---|---|")
    for mode in [r["mode"] for r in runs[0][1] if "skipped" not in r]:
        mine = [(r, b) for _, rs, b in runs for r in rs if r["mode"] == mode and "skipped" not in r]
        ratio = sorted(r["makespan"] / b["oracle"] for r, b in mine)
        slack = [r["slack"] for r, _ in mine]
        wasted = [r["wasted_s"] / b["job_seconds"] for r, b in mine]
        lost = sum(r["jobs"] - r["completed"] for r, _ in mine)
        print(
            f"| {LABELS[mode]} | {ratio[0]:.2f}x, {statistics.median(ratio):.2f}x, {ratio[-1]:.2f}x | "
            f"{statistics.median(slack):.1%}, {max(slack):.1%} | {statistics.median(wasted):.1%}, {max(wasted):.1%} | "
            f"{sum(r['oom_kills'] for r, _ in mine)} | {lost} |"
        )
    fifo = [b["fifo"] / b["oracle"] for _, _, b in runs]
    print(f"FIFO floor / oracle: {min(fifo):.2f}x-{max(fifo):.2f}x; oracle / area bound: ", end="")
    print(", ".join(f"{b['oracle'] / b['area']:.2f}x" for _, _, b in runs), end="")
    print("; the oracle's slack with the ramps: " + ", ".join(f"{b['oracle_slack']:.1%}" for _, _, b in runs))


def main() -> int:
    if "--inner" in sys.argv:
        return coordinator(sys.argv[sys.argv.index("--inner") + 1 :])
    from tests.helpers.realcgroup import Group, writable_parent

    from oomguard.units import parse_size

    opts = {"--seed": "1", "--jobs": "48", "--limit": "768MiB", "--modes": "a,b,b',c,d,e", "--backfill": "8"}
    opts |= {"--static-margin": "10%", "--guard-margin": "2%"}
    args = [a for a in sys.argv[1:] if a != "--verbose"]
    opts |= dict(zip(args[::2], args[1::2], strict=False))
    seeds = [int(x) for x in opts.get("--seeds", opts["--seed"]).split(",")]
    limit = parse_size(opts["--limit"])
    version, parent = writable_parent()
    if version is None:
        print(f"cannot run: {parent}")
        return 1
    group = Group(version, Path(parent))
    runs = []
    try:
        group.set_limit(limit)
        print(f"cgroup v{version} group {group.dir} limited to {limit / MiB:.0f} MiB")
        for seed in seeds:
            jobs = make_jobs(seed, int(opts["--jobs"]))
            declared, really = (sum(j[k] for j in jobs) / MiB for k in ("declared", "real"))
            print(f"\n{len(jobs)} jobs (seed {seed}): declared 32-128 MiB, real +10-25% ({declared:.0f} MiB")
            print(f"declared, {really:.0f} MiB real in all); ramp {RAMP[0]}-{RAMP[1]} s, hold {HOLD} s")
            with tempfile.TemporaryDirectory() as d:
                Path(d, "jobs.json").write_text(json.dumps(jobs))
                results = [run_mode(m, group, limit, Path(d), opts) for m in opts["--modes"].split(",")]
            for r in results:
                r["jobs"] = len(jobs)
            report(results, jobs, limit, opts)
            runs.append((seed, results, bounds(jobs, limit, opts)))
        if len(runs) > 1:
            summary(runs)
    finally:
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
