"""Counters the run side reads while a worker runs (``run``, ``verify``, ``--isolate``), through a Root.

The probe reads each file once to build a report; ``run`` and ``verify`` read a few of them
again around a child's life: the OOM-kill counter before and after, usage and peaks, and the
process table to find orphans; ``run --guard`` samples the worker's group every 100 ms
(``read_sample``). Every function takes a ``Root`` (a fake tree in tests), never raises, and
answers None (or nothing) for a file that cannot be read or parsed.
"""

from __future__ import annotations

from typing import NamedTuple

from oomguard.probes.parsers import (
    VALUE,
    inactive_file,
    parse_flat_keyed,
    parse_int_file,
    parse_limit,
    parse_pid_list,
    parse_pressure,
    parse_status,
    status_kb,
    working_set,
)
from oomguard.sources.root import Failure, Root

SIGKILL_MASK = 1 << (9 - 1)  # signal 9 in a SigPnd/ShdPnd mask: bit N-1 for signal N (signal(7), proc(5))
PF_EXITING = 0x4  # /proc/PID/stat flags: "getting shut down" (include/linux/sched.h)


def read_oom_kills(root: Root, source: str | None) -> int | None:
    """The ``oom_kill`` counter of *source* (a report's ``memory.oom.source``).

    v2 ``memory.events`` (Documentation/admin-guide/cgroup-v2.rst, "oom_kill: the number of
    processes belonging to this cgroup killed by any kind of OOM killer") and v1
    ``memory.oom_control`` (cgroup-v1/memory.rst, ``oom_kill`` since Linux 4.13) are both
    flat-keyed: ``oom_kill 3``.
    """
    text = None if source is None else root.text(source)
    return None if text is None else parse_flat_keyed(text).get("oom_kill")


def read_usage(root: Root, cgroup_dir: str | None, version: int | None) -> int | None:
    """Current usage of a memory cgroup: v2 ``memory.current``, v1 ``memory.usage_in_bytes``."""
    if cgroup_dir is None or version is None:
        return None
    text = root.text(cgroup_dir + ("/memory.current" if version == 2 else "/memory.usage_in_bytes"))
    return None if text is None else parse_int_file(text)


def read_peak(root: Root, cgroup_dir: str, version: int) -> int | None:
    """Peak usage of a memory cgroup since it was made.

    v2 ``memory.peak`` (cgroup-v2.rst; Linux >= 5.19, absent before: None), v1
    ``memory.max_usage_in_bytes`` (cgroup-v1/memory.rst, "max memory usage recorded").
    """
    text = root.text(cgroup_dir + ("/memory.peak" if version == 2 else "/memory.max_usage_in_bytes"))
    return None if text is None else parse_int_file(text)


def read_limit(root: Root, cgroup_dir: str, version: int) -> int | None:
    """The hard limit the kernel holds for a group: v2 ``memory.max``, v1 ``memory.limit_in_bytes``.

    What is read back, not what was written: the kernel keeps whole pages. cgroup-v1/memory.rst
    §3 ("User Interface"): "A successful write to this file does not guarantee a successful
    setting of this limit to the value written into the file ... The user is required to re-read
    this file after a write to guarantee the value committed by the kernel"; cgroup-v2.rst 5-2-1
    ("Memory Interface Files"): "If a value which is not aligned to PAGE_SIZE is written, the value
    may be rounded ... when read back" (measured on Linux 6.18 v1: rounded down). None when
    unlimited or unreadable.
    """
    text = root.text(cgroup_dir + ("/memory.max" if version == 2 else "/memory.limit_in_bytes"))
    if text is None:
        return None
    status, n = parse_limit(text)
    return n if status == VALUE else None


def read_peak_rss(root: Root, pid: int) -> int | None:
    """``VmHWM`` ("peak resident set size", proc(5)) of ``/proc/PID/status``, in bytes."""
    text = root.text(f"/proc/{pid}/status")
    return None if text is None else status_kb(parse_status(text), "VmHWM")


def read_rss_anon(root: Root, pid: int) -> int | None:
    """``RssAnon`` ("size of resident anonymous memory", proc(5)) of ``/proc/PID/status``, in bytes.

    Anonymous memory is never inactive file cache, so a process's ``RssAnon`` is part of its
    group's working set (usage - inactive_file) however the kernel counts the rest.
    """
    text = root.text(f"/proc/{pid}/status")
    return None if text is None else status_kb(parse_status(text), "RssAnon")


def read_children(root: Root, pid: int) -> list[int]:
    """The children of *pid*: ``/proc/PID/task/TID/children`` of each thread (proc(5), Linux >= 3.5,
    "a space-separated list of child tasks"); [] where the file is missing."""
    children: list[int] = []
    for tid in root.names(f"/proc/{pid}/task"):
        text = root.text(f"/proc/{pid}/task/{tid}/children")
        children += sorted(parse_pid_list(text.replace(" ", "\n"))) if text is not None else []
    return children


def parse_dying(stat: str, status: str | None) -> bool | None:
    """Whether a process is on its way out: a zombie (``Z``, ``X``), exiting (``PF_EXITING`` in the
    flags), or with SIGKILL pending; None when *stat* does not fit.

    proc(5): ``/proc/PID/stat`` field 3 is the state, field 9 the kernel flags (counted from the last
    ")", as *comm* may hold one); ``/proc/PID/status`` ``SigPnd``/``ShdPnd``: "mask (expressed in
    hexadecimal) of signals pending for thread and for process as a whole". The OOM killer sends
    SIGKILL before it counts the kill (mm/oom_kill.c, ``__oom_kill_process``: ``do_send_sig_info``,
    then ``memcg_memory_event_mm(mm, MEMCG_OOM_KILL)``), so once the counter shows a kill, its
    victim is one of the processes this says True of, or one already gone.
    """
    _, sep, rest = stat.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 7 or not fields[6].isdigit():
        return None
    if fields[0] in ("Z", "X", "x") or int(fields[6]) & PF_EXITING:
        return True
    keyed = parse_status(status) if status is not None else {}
    for key in ("SigPnd", "ShdPnd"):
        mask = keyed.get(key, "")
        if mask and all(c in "0123456789abcdefABCDEF" for c in mask) and int(mask, 16) & SIGKILL_MASK:
            return True
    return False


def read_dying(root: Root, pid: int) -> bool | None:
    """``parse_dying`` of ``/proc/PID``: True also when the process is gone; None when unreadable."""
    stat = root.read(f"/proc/{pid}/stat")
    if isinstance(stat, Failure):
        return True if stat.kind == "missing" else None
    return parse_dying(stat, root.text(f"/proc/{pid}/status"))


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
    children = []
    for name in root.names("/proc"):
        if not name.isdigit():
            continue
        stat = root.text(f"/proc/{name}/stat")
        if stat is not None and parse_ppid(stat) == parent:
            children.append(int(name))
    return children


class MemorySample(NamedTuple):
    """One look at a memory cgroup (``run --guard``); None where a file cannot be read.

    *events* is v2 ``memory.events`` ({} on v1 and where unreadable); *stall_us* is the PSI
    ``full`` total of ``memory.pressure`` in microseconds (v2 with PSI only).
    """

    usage: int | None
    inactive_file: int | None
    events: dict[str, int]
    stall_us: float | None

    @property
    def working_set(self) -> int | None:
        """usage - inactive_file, as the probe computes it (kubelet's working set); None without usage."""
        return working_set(self.usage, self.inactive_file)


def _inactive_file(stat: str | None, version: int) -> int | None:
    """inactive_file of a ``memory.stat`` text (``parsers.INACTIVE_FILE_KEYS``)."""
    return None if stat is None else inactive_file(parse_flat_keyed(stat), version)


def read_working_set(root: Root, cgroup_dir: str, version: int) -> int | None:
    """usage - inactive_file of the memory cgroup *cgroup_dir* now (``parsers.working_set``); None
    when the usage cannot be read. Two files only: what ``MemoryBudget(watch=True)`` samples."""
    stat = root.text(cgroup_dir + "/memory.stat")
    return working_set(read_usage(root, cgroup_dir, version), _inactive_file(stat, version))


def read_sample(root: Root, cgroup_dir: str, version: int) -> MemorySample:
    """The group's usage, inactive file cache, events and memory stall time, read now.

    v2 (Documentation/admin-guide/cgroup-v2.rst, "Memory Interface Files"): ``memory.current``,
    ``memory.stat``, ``memory.events`` (``high``: "The number of times processes of the cgroup
    are throttled and routed to perform direct memory reclaim because the high memory
    boundary was exceeded") and ``memory.pressure`` (Documentation/accounting/psi.rst:
    ``full avg10=0.00 avg60=0.00 avg300=0.00 total=0``, total in microseconds).
    v1 (cgroup-v1/memory.rst): ``memory.usage_in_bytes`` and ``memory.stat``; no events, no PSI.
    """
    stat = root.text(cgroup_dir + "/memory.stat")
    if version != 2:
        return MemorySample(read_usage(root, cgroup_dir, 1), _inactive_file(stat, 1), {}, None)
    events = root.text(cgroup_dir + "/memory.events")
    psi = root.text(cgroup_dir + "/memory.pressure")
    full = parse_pressure(psi).get("full", {}) if psi is not None else {}
    return MemorySample(
        read_usage(root, cgroup_dir, 2),
        _inactive_file(stat, 2),
        parse_flat_keyed(events) if events is not None else {},
        full.get("total"),
    )
