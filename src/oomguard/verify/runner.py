"""``oomguard verify``: prove the machine delivers the planned memory, without risking the caller.

The target (baseline + concurrency x per-job from a plan, or the whole budget) times
``fraction`` is split over child processes (one per job plus one for the baseline, or
one per CPU up to 8 for a bare budget). Each child raises its oom_score_adj to 1000,
maps and writes its share, reports, and holds it until every child has reported and
``hold`` seconds have passed. A child that dies of SIGKILL while the memory cgroup's
oom_kill counter rose was OOM-killed. The parent allocates nothing large.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

from oomguard.errors import BudgetUnknownError
from oomguard.policy.plan import Shape, make_plan
from oomguard.probes.memory import read_oom_kills, read_usage
from oomguard.sources.root import LiveRoot
from oomguard.units import format_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Report

REPORT_TIMEOUT = 900.0  # seconds for all children to fault their memory in
MAX_BUDGET_CHILDREN = 8


def split_target(report: Report, shape: Shape | None, fraction: float) -> tuple[list[int], dict[str, object] | None]:
    """The byte count of each child, and the plan when a shape was given."""
    budget = report["budget"]["bytes"]
    if budget is None:
        raise BudgetUnknownError("verify")
    if shape is not None:
        plan = make_plan(report, shape)
        sizes = [shape.baseline] + [shape.per_job] * int(plan["concurrency"])  # type: ignore[call-overload]
    else:
        plan = None
        cpus = report["cpu"]["effective_cpus"] or 1
        n = max(1, min(int(cpus), MAX_BUDGET_CHILDREN))
        sizes = [budget // n + (1 if i < budget % n else 0) for i in range(n)]
    return [int(s * fraction) for s in sizes if int(s * fraction) > 0], plan


def _classify(proc: subprocess.Popen[str], oom_rose: bool | None, error: str | None) -> dict[str, object]:
    rc = proc.returncode
    out: dict[str, object] = {"pid": proc.pid, "exit_code": None, "signal": None, "error": error}
    if rc is None or rc == 0:
        out["outcome"] = "ok"
    elif rc < 0:
        out["signal"] = -rc
        out["outcome"] = "oom-kill" if rc == -9 and oom_rose else "signal"
    else:
        out["exit_code"] = rc
        out["outcome"] = "allocation-failed" if error else "exit"
    return out


def _hwm(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def verify(report: Report, shape: Shape | None, *, fraction: float = 1.0, hold: float = 3.0) -> dict[str, Any]:
    sizes, plan = split_target(report, shape, fraction)
    root = LiveRoot()
    oom = report["memory"]["oom"]
    oom_source = oom["source"] if oom else None
    before = read_oom_kills(root, oom_source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "oomguard.verify._alloc", str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        for n in sizes
    ]
    lines: list[dict[str, Any]] = []
    peak_rss = 0
    usage = None
    try:
        deadline = time.monotonic() + REPORT_TIMEOUT
        for p in procs:
            assert p.stdout is not None
            text = p.stdout.readline() if time.monotonic() < deadline else ""
            try:
                lines.append(json.loads(text) if text else {})
            except ValueError:
                lines.append({})
        if all("touched" in msg for msg in lines):
            time.sleep(hold)
            peak_rss = sum(_hwm(p.pid) for p in procs)
            usage = read_usage(root, report["memory"]["cgroup"]["dir"], report["memory"]["cgroup"]["version"])
    finally:
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
    after = read_oom_kills(root, oom_source)
    oom_rose = None if before is None or after is None else after > before
    children: list[dict[str, Any]] = []
    for n, p, msg in zip(sizes, procs, lines, strict=True):
        error = msg.get("error") if isinstance(msg.get("error"), str) else None
        children.append(
            {
                "bytes": n,
                "touched": "touched" in msg,
                "fault_seconds": msg.get("seconds"),
                **_classify(p, oom_rose, error),
            }
        )
    touched = sum(c["bytes"] for c in children if c["touched"])
    slowest = max((c["fault_seconds"] for c in children if isinstance(c["fault_seconds"], float)), default=0.0)
    delivered = all(c["outcome"] == "ok" and c["touched"] for c in children)
    return {
        "delivered": delivered,
        "target_bytes": sum(sizes),
        "touched_bytes": touched,
        "fraction": fraction,
        "hold_seconds": hold,
        "children": children,
        "oom_kills": None if before is None or after is None else after - before,
        "oom_counter": oom_source,
        "peak_rss_bytes": peak_rss or None,
        "cgroup_usage_bytes": usage,
        "fault_in_bytes_per_second": int(touched / slowest) if slowest and delivered else None,
        "plan": plan,
        "budget": report["budget"],
        "effective_bytes": report["memory"]["effective_bytes"],
        "limited_by": report["memory"]["limited_by"],
        "warnings": report["warnings"],
    }


def format_verify(r: dict[str, Any]) -> str:
    children = r["children"]
    assert isinstance(children, list)
    verdict = "DELIVERED" if r["delivered"] else "NOT DELIVERED"
    rate = r["fault_in_bytes_per_second"]
    lines = [
        f"oomguard verify: {verdict}: {format_size(r['touched_bytes'])} of {format_size(r['target_bytes'])} "
        f"touched in {len(children)} child processes",
        f"  budget      {format_size(r['budget']['bytes'])} ({r['budget']['source']}); "
        f"ceiling {format_size(r['effective_bytes'])} ({r['limited_by']})",
        f"  peak RSS    {format_size(r['peak_rss_bytes'])} (children); "
        f"cgroup usage {format_size(r['cgroup_usage_bytes'])}",
        f"  fault-in    {'-' if rate is None else f'{rate / 1e9:.2f} GB/s'}",
        f"  OOM kills   {'unknown (no counter readable)' if r['oom_kills'] is None else r['oom_kills']}",
    ]
    for c in children:
        if c["outcome"] != "ok":
            why = c["error"] or (f"signal {c['signal']}" if c["signal"] else f"exit {c['exit_code']}")
            lines.append(f"  child {c['pid']} ({format_size(c['bytes'])}): {c['outcome']} ({why})")
    return "\n".join(lines) + "\n"
