"""A Supervisor over a fake cgroup tree, in its own process: the run side tested without real cgroups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.conftest import REPO

MiB = 1024**2
GiB = 1024**3
PY = sys.executable
V2_EVENTS = "sys/fs/cgroup/memory.events"
V1_OOM_CONTROL = "sys/fs/cgroup/memory/memory.oom_control"


def cgroup_tree(
    tmp: Path, version: int = 2, limit: int = 2 * GiB, *, counter: bool = True, extra: Mapping[str, str] | None = None
) -> Path:
    """A minimal tree with one memory cgroup at the mount root, limit *limit*, oom_kill 0; *extra*:
    more files (path under the root -> text), over those."""
    mem_total_kb = 2 * max(limit, GiB) // 1024
    files = {
        "proc/meminfo": f"MemTotal:       {mem_total_kb} kB\nMemAvailable:   {mem_total_kb // 2} kB\n",
        "proc/self/environ": "",
        "proc/self/status": "Name:\tpython3\nCapEff:\t0000000000000000\n",
    }
    if version == 2:
        files |= {
            "proc/self/cgroup": "0::/\n",
            "proc/self/mountinfo": "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
            "sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
            "sys/fs/cgroup/memory.max": f"{limit}\n",
            "sys/fs/cgroup/memory.current": "1048576\n",
            "sys/fs/cgroup/cgroup.procs": "",
        }
        if counter:
            files[V2_EVENTS] = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"
    else:
        files |= {
            "proc/self/cgroup": "4:memory:/\n",
            "proc/self/mountinfo": "35 25 0:30 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n",
            "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{limit}\n",
            "sys/fs/cgroup/memory/memory.usage_in_bytes": "1048576\n",
            "sys/fs/cgroup/memory/cgroup.procs": "",
        }
        if counter:
            files[V1_OOM_CONTROL] = "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"
    for name, text in {**files, **(extra or {})}.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    return tmp


# The supervisor runs in its own process (it installs signal handlers, reaps every child and may
# become a subreaper: none of that belongs in the test runner), reading the fake tree.
SUPERVISE = """
import ctypes, errno, json, sys
from oomguard.policy.plan import Shape
from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import DirRoot
from oomguard.supervisor.events import EventLog
from oomguard.supervisor.restart import RestartPolicy
from oomguard.supervisor.supervise import RunConfig, Supervisor

class DenyingLibc:  # prctl fails with EPERM, as under a seccomp filter
    def prctl(self, *args):
        ctypes.set_errno(errno.EPERM)
        return -1

tree, events, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
policy = RestartPolicy(
    opts.get("restart", "on-failure"),
    backoff_initial=0.01,
    max_restarts=opts.get("max_restarts"),
    healthy_after=opts.get("healthy_after", 600.0),
)
shape = Shape(**opts["shape"]) if opts.get("shape") else None
config = RunConfig(
    opts["command"],
    budget=opts.get("budget"),
    shape=shape,
    policy=policy,
    isolate=opts.get("isolate", False),
    allow_over_limit=opts.get("allow_over_limit", False),
)
libc = DenyingLibc() if opts.get("deny_prctl") else None
sup = Supervisor(config, EventLog(events), root=DirRoot(tree), cgroupfs=CgroupFS(tree), libc=libc)
sys.exit(sup.run())
"""

# A worker that plays the OOM killer: it raises the oom_kill counter in COUNTER and SIGKILLs
# itself, until the counter reaches UPTO; then it exits 0.
OOM_WORKER = (
    "import os, re, signal, sys\n"
    "path, upto = sys.argv[1], int(sys.argv[2])\n"
    "text = open(path).read()\n"
    "n = int(re.search(r'^oom_kill (\\d+)$', text, re.M).group(1))\n"
    "if n >= upto: sys.exit(0)\n"
    "open(path, 'w').write(re.sub(r'^oom_kill \\d+$', f'oom_kill {n + 1}', text, flags=re.M))\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n"
)


def supervise_in_tree(tree: Path, **opts: Any) -> tuple[int, list[dict[str, Any]], str, int]:
    """Run a Supervisor over *tree*: (exit status, events, stderr, the supervisor's pid)."""
    events = tree.parent / f"{tree.name}-events.jsonl"
    events.unlink(missing_ok=True)  # one run's events only
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [PY, "-c", SUPERVISE, str(tree), str(events), json.dumps(opts)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    lines = events.read_text().splitlines() if events.exists() else []
    return proc.returncode, [json.loads(line) for line in lines], err, proc.pid
