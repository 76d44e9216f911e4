"""Small snapshot trees built by hand for the probe (a fixture corpus case is a folder instead)."""

from __future__ import annotations

from pathlib import Path


def make_tree(tmp: Path, limit: str = "536870912", env: str = "", mem_total_kb: int = 16318412) -> Path:
    """A minimal Docker-on-v2 tree (private cgroupns) with memory.max = *limit*."""
    files = {
        "proc/self/cgroup": "0::/\n",
        "proc/self/mountinfo": "1310 1301 0:27 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw,nsdelegate\n",
        "proc/meminfo": f"MemTotal:       {mem_total_kb} kB\nMemAvailable:   {mem_total_kb // 2} kB\n",
        "proc/self/environ": env,
        "proc/self/status": "Name:\tpython3\nCapEff:\t00000000a80425fb\nVmLck:\t       0 kB\n",
        "proc/self/limits": "Limit  Soft Limit  Hard Limit  Units\nMax locked memory  unlimited  unlimited  bytes\n",
        "sys/fs/cgroup/memory.max": limit + "\n",
        "sys/fs/cgroup/cgroup.controllers": "cpu memory pids\n",
        ".dockerenv": "",
    }
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    return tmp
