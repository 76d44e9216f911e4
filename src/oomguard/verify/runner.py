"""``oomguard verify``: prove the machine delivers the planned memory, without risking the caller.

The target (baseline + concurrency x per-job from a plan, or the whole budget) times
``fraction`` is made of shares (the baseline and one per job, or slices of the budget), spread
over at most ``children`` child processes (``--children``, by default the CPUs up to 8:
``verify/shares.py``); each child allocates several shares as one mapping. Each child raises
its oom_score_adj to 1000, maps and writes its shares, reports, and holds them until every child
has reported and ``hold`` seconds have passed. A child that dies of SIGKILL while the memory
cgroup's oom_kill counter rose, and no process outside verify's own tree left the group
meanwhile, was OOM-killed (``supervisor/exits.py`` and ``supervisor/members.py``, as for
``run``). The parent allocates nothing large, and reads /proc and /sys only through a ``Root``.
Progress goes to stderr (``verify/progress.py``).

What it measures, each number once and named for what it is:

- ``touched_bytes``: the children that wrote every page of their shares (the progress summary
  says the same figure); ``jobs_touched`` the planned jobs among those shares, of ``jobs``;
- ``group_peak_bytes``: the peak usage of verify's memory cgroup while verify ran
  (``GroupPeak``): the group's own peak counter where verify moved it, v2 ``memory.peak`` ("The
  max memory usage recorded for the cgroup and its descendants", cgroup-v2.rst 5-2-1), v1
  ``memory.max_usage_in_bytes`` ("max memory usage recorded", cgroup-v1/memory.rst, "Brief
  summary of control files"); where it did not move (the group peaked higher before verify),
  the highest usage sampled during the run (every 0.1 s), ``group_peak_source`` says which;
- ``children_vmhwm_sum_bytes``: the children's ``VmHWM`` (proc(5)) summed, as labelled: each
  child's own peak, at different moments, with the pages they share counted once per child, so
  it is not the group's peak (1.85 GiB summed where the group peaked at 1.79 GiB);
- ``cgroup_usage_bytes``: the group's usage while the children hold their memory.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Any, TextIO

from oomguard.errors import VerifyFailedError
from oomguard.policy.plan import Shape
from oomguard.probes.counters import read_oom_kills, read_peak, read_peak_rss, read_usage
from oomguard.sources.root import LiveRoot, Root
from oomguard.supervisor.exits import CLEAN, EXIT, OOM_KILL, SIGNAL, Evidence, classify, evidence, exit_fields
from oomguard.supervisor.members import gone, outsiders
from oomguard.units import format_size
from oomguard.verify._alloc import EXIT_ALLOC_FAILED
from oomguard.verify.launch import start_child
from oomguard.verify.progress import Progress, collect
from oomguard.verify.shares import Load, default_children, plan_loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Plan, Report

# A child's outcome: the exit classifier's reason, in verify's words; plus "allocation-failed"
# for a child that exits with the child protocol's EXIT_ALLOC_FAILED.
OUTCOMES = {CLEAN: "ok", EXIT: "exit", SIGNAL: "signal", OOM_KILL: "oom-kill"}


class GroupPeak:
    """The peak usage of the group *cgroup_dir* while verify runs: its peak counter (read now and in
    ``result``) where verify moved it, else the most usage ``sample`` saw."""

    SAMPLED = "usage-sampled"

    def __init__(self, root: Root, cgroup_dir: str | None, version: int | None) -> None:
        self.root, self.dir, self.version = root, cgroup_dir, version
        self.before = read_peak(root, cgroup_dir, version) if cgroup_dir and version else None
        self.sampled: int | None = None

    def sample(self) -> None:
        usage = read_usage(self.root, self.dir, self.version)
        if usage is not None and (self.sampled is None or usage > self.sampled):
            self.sampled = usage

    def result(self) -> tuple[int | None, str | None]:
        """(peak bytes, source): ``memory.peak`` / ``memory.max_usage_in_bytes`` / ``usage-sampled``."""
        self.sample()
        after = read_peak(self.root, self.dir, self.version) if self.dir and self.version else None
        if after is not None and self.before is not None and after > self.before:
            return after, "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        return self.sampled, self.SAMPLED if self.sampled is not None else None


def _hold(seconds: float, peak: GroupPeak) -> None:
    """Hold for *seconds*, sampling the group's usage every 0.1 s."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        peak.sample()
        time.sleep(min(left, 0.1))


def outcome(returncode: int, e: Evidence) -> str:
    """What became of one child: ok, exit, signal, oom-kill or allocation-failed."""
    if returncode == EXIT_ALLOC_FAILED:
        return "allocation-failed"
    return OUTCOMES[classify(returncode, e, descendants=False).reason]


def _release(procs: list[subprocess.Popen[str]]) -> None:
    """Close every child's stdin (it lets go of its memory and exits), then reap them all."""
    for p in procs:
        if p.stdin is not None:
            with contextlib.suppress(OSError):
                p.stdin.close()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _start(loads: list[Load]) -> list[subprocess.Popen[str]]:
    """One ``_alloc`` child per load; where one cannot start (a pids limit, EAGAIN), the ones
    started are released and ``VerifyFailedError`` says so in one line."""
    procs: list[subprocess.Popen[str]] = []
    for i, load in enumerate(loads):
        try:
            procs.append(start_child("_alloc", *load.argv(), stdin=subprocess.PIPE))
        except OSError as exc:
            _release(procs)
            hint = f" (a pids limit? try --children {i})" if i else ""
            raise VerifyFailedError(
                f"verify: cannot start child {i + 1} of {len(loads)}: {exc.strerror or exc}{hint}"
            ) from None
    return procs


def _child(load: Load, p: subprocess.Popen[str], msg: dict[str, Any], e: Evidence) -> dict[str, Any]:
    error = msg.get("error") if isinstance(msg.get("error"), str) else None
    return {
        "bytes": load.bytes,
        "jobs": load.jobs,
        "baseline_bytes": load.baseline_bytes,
        "touched": "touched" in msg and msg.get("shares", load.shares) == load.shares,
        "fault_seconds": msg.get("seconds"),
        "pid": p.pid,
        **exit_fields(p.returncode),
        "error": error,
        "outcome": outcome(p.returncode, e),
    }


def verify(
    report: Report,
    shape: Shape | None,
    *,
    fraction: float = 1.0,
    hold: float = 3.0,
    children: int | None = None,
    root: Root | None = None,
    progress: TextIO | None = None,
) -> dict[str, Any]:
    """Allocate the target in children and say whether the machine delivered it.

    *children* caps the child processes (None: ``default_children``, the CPUs up to 8); the
    shares are spread over them (``verify/shares.py``). *root* is where the OOM-kill counter, the
    group's processes, its usage and the children's peak RSS are read (the live system by
    default; a fake tree in tests); the children are real. *progress* is where their progress
    goes (None: this process's stderr).
    """
    root = root if root is not None else LiveRoot()
    limit = children if children is not None else default_children(report)
    loads, plan = plan_loads(report, shape, fraction, limit)
    sizes = [load.bytes for load in loads]
    oom = report["memory"]["oom"]
    oom_source = oom["source"] if oom else None
    group = os.path.dirname(oom_source) if oom_source else None
    version = report["memory"]["cgroup"]["version"]
    others = outsiders(root, group, version, os.getpid())
    before = read_oom_kills(root, oom_source)
    cg = report["memory"]["cgroup"]
    group_peak = GroupPeak(root, cg["dir"], cg["version"])
    started = time.monotonic()
    procs = _start(loads)
    meter = Progress(progress if progress is not None else sys.stderr, sizes, [p.pid for p in procs])
    vmhwm_sum, usage = 0, None
    try:
        lines = collect(procs, meter, group_peak.sample)
        meter.finish(time.monotonic() - started)
        if all("touched" in msg for msg in lines):
            _hold(hold, group_peak)
            vmhwm_sum = sum(read_peak_rss(root, p.pid) or 0 for p in procs)
            usage = read_usage(root, cg["dir"], cg["version"])
        peak, peak_source = group_peak.result()
    finally:
        _release(procs)
    after = read_oom_kills(root, oom_source)
    e = evidence(before, after, gone(others, outsiders(root, group, version, os.getpid())))
    records = [_child(load, p, msg, e) for load, p, msg in zip(loads, procs, lines, strict=True)]
    measured = {
        "oom_kills": None if before is None or after is None else after - before,
        "oom_counter": oom_source,
        "group_peak_bytes": peak,
        "group_peak_source": peak_source,
        "children_vmhwm_sum_bytes": vmhwm_sum or None,
        "cgroup_usage_bytes": usage,
    }
    return _result(report, sizes, plan, records, measured, fraction=fraction, hold=hold, limit=limit)


def _result(
    report: Report,
    sizes: list[int],
    plan: Plan | None,
    children: list[dict[str, Any]],
    measured: dict[str, Any],
    *,
    fraction: float,
    hold: float,
    limit: int,
) -> dict[str, Any]:
    touched = sum(c["bytes"] for c in children if c["touched"])
    slowest = max((c["fault_seconds"] for c in children if isinstance(c["fault_seconds"], float)), default=0.0)
    delivered = all(c["outcome"] == "ok" and c["touched"] for c in children)
    jobs = sum(c["jobs"] for c in children) if plan is not None else None
    jobs_touched = sum(c["jobs"] for c in children if c["touched"]) if plan is not None else None
    return {
        "delivered": delivered,
        "target_bytes": sum(sizes),
        "touched_bytes": touched,
        "jobs": jobs,
        "jobs_touched": jobs_touched,
        "fraction": fraction,
        "hold_seconds": hold,
        "children_limit": limit,
        "children": children,
        **measured,
        "fault_in_bytes_per_second": int(touched / slowest) if slowest and delivered else None,
        "plan": plan,
        "budget": report["budget"],
        "effective_bytes": report["memory"]["effective_bytes"],
        "limited_by": report["memory"]["limited_by"],
        "warnings": report["warnings"],
    }


def _jobs_line(r: dict[str, Any]) -> list[str]:
    """The planned jobs whose memory was touched, where a plan was verified."""
    if r["jobs"] is None:
        return []
    baseline = sum(c["baseline_bytes"] for c in r["children"])
    plus = f" (+ the {format_size(baseline)} baseline)" if baseline else ""
    return [f"  jobs        {r['jobs_touched']} of {r['jobs']} jobs' memory touched{plus}"]


def format_verify(r: dict[str, Any]) -> str:
    children = r["children"]
    assert isinstance(children, list)
    verdict = "DELIVERED" if r["delivered"] else "NOT DELIVERED"
    rate = r["fault_in_bytes_per_second"]
    lines = [
        f"oomguard verify: {verdict}: {format_size(r['touched_bytes'])} of {format_size(r['target_bytes'])} "
        f"touched in {len(children)} child processes (at most {r['children_limit']})",
        *_jobs_line(r),
        f"  budget      {format_size(r['budget']['bytes'])} ({r['budget']['source']}); "
        f"ceiling {format_size(r['effective_bytes'])} ({r['limited_by']})",
        f"  group peak  {format_size(r['group_peak_bytes'])} ({r['group_peak_source'] or 'unreadable'}, while verify "
        f"ran); usage {format_size(r['cgroup_usage_bytes'])} while held",
        f"  VmHWM sum   {format_size(r['children_vmhwm_sum_bytes'])} (the children's VmHWM summed)",
        f"  fault-in    {'-' if rate is None else f'{rate / 1e9:.2f} GB/s'}",
        f"  OOM kills   {'unknown (no counter readable)' if r['oom_kills'] is None else r['oom_kills']}",
    ]
    for c in children:
        if c["outcome"] != "ok":
            why = c["error"] or (f"signal {c['signal']}" if c["signal"] else f"exit {c['exit_code']}")
            held = f", {c['jobs']} jobs" if r["jobs"] is not None else ""
            lines.append(f"  child {c['pid']} ({format_size(c['bytes'])}{held}): {c['outcome']} ({why})")
    return "\n".join(lines) + "\n"
