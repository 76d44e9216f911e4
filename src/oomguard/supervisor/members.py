"""Who else is in the memory cgroup whose ``oom_kill`` counter ``run`` and ``verify`` read.

A cgroup's counter says how many of its processes the OOM killer ended, not which. When the
caller's children share the group with other processes (the entrypoint's shell, an agent, a
sidecar), a rise of the counter may be someone else's death. What tells them apart is who is
still there: a process the OOM killer ended has left the group. So the caller takes a
snapshot of the group's processes outside its own process tree before a child starts and
another after it ended; each outsider that is gone may have been a victim, and

    OOM kills inside the caller's tree >= counter rise - outsiders gone

(``supervisor/exits.py`` turns that into a verdict). An outsider that joins the group and is
OOM-killed between the two snapshots is not seen: the one case the bound can get wrong, and
the reason ``run --isolate`` (a group holding the worker's tree alone) is exact.

Which processes count, per version:

- v2: the group and every group below it. ``memory.events`` is hierarchical
  (Documentation/admin-guide/cgroup-v2.rst, "memory.events": "all fields in this file are
  hierarchical"), and a group below ours without the memory controller is charged to ours.
  ``cgroup.procs`` lists a process outside the reader's PID namespace as ``0``
  (kernel/cgroup/cgroup.c, ``cgroup_procs_show``: ``task_pid_vnr``); those are counted, unnamed.
- v1: the group itself. ``memory.oom_control``'s ``oom_kill`` counts the group's own
  processes only (Documentation/admin-guide/cgroup-v1/memory.rst, "OOM Control"; measured on
  Linux 6.18: a kill in a child group raised the child's counter, not the parent's).

``supervisor/oomwatch.py`` takes these snapshots before the start, every second while the worker
runs and at each OOM kill the kernel notifies, so that a process that joined the group meanwhile
is seen, and one that left long before a kill is not counted as its victim.

The memory of the processes outside the tree (``outside_memory``) is what a pressure stop or an
OOM kill says about neighbours: their anonymous memory (``RssAnon``, proc(5)), which the group's
working set holds whatever else it counts. Here every group below counts on both versions: usage
is hierarchical (cgroup-v2.rst 5-2-1, "memory.current": "the cgroup and its descendants";
cgroup-v1/memory.rst §6, "Hierarchy support").

Every read goes through a ``Root``; nothing here raises.
"""

from __future__ import annotations

from typing import NamedTuple

from oomguard.probes.counters import read_dying, read_rss_anon
from oomguard.probes.parsers import parse_pid_list
from oomguard.sources.root import Root

MAX_GROUPS = 256  # groups walked below a v2 group; more, and the membership is unknown
MAX_DEPTH = 64  # parent links followed from one process


class Members(NamedTuple):
    """The group's processes outside the caller's tree: (pid, start time) each, and the unnamed."""

    known: frozenset[tuple[int, int]]
    unseen: int


def parse_stat_ids(stat: str) -> tuple[int, int] | None:
    """(parent PID, start time) from ``/proc/PID/stat``; None when the line does not fit.

    proc(5): ``1234 (sh) S 1200 1234 1234 0 -1 4194560 ... 0 20 0 1 0 5187 ...``: field 4 is
    the parent, field 22 the start time in clock ticks after boot (with the PID, it names one
    process even when the PID is reused). *comm* may hold spaces and ")", so the fields are
    counted from the last ")".
    """
    _, sep, rest = stat.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 20:
        return None
    ppid, start = fields[1], fields[19]
    if not (ppid.isascii() and ppid.isdigit() and start.isascii() and start.isdigit()):
        return None
    return int(ppid), int(start)


def _group_dirs(root: Root, top: str, version: int) -> list[str] | None:
    """*top* and, on v2, every group below it; None past ``MAX_GROUPS``."""
    dirs, todo = [top], [top] if version == 2 else []
    while todo:
        here = todo.pop()
        for name in root.names(here):
            sub = f"{here}/{name}"
            if root.exists(sub + "/cgroup.procs"):
                dirs.append(sub)
                todo.append(sub)
        if len(dirs) > MAX_GROUPS:
            return None
    return dirs


def _ids(root: Root, pid: int, cache: dict[int, tuple[int, int] | None]) -> tuple[int, int] | None:
    if pid not in cache:
        text = root.text(f"/proc/{pid}/stat")
        cache[pid] = None if text is None else parse_stat_ids(text)
    return cache[pid]


def _inside(root: Root, pid: int, me: int, cache: dict[int, tuple[int, int] | None]) -> bool | None:
    """Whether *pid* is *me* or descends from it; None when the process is gone."""
    p = pid
    for _ in range(MAX_DEPTH):
        if p == me:
            return True
        ids = _ids(root, p, cache)
        if ids is None:
            return None if p == pid else False
        if ids[0] == 0:  # init, or a process whose parent is outside this PID namespace
            return False
        p = ids[0]
    return False


def outsiders(root: Root, group_dir: str | None, version: int | None, me: int) -> Members | None:
    """The processes of the group outside *me*'s tree, or None when the group cannot be read."""
    if group_dir is None or version not in (1, 2):
        return None
    dirs = _group_dirs(root, group_dir, version)
    if dirs is None:
        return None
    known: set[tuple[int, int]] = set()
    unseen = 0
    cache: dict[int, tuple[int, int] | None] = {}
    for d in dirs:
        text = root.text(d + "/cgroup.procs")
        if text is None:
            if d == group_dir:
                return None
            continue  # a group below removed meanwhile
        unseen += sum(1 for line in text.split("\n") if line.strip() == "0")
        for pid in parse_pid_list(text):
            ids = _ids(root, pid, cache)
            if ids is not None and _inside(root, pid, me, cache) is False:
                known.add((pid, ids[1]))
    return Members(frozenset(known), unseen)


def gone(before: Members | None, after: Members | None) -> int | None:
    """How many outsiders of *before* are not in *after*; None when either is unknown."""
    if before is None or after is None:
        return None
    return len(before.known - after.known) + max(0, before.unseen - after.unseen)


def dying(root: Root, members: Members) -> frozenset[tuple[int, int]]:
    """The members on their way out now: gone, zombies, exiting, or with SIGKILL pending
    (``probes/counters.parse_dying``): where an OOM kill's victim is, just after the kill."""
    return frozenset(m for m in members.known if read_dying(root, m[0]) is True)


class Outside(NamedTuple):
    """The anonymous memory of the group's processes outside the caller's tree, and their PIDs."""

    bytes: int
    pids: tuple[int, ...]


def outside_memory(root: Root, group_dir: str | None, me: int) -> Outside | None:
    """``RssAnon`` summed over the processes of *group_dir* and every group below it that are
    outside *me*'s tree; None when the group cannot be read."""
    if group_dir is None:
        return None
    members = outsiders(root, group_dir, 2, me)  # 2: every group below, whatever the version
    if members is None:
        return None
    sizes = {pid: read_rss_anon(root, pid) for pid, _ in members.known}
    held = {pid: n for pid, n in sizes.items() if n}
    return Outside(sum(held.values()), tuple(sorted(held)))
