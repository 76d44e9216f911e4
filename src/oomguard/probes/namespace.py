"""Cgroup namespaces: where the group is relative to the mount root, ``..`` included.

cgroup_namespaces(7): /proc/[pid]/cgroup and /proc/[pid]/mountinfo are both virtualized by
the reader's cgroup namespace. A path in /proc/self/cgroup is "relative to the reading
process's root directory for the corresponding cgroup hierarchy", and a group outside that
root "will show ../ entries for each ancestor level". The root field (4) of a cgroupfs line
in mountinfo is relative to the same namespace root: the man page's own example shows a
mount made before ``unshare -C`` with root ``/..``, until cgroupfs is mounted again.

The kernel writes both with ``kernfs_path_from_node(node, ns_root)`` (kernel/cgroup/cgroup.c
``cgroup_path_ns`` and ``cgroup_show_path``): one ``/..`` per level from the namespace root up
to the nearest common ancestor, then the names down from there. So a path is *u* ``..``
then names, and its first name is never the name of the namespace root's ancestor it went
up through (else the common ancestor would be lower). Comparing (u_path, names) with
(u_root, names) therefore settles every case:

- same u: the group is under the mount root when the root's names are a prefix of its own
  (``/..`` and ``/..``: the same group; ``/../u`` under ``/..``: the group ``u``);
- u_path > u_root: the group is above or beside the mount root: outside;
- u_path < u_root and the root has names: outside (the root is off the namespace's path);
- u_path < u_root and the root is only ``..``: the group is under the mount root, but
  the (u_root - u_path) names between are the namespace root's own ancestors, which no
  file in /proc shows (``unshare -C`` alone: group ``/``, mount root ``/..``). They are
  found by looking for the group whose ``cgroup.procs`` lists this process.
"""

from __future__ import annotations

from oomguard.probes.parsers import parse_pid_list

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard.sources.root import Root

UNDER = "under"
HIDDEN = "hidden"
OUTSIDE = "outside"
# How many candidate groups the search for a hidden group may look at before it gives up.
MAX_CANDIDATES = 512


def split_ns_path(path: str) -> tuple[int, list[str]] | None:
    """``/../../a/b`` -> (2, ["a", "b"]); None when the path has no kernel shape.

    mkdir(2) refuses the names ``.`` and ``..``, so ``..`` is always a step up; one after a
    name, or a ``.`` anywhere, is not something the kernel writes.
    """
    if not path.startswith("/"):
        return None
    parts = [p for p in path.split("/") if p]
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    names = parts[ups:]
    if any(p in (".", "..") for p in names):
        return None
    return ups, names


def locate(path: str, mount_root: str) -> tuple[str, list[str], int]:
    """Where *path* (/proc/self/cgroup) is relative to *mount_root* (mountinfo field 4).

    (UNDER, names below the mount root, 0), (HIDDEN, names below the unknown ones, how many
    unknown levels) or (OUTSIDE, [], 0).
    """
    p, m = split_ns_path(path), split_ns_path(mount_root)
    if p is None or m is None:
        return OUTSIDE, [], 0
    (up_p, names_p), (up_m, names_m) = p, m
    if up_p == up_m and names_p[: len(names_m)] == names_m:
        return UNDER, names_p[len(names_m) :], 0
    if up_p < up_m and not names_m:
        return HIDDEN, names_p, up_m - up_p
    return OUTSIDE, [], 0


def _subgroups(root: Root, d: str) -> list[str]:
    base = d.rstrip("/")
    return [f"{base}/{n}" for n in root.names(d) if root.exists(f"{base}/{n}/cgroup.procs")]


def _candidates(root: Root, top: str, depth: int) -> list[str] | None:
    """Every group *depth* levels below *top*; None when there are more than MAX_CANDIDATES."""
    frontier = [top]
    for _ in range(depth):
        below: list[str] = []
        for d in frontier:
            below.extend(_subgroups(root, d))
            if len(below) > MAX_CANDIDATES:
                return None
        frontier = below
    return frontier


def find_hidden_group(
    root: Root | None, mount_point: str, depth: int, names: list[str], pid: int | None
) -> tuple[str | None, str]:
    """The directory of a group *depth* unknown levels, then *names*, below *mount_point*.

    The one candidate whose ``cgroup.procs`` lists *pid* (cgroup-v2.rst, "cgroup.procs": "it
    lists the PIDs of all processes which belong to the cgroup"; cgroups(7), the same file in
    v1; the kernel writes each PID as the reader's PID namespace sees it, as /proc/self/status
    does). Every read goes through *root*, so a capture records it and a snapshot replays it.
    Returns (directory, "") or (None, why not).
    """
    if root is None or pid is None:
        return None, "this process's PID is unknown (no Pid in /proc/self/status)"
    groups = _candidates(root, mount_point, depth)
    if groups is None:
        return None, f"there are more than {MAX_CANDIDATES} groups to search"
    tail = "".join("/" + n for n in names)
    found = []
    for g in groups:
        text = root.text(f"{g}{tail}/cgroup.procs")
        if text is not None and pid in parse_pid_list(text):
            found.append(g + tail)
    if len(found) == 1:
        return found[0], ""
    if not found:
        return None, f"no cgroup.procs {depth} level(s) below it lists PID {pid}"
    return None, f"PID {pid} is listed in {len(found)} groups ({', '.join(found[:3])})"
