"""Pressure guard: jobs that use more than they declared, in a real limited cgroup, admitted three ways.

Creates a child of this process's memory cgroup (v1 or v2) limited to --limit (default
768 MiB), as tests/realcgroup.py does, and removes it at the end. A seeded job mix: each job
declares a size (32-128 MiB) but really uses 10-25% more; it is a child process that fills
its real peak gradually over its ramp (0.2-0.5 s), holds it 1.0 s and exits. A coordinator
inside the group (oom_score_adj -1000; the jobs +1000, so the OOM killer picks a job) hands
out MemoryBudget reservations first come, first served, one job per grant, in a fixed order:

  (a) static MemoryBudget, budget = limit - --static-margin (default 10%: today's default
      ratio; its 256 MiB floor would leave a third of this small limit unused)
  (b) MemoryBudget(watch=True), budget = limit - --guard-margin (default 2%), the same guard margin
  (b') as (b) without learning the overshoot (the rule as first specified: working set + n)
  (c) the (a) worker under `oomguard run --guard --guard-margin 2% --margin 10%`: a pressure stop
      (SIGTERM) loses the jobs in flight; the restarted worker reruns them with a larger margin

Reported: kernel OOM kills (the group's oom_kill counter, before and after), pressure stops
(run's events), jobs completed, makespan over the ideal lower bound max(sum of declared
job-seconds / (limit - guard margin), the longest job), the peak working set as a share of
the limit (sampled every 20 ms). Also the FIFO floor: the makespan of the schedule that starts
the jobs in order, each as soon as its *real* peak fits under limit - guard margin beside the
real peaks of those running (clairvoyant: it knows every real peak; no start-up cost, no
coordinator). No schedule that starts the jobs in order and counts each at its real peak from
its start beats it (by induction: greedy starts job i no later than any such schedule does, as
the jobs it has running then are a subset of that schedule's), whatever admission samples.

Usage: python bench/guard.py [--seed N] [--jobs N] [--limit SIZE] [--modes a,b,b',c] [--verbose]   (root)
       [--warmup BYTES]: (b)'s warm-up (Watch.warmup_bytes; default the ceiling, 0: none)
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
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


def make_budget(admit: str, total: int, guard_margin: str, warmup: str | None) -> Any:
    from oomguard import MemoryBudget
    from oomguard.policy.budget import probe
    from oomguard.runtime.watch import Watch
    from oomguard.sources.root import LiveRoot

    if admit == "static":
        return MemoryBudget(total)
    root = LiveRoot()
    watch = Watch.from_report(probe(root, gpu=False), root, margin=guard_margin)
    watch.learn = admit == "watch"
    if warmup is not None:
        watch.warmup_bytes = int(warmup)
    return MemoryBudget(total, watch=watch)


def coordinator(argv: list[str]) -> int:
    opts = dict(zip(argv[::2], argv[1::2], strict=False))
    with contextlib.suppress(OSError):  # where not allowed: the jobs' +1000 makes the OOM killer pick them first
        Path("/proc/self/oom_score_adj").write_text("-1000")
    total = int(opts.get("--budget") or os.environ["OOMGUARD_BUDGET_BYTES"])
    progress = Path(opts["--progress"])
    done = set(progress.read_text().split()) if progress.exists() else set()
    jobs = [j for j in json.loads(Path(opts["--jobs"]).read_text()) if str(j["id"]) not in done]
    budget = make_budget(opts["--admit"], total, opts.get("--guard-margin", "2%"), opts.get("--warmup"))
    children: set[subprocess.Popen[bytes]] = set()
    counts = {"completed": 0, "killed": 0}
    lock = threading.Lock()

    def on_term(signum: int, frame: object) -> None:
        for p in list(children):
            p.kill()
            counts["killed"] += 1
        print(json.dumps(counts), flush=True)
        os._exit(143)

    signal.signal(signal.SIGTERM, on_term)

    def run(job: dict[str, Any], reservation: Any) -> None:
        args = [str(job["real"] - INTERP), str(job["ramp"]), str(HOLD)]
        p = subprocess.Popen([sys.executable, "-S", "-c", JOB, *args])
        with lock:
            children.add(p)
        rc = p.wait()
        with lock:
            children.discard(p)
            counts["completed" if rc == 0 else "killed"] += 1
            if rc == 0:
                with progress.open("a") as f:
                    f.write(f"{job['id']}\n")
        reservation.release()

    threads = []
    for job in jobs:  # first come, first served: the head waits, and so does everyone behind it
        r = budget.reserve(job["declared"])
        t = threading.Thread(target=run, args=(job, r))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    counts["overshoot"] = budget.overshoot
    print(json.dumps(counts), flush=True)
    return 0


# --- the outer bench ----------------------------------------------------------------------------


class Peak(threading.Thread):
    """The group's highest working set, sampled every 20 ms."""

    def __init__(self, group_dir: Path, version: int) -> None:
        super().__init__(daemon=True)
        self.group_dir, self.version, self.peak, self.stop = str(group_dir), version, 0, threading.Event()

    def run(self) -> None:
        from oomguard.runtime.watch import read_working_set
        from oomguard.sources.root import LiveRoot

        root = LiveRoot()
        while not self.stop.wait(0.02):
            self.peak = max(self.peak, read_working_set(root, self.group_dir, self.version) or 0)


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
    if "--warmup" in opts:
        common += ["--warmup", opts["--warmup"]]
    if mode == "c":
        run = [sys.executable, "-m", "oomguard", "run", "--guard", "--guard-margin", opts["--guard-margin"]]
        run += ["--margin", opts["--static-margin"], "--events", str(events), "--backoff-initial", "200ms"]
        cmd = [*run, "--stop-timeout", "2s", "--", *me, "--admit", "static", *common]
    else:
        ways = {"a": ("static", static_total), "b": ("watch", guard_total), "b'": ("literal", guard_total)}
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
        "makespan": makespan,
        "peak": peak.peak,
        "overshoot": next((x["overshoot"] for x in lines if x.get("overshoot")), None),
        "stderr": proc.stderr[-3000:] if proc.returncode != 0 or "--verbose" in sys.argv else "",
    }


LABELS = {
    "a": "(a) static MemoryBudget",
    "b": "(b) MemoryBudget(watch=True)",
    "b'": "(b') watch, overshoot not learned",
    "c": "(c) static under run --guard",
}


def fifo_floor(jobs: list[dict[str, Any]], usable: int) -> float:
    """The greedy in-order schedule by real peaks: each job starts as soon as its real peak fits
    beside the real peaks of those running (clairvoyant, no start-up cost)."""
    t, used = 0.0, 0
    running: list[tuple[float, int]] = []  # (end, real)
    for j in jobs:
        while running and used + j["real"] > usable:
            end, size = min(running)
            running.remove((end, size))
            t, used = max(t, end), used - size
        running.append((t + j["ramp"] + HOLD, j["real"]))
        used += j["real"]
    return max(end for end, _ in running)


def report(results: list[dict[str, Any]], jobs: list[dict[str, Any]], limit: int, opts: dict[str, str]) -> None:
    usable = limit - int(limit * float(opts["--guard-margin"].rstrip("%")) / 100)
    longest = max(j["ramp"] + HOLD for j in jobs)
    ideal = max(sum(j["declared"] * (j["ramp"] + HOLD) for j in jobs) / usable, longest)
    real = max(sum(j["real"] * (j["ramp"] + HOLD) for j in jobs) / usable, longest)
    fifo = fifo_floor(jobs, usable)
    print(f"ideal lower bound: {ideal:.2f} s (declared job-seconds / {usable / MiB:.0f} MiB, or the longest job)")
    print(f"the same with the real sizes: {real:.2f} s (no schedule that stays under the line beats it)")
    print(f"FIFO floor: {fifo:.2f} s = {fifo / ideal:.2f}x the ideal (in order, each job as soon as its real peak")
    print("fits; clairvoyant, no start-up cost: no in-order schedule by real peaks beats it)")
    print()
    head = (
        "| way | kernel OOM kills | pressure stops | jobs completed | jobs lost | makespan | / ideal | / real ideal |"
    )
    print(head + " peak working set |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "skipped" in r:
            print(f"({r['mode']}) skipped: {r['skipped']}")
            continue
        print(
            f"| {LABELS[r['mode']]} | {r['oom_kills']} | {r['pressure_stops']} | {r['completed']}/{len(jobs)} | "
            f"{r['jobs_lost']} | {r['makespan']:.1f} s | {r['makespan'] / ideal:.2f}x | {r['makespan'] / real:.2f}x | "
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


def main() -> int:
    if "--inner" in sys.argv:
        return coordinator(sys.argv[sys.argv.index("--inner") + 1 :])
    from tests.realcgroup import Group, writable_parent

    from oomguard.units import parse_size

    opts = {"--seed": "1", "--jobs": "48", "--limit": "768MiB", "--modes": "a,b,b',c"}
    opts |= {"--static-margin": "10%", "--guard-margin": "2%"}
    args = [a for a in sys.argv[1:] if a != "--verbose"]
    opts |= dict(zip(args[::2], args[1::2], strict=False))
    limit, jobs = parse_size(opts["--limit"]), make_jobs(int(opts["--seed"]), int(opts["--jobs"]))
    version, parent = writable_parent()
    if version is None:
        print(f"cannot run: {parent}")
        return 1
    group = Group(version, Path(parent))
    try:
        group.set_limit(limit)
        print(f"cgroup v{version} group {group.dir} limited to {limit / MiB:.0f} MiB")
        declared, really = (sum(j[k] for j in jobs) / MiB for k in ("declared", "real"))
        print(f"{len(jobs)} jobs (seed {opts['--seed']}): declared 32-128 MiB, real +10-25% ({declared:.0f} MiB")
        print(f"declared, {really:.0f} MiB real in all); ramp {RAMP[0]}-{RAMP[1]} s, hold {HOLD} s")
        with tempfile.TemporaryDirectory() as d:
            Path(d, "jobs.json").write_text(json.dumps(jobs))
            results = [run_mode(m, group, limit, Path(d), opts) for m in opts["--modes"].split(",")]
        report(results, jobs, limit, opts)
    finally:
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
