"""The fleet learns, in miniature (issue 23, item 6): three nodes as real memory cgroups, each with
an agent and ``oomguard run --profile mini --learned`` reporting to one real manager.

The profile declares 40 MiB a job and a 40 MiB baseline. On the ``under`` class (node ``u1``) its
jobs really use 20 % more (48 MiB); on the ``over`` class (``o1``, ``o2``) 30 % less (28 MiB).
Each node is a group limited to 320 MiB (memory and swap) whose worker gets a 280 MiB budget (the
rest holds the supervisor): the declared size plans 6 jobs, which on ``under`` need
40 + 6 x 48 = 328 MiB of the 320, so the kernel's OOM killer ends that run.

Each round runs one ``run --restart never`` per node, ``u1`` then ``o1`` then ``o2``, one after the
other (less load beside the suite's timed tests than all at once), each asking the manager for
the learned size first (``--learned --learned-may-lower``: the over-declared class is only helped
by a lower size, the operator's choice); the next starts once the manager holds the run's
observation, so each run learns from every run before it.
The worker is one Python process: it tops itself up to the baseline, then writes each job's real
size in turn, and holds them all 0.5 s: the jobs' memory at once, allocated by one thread. (With a
thread a job, the OOM-killed worker's threads faulting at once delayed the kernel's reaping of it,
and the kernel once killed the supervisor too, 6 ms later: one run in five here.)
``tests/integration/test_miniature.py`` checks the outcome; ``bench/miniature.py`` prints it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tests.helpers.manager import AGENT, VIEWER_H
from tests.helpers.realcgroup import Group
from tests.helpers.wait import wait_until

MiB = 1 << 20
DECLARED, BASELINE = 40 * MiB, 40 * MiB
LIMIT, BUDGET = 320 * MiB, 280 * MiB
NODES = {"u1": ("under", 48 * MiB), "o1": ("over", 28 * MiB), "o2": ("over", 28 * MiB)}
ROUNDS = 3
WORKER = """
import os, sys, time
per_job, baseline = int(sys.argv[1]), int(sys.argv[2])
def fill(n):
    b = bytearray(n)
    b[::4096] = b"\\x01" * len(range(0, n, 4096))  # every page written: resident, charged
    return b
rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
base = fill(max(0, baseline - rss))
jobs = [fill(per_job) for _ in range(int(os.environ["OOMGUARD_CONCURRENCY"]))]  # all held at once
time.sleep(0.5)
"""


@dataclass
class Outcome:
    """Per node, each round's concurrency and how its run ended; the kernel's OOM kills per group."""

    concurrency: dict[str, list[int | None]] = field(default_factory=dict)
    reasons: dict[str, list[str | None]] = field(default_factory=dict)
    kernel_oom_kills: dict[str, int] = field(default_factory=dict)
    learned: dict[str, list[dict[str, Any] | None]] = field(default_factory=dict)


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_") and "proxy" not in k.lower()}
    return env | {"PYTHONPATH": str(REPO / "src"), "HOME": str(home)}


def _in_group(group: Group, argv: list[str]) -> list[str]:
    """*argv* started inside *group* (its PID written to ``cgroup.procs`` before the exec)."""
    return ["/bin/sh", "-c", f'echo $$ > "{group.dir / "cgroup.procs"}" && exec "$@"', "sh", *argv]


def _profiles(work: Path) -> Path:
    path = work / "profiles.json"
    path.write_text(json.dumps({"mini": {"per_job": f"{DECLARED}", "baseline": f"{BASELINE}"}}))
    return path


def observations(url: str) -> int:
    req = urllib.request.Request(f"{url}/api/v1/profiles", headers=VIEWER_H)
    with urllib.request.urlopen(req, timeout=10) as r:
        listed = json.loads(r.read())["profiles"]
    return sum(p["samples"] for p in listed if p["profile"] == "mini")


def enrol(url: str, group: Group, name: str, cls: str, work: Path) -> None:
    """*group* limited to ``LIMIT`` (swap too), and node *name*'s agent's one report from inside it."""
    group.set_limit(LIMIT)
    if (group.dir / "memory.memsw.limit_in_bytes").exists():
        group.write("memory.memsw.limit_in_bytes", str(LIMIT))  # no escape into swap
    common = ["--manager", url, "--token", AGENT, "--node", name, "--node-class", cls]
    agent = [sys.executable, "-m", "oomguard", "agent", *common, "--spool", str(work / name), "--once"]
    sent = subprocess.run(
        _in_group(group, [*agent, "--budget", str(BUDGET)]), env=_env(work), capture_output=True, text=True, timeout=60
    )
    assert sent.returncode == 0, sent.stderr


def run_once(
    url: str, group: Group, name: str, cls: str, work: Path, *, per_job: int, tag: str, may_lower: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One ``run --restart never --profile mini --learned`` of node *name* (class *cls*) inside
    *group*, its jobs really *per_job* bytes each: (its start event, its exit event)."""
    events = work / f"{name}-{tag}.jsonl"
    argv = [
        *(sys.executable, "-m", "oomguard", "run", "--budget", str(BUDGET), "--restart", "never"),
        *("--profiles", str(_profiles(work)), "--profile", "mini", "--learned"),
        *(("--learned-may-lower",) if may_lower else ()),
        *("--manager", url, "--token", AGENT, "--node", name, "--node-class", cls),
        *("--spool", str(work / name), "--events", str(events)),
        *("--", sys.executable, "-c", WORKER, str(per_job), str(BASELINE)),
    ]
    started = subprocess.Popen(_in_group(group, argv), env=_env(work), stderr=subprocess.PIPE)
    _, err = started.communicate(timeout=120)
    seen = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
    start = next((e for e in seen if e["event"] == "start"), None)
    end = next((e for e in seen if e["event"] == "exit"), None)
    said = (name, tag, started.returncode, group.oom_kills(), err.decode(errors="replace")[-2000:])
    assert start is not None and end is not None, said
    return start, end


def run_miniature(url: str, groups: dict[str, Group], work: Path) -> Outcome:
    """The rounds against the manager at *url*, one group per node (limited here)."""
    out = Outcome()
    for name, group in groups.items():
        enrol(url, group, name, NODES[name][0], work)
        out.concurrency[name], out.reasons[name], out.learned[name] = [], [], []
    runs = 0
    for round_no in range(ROUNDS):
        for name, group in groups.items():
            cls, per_job = NODES[name]
            start, end = run_once(url, group, name, cls, work, per_job=per_job, tag=str(round_no))
            out.concurrency[name].append(start["concurrency"])
            out.reasons[name].append(end["reason"])
            out.learned[name].append(start["learned"])
            runs += 1
            wait_for_observations(url, runs, f"{name} round {round_no}'s observation")
    out.kernel_oom_kills = {name: group.oom_kills() for name, group in groups.items()}
    return out


def wait_for_observations(url: str, runs: int, what: str) -> None:
    """Until the manager holds *runs* observations of the profile (each run's, through its spool)."""
    wait_until(lambda: observations(url) >= runs, interval=0.05, what=what)
    assert observations(url) == runs, (what, observations(url), runs)
