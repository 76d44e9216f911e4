"""Counters the run side reads while a worker runs (``run``, ``verify``, ``--isolate``), through a Root.

The probe reads each file once to build a report; ``run`` and ``verify`` read a few of them
again around a child's life: the OOM-kill counter before and after, usage and peaks, and the
process table to find orphans. Every function takes a ``Root`` (a fake tree in tests), never
raises, and answers None (or nothing) for a file that cannot be read or parsed.
"""

from __future__ import annotations

from oomguard.probes.parsers import parse_flat_keyed, parse_int_file, parse_status, status_kb
from oomguard.sources.root import Failure, Root


def _text(root: Root, path: str) -> str | None:
    text = root.read(path)
    return None if isinstance(text, Failure) else text


def read_oom_kills(root: Root, source: str | None) -> int | None:
    """The ``oom_kill`` counter of *source* (a report's ``memory.oom.source``).

    v2 ``memory.events`` (Documentation/admin-guide/cgroup-v2.rst, "oom_kill: the number of
    processes belonging to this cgroup killed by any kind of OOM killer") and v1
    ``memory.oom_control`` (cgroup-v1/memory.rst, ``oom_kill`` since Linux 4.13) are both
    flat-keyed: ``oom_kill 3``.
    """
    text = None if source is None else _text(root, source)
    return None if text is None else parse_flat_keyed(text).get("oom_kill")


def read_usage(root: Root, cgroup_dir: str | None, version: int | None) -> int | None:
    """Current usage of a memory cgroup: v2 ``memory.current``, v1 ``memory.usage_in_bytes``."""
    if cgroup_dir is None or version is None:
        return None
    text = _text(root, cgroup_dir + ("/memory.current" if version == 2 else "/memory.usage_in_bytes"))
    return None if text is None else parse_int_file(text)


def read_peak(root: Root, cgroup_dir: str, version: int) -> int | None:
    """Peak usage of a memory cgroup since it was made.

    v2 ``memory.peak`` (cgroup-v2.rst; Linux >= 5.19, absent before: None), v1
    ``memory.max_usage_in_bytes`` (cgroup-v1/memory.rst, "max memory usage recorded").
    """
    text = _text(root, cgroup_dir + ("/memory.peak" if version == 2 else "/memory.max_usage_in_bytes"))
    return None if text is None else parse_int_file(text)


def read_peak_rss(root: Root, pid: int) -> int | None:
    """``VmHWM`` ("peak resident set size", proc(5)) of ``/proc/PID/status``, in bytes."""
    text = _text(root, f"/proc/{pid}/status")
    return None if text is None else status_kb(parse_status(text), "VmHWM")


def parse_ppid(stat: str) -> int | None:
    """The parent PID in ``/proc/PID/stat``: field 4, after ``pid (comm) state``.

    proc(5): ``1234 (sh) S 1200 ...``; *comm* may hold spaces and ")", so the fields are
    counted from the last ")".
    """
    _, sep, rest = stat.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 2 or not (fields[1].isascii() and fields[1].isdigit()):
        return None
    return int(fields[1])


def child_pids(root: Root, parent: int) -> list[int]:
    """PIDs whose parent is *parent*, from the process table (``/proc/[0-9]*/stat``)."""
    names = root.listdir("/proc")
    if isinstance(names, Failure):
        return []
    children = []
    for name in names:
        if not name.isdigit():
            continue
        stat = _text(root, f"/proc/{name}/stat")
        if stat is not None and parse_ppid(stat) == parent:
            children.append(int(name))
    return children
