"""``oomguard run --isolate``: the worker in its own memory cgroup, limited to budget + margin.

An overrun then kills only the worker (the supervisor stays outside the sub-group) and the
sub-group's own ``oom_kill`` counter attributes the kill exactly. The sub-group is
``<group>/oomguard-run-<supervisor pid>`` below the supervisor's memory cgroup *group*:

- v1: possible where the group is writable (root).
- v2: the memory controller must be enabled in the group's ``cgroup.subtree_control``. The root
  group may have it with processes in it; any other group may not ("No Internal Process
  Constraint" below). So when the group is writable, the supervisor is its only process and
  memory is not enabled yet, the supervisor first moves itself into the leaf
  ``<group>/oomguard-supervisor``, then enables ``+memory``: the move systemd prescribes for a
  delegated group (systemd.resource-control(5) ``Delegate=``, https://systemd.io/CGROUP_DELEGATION/).
  Other processes in the group are not moved: they are not the supervisor's (the container's
  init, an agent), and moving them would change their accounting. Isolation is refused instead.
  The root group's ``cgroup.subtree_control`` is never changed: it is the system's.

Elsewhere ``create`` says why in one line and the caller goes on unisolated. Clean-up kills what
is left in the sub-group and removes it (``sources/cgroupfs.drain``); a new supervisor first
removes the ``oomguard-run-*`` groups that supervisors which died left behind (``reap_leftovers``).

Reads go through a ``Root``, writes through a ``CgroupFS``: both over "/" when live, over one
fake tree in tests.
"""

from __future__ import annotations

import errno
import os

from oomguard.policy.budget import default_margin
from oomguard.probes.counters import read_limit, read_peak
from oomguard.sources.cgroupfs import CgroupFS, drain, group_pids
from oomguard.sources.root import Failure, Root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Report

__all__ = ["RUN_PREFIX", "SUPERVISOR_LEAF", "Isolation", "isolation_limit", "reap_leftovers"]

SUPERVISOR_LEAF = "oomguard-supervisor"
RUN_PREFIX = "oomguard-run-"
_HINTS = {
    errno.EACCES: "--isolate needs write access to the cgroup: root, or a group delegated to this user",
    errno.EPERM: "--isolate needs write access to the cgroup: root, or a group delegated to this user",
    errno.EROFS: "the cgroup file system is mounted read-only, as in a container by default",
}


def isolation_limit(report: Report, budget: int) -> int:
    """The isolated group's limit: budget + margin, never above the hard ceiling.

    The margin is the auto budget's safety margin (so the limit is the budget's basis), else
    ``default_margin(budget)``: min(10 GiB, max(256 MiB, 10% of the budget), the budget).
    A limit above the ceiling (``memory.effective_bytes``) would promise what the group above
    cannot give, so the ceiling caps it.
    """
    b = report["budget"]
    auto = b["source"] == "auto" and b["safety_margin_bytes"] is not None
    margin = int(b["safety_margin_bytes"] or 0) if auto else default_margin(budget)
    ceiling = report["memory"]["effective_bytes"]
    return budget + margin if ceiling is None else min(budget + margin, ceiling)


def _isolation_parent(cgroup_dir: str) -> str:
    """The group isolation works in: the supervisor's own, or the one above its leaf once moved."""
    return os.path.dirname(cgroup_dir) if os.path.basename(cgroup_dir) == SUPERVISOR_LEAF else cgroup_dir


def _oserror_reason(exc: OSError) -> str:
    hint = _HINTS.get(exc.errno or 0)
    return f"{exc.strerror}" + (f" ({hint})" if hint else "")


def _has_memory(root: Root, path: str) -> bool:
    """Whether "memory" is listed in the space-separated list file *path*.

    Documentation/admin-guide/cgroup-v2.rst, "Enabling and Disabling": a controller listed in
    a group's ``cgroup.subtree_control`` is enabled in its children; only those listed in its
    ``cgroup.controllers`` can be enabled there.
    """
    text = root.text(path)
    return text is not None and "memory" in text.split()


def _delegate_v2(root: Root, fs: CgroupFS, group: str) -> str | None:
    """Make *group* able to hold a limited child; None when it can, else why not.

    cgroup-v2.rst, "No Internal Process Constraint": "Non-root cgroups can distribute domain
    resources to their children only when they don't have any processes of their own ... The
    root cgroup is exempt from this restriction." ``cgroup.type`` "exists on non-root cgroups"
    (cgroup-v2.rst, "Core Interface Files"), so its absence marks the root.
    """
    if _has_memory(root, group + "/cgroup.subtree_control"):
        return None
    if not root.exists(group + "/cgroup.type"):
        return f"the memory controller is not delegated below {group} (not in cgroup.subtree_control)"
    if not _has_memory(root, group + "/cgroup.controllers"):
        return f"the memory controller is not available in {group} (not in its cgroup.controllers)"
    others = [p for p in group_pids(root, group) if p != os.getpid()]
    if others:
        shown = " ".join(map(str, others[:5])) + (" ..." if len(others) > 5 else "")
        return (
            f"{len(others)} other process(es) share {group} (pid {shown}); memory can be enabled for its "
            "children only when no process sits in it, and oomguard moves only itself"
        )
    return _move_self_and_enable(fs, group)


def _move_self_and_enable(fs: CgroupFS, group: str) -> str | None:
    """The supervisor into ``<group>/oomguard-supervisor``, then +memory for *group*'s children.

    cgroup-v2.rst, "Processes": a process migrates by writing its PID to the destination's
    ``cgroup.procs``. On a refusal the supervisor goes back where it was.
    """
    leaf, pid = os.path.join(group, SUPERVISOR_LEAF), str(os.getpid())
    try:
        fs.mkdir(leaf)
    except FileExistsError:
        pass  # left by an earlier supervisor, or shared with a live one: a leaf either way
    except OSError as exc:
        return f"cannot create {leaf}: {_oserror_reason(exc)}"
    try:
        fs.write_text(leaf + "/cgroup.procs", pid)
    except OSError as exc:
        return f"cannot move the supervisor into {leaf}: {_oserror_reason(exc)}"
    try:
        fs.write_text(group + "/cgroup.subtree_control", "+memory")
    except OSError as exc:
        busy = " (another process joined the group)" if exc.errno == errno.EBUSY else ""
        try:  # back where it was, and the leaf away (both may fail: the leaf is then just left empty)
            fs.write_text(group + "/cgroup.procs", pid)
            fs.rmdir(leaf)
        except OSError:
            pass
        return f"cannot enable memory in {group}/cgroup.subtree_control: {_oserror_reason(exc)}{busy}"
    return None


# -- leftovers of supervisors that died ---------------------------------------------------------


def _run_pid(name: str) -> int | None:
    tail = name[len(RUN_PREFIX) :] if name.startswith(RUN_PREFIX) else ""
    return int(tail) if tail.isascii() and tail.isdigit() else None


def _supervisor_gone(root: Root, pid: int) -> str | None:
    """None while PID *pid* is an oomguard process (or cannot be told); else how it is gone.

    proc(5): ``/proc/PID/cmdline`` holds the arguments, NUL-separated; it is empty for a zombie.
    A process whose arguments name oomguard (``oomguard run``, ``python -m oomguard run``) counts
    as the supervisor; any other process has reused the PID.
    """
    if pid == os.getpid():
        return None
    text = root.read(f"/proc/{pid}/cmdline")
    if isinstance(text, Failure):
        return "is gone" if text.kind == "missing" else None
    if any("oomguard" in os.path.basename(arg) for arg in text.split("\0")):
        return None
    return "is no oomguard supervisor now" if text.strip("\0") else "is gone"


def reap_leftovers(report: Report, root: Root, fs: CgroupFS) -> list[str]:
    """Remove the ``oomguard-run-<pid>`` groups beside this supervisor's whose supervisor is gone.

    What is in them is killed first (``cgroup.kill`` on v2, each PID of ``cgroup.procs`` on v1).
    Returns one line per leftover group found: removed, or why it stays. The PID in a name is
    read in this process's PID namespace.
    """
    cg = report["memory"]["cgroup"]
    if cg["dir"] is None:
        return []
    group = _isolation_parent(cg["dir"])
    notes = []
    for name in root.names(group):
        pid, path = _run_pid(name), os.path.join(group, name)
        gone = None if pid is None else _supervisor_gone(root, pid)
        if gone is None or not root.exists(path + "/cgroup.procs"):
            continue
        found, stays = drain(root, fs, path)
        what = f"leftover {path} (supervisor {pid} {gone}, {found} process(es) in it killed)"
        notes.append(f"removed {what}" if stays is None else f"could not remove {what}: {stays}")
    return notes


class Isolation:
    """The worker's own memory cgroup *path* (hierarchy *version*), read through *root*, written through *fs*."""

    def __init__(self, path: str, version: int, root: Root, fs: CgroupFS) -> None:
        self.path = path
        self.version = version
        self.root = root
        self.fs = fs
        self.limit: int | None = None  # the limit the kernel holds, read back after ``create`` set it

    @classmethod
    def create(
        cls, report: Report, limit_bytes: int, name: str, root: Root, fs: CgroupFS
    ) -> tuple[Isolation | None, str]:
        """A new sub-group *name* of the process's memory cgroup, or (None, why not).

        Leftover ``oomguard-run-*`` groups of dead supervisors beside it are removed first, and
        said after a "; " in the second value.
        """
        cg = report["memory"]["cgroup"]
        if cg["dir"] is None or cg["version"] is None:
            return None, "no memory cgroup is mounted"
        group, version = _isolation_parent(cg["dir"]), cg["version"]
        reaped = "".join("; " + note for note in reap_leftovers(report, root, fs))
        refused = _delegate_v2(root, fs, group) if version == 2 else None
        if refused is not None:
            return None, refused + reaped
        path = os.path.join(group, name)
        try:
            fs.mkdir(path)
        except OSError as exc:
            return None, f"cannot create {path}: {_oserror_reason(exc)}{reaped}"
        iso = cls(path, version, root, fs)
        # v2 memory.max / v1 memory.limit_in_bytes: the hard limit (cgroup-v2.rst 5-2-1, cgroup-v1/memory.rst §3).
        try:
            fs.write_text(iso._file("memory.limit_in_bytes" if version == 1 else "memory.max"), str(limit_bytes))
        except OSError as exc:
            iso.remove()
            return None, f"cannot set the limit of {path}: {_oserror_reason(exc)}{reaped}"
        # Read back: the kernel keeps whole pages (counters.read_limit), and that is the limit.
        held = read_limit(root, path, version)
        iso.limit = limit_bytes if held is None else held
        note = "" if iso.limit == limit_bytes else f" ({limit_bytes} written; the kernel keeps whole pages)"
        return iso, f"worker isolated in {path} with a limit of {iso.limit} bytes{note}{reaped}"

    reap_leftovers = staticmethod(reap_leftovers)

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def place_self(self) -> None:
        """Move the calling process into the group (from the child, before exec): its PID to ``cgroup.procs``."""
        self.fs.write_text(self._file("cgroup.procs"), str(os.getpid()))

    @property
    def oom_source(self) -> str:
        """The group's own OOM-kill counter file (see ``probes/counters.read_oom_kills``)."""
        return self._file("memory.oom_control" if self.version == 1 else "memory.events")

    def peak(self) -> int | None:
        return read_peak(self.root, self.path, self.version)

    def set_high(self, nbytes: int) -> None:
        """v2 ``memory.high``, the throttle limit (``run --guard``, supervisor/guard.py); ``OSError`` if refused.

        cgroup-v2.rst, "memory.high": "Memory usage throttle limit. If a cgroup's usage goes over
        the high boundary, the processes of the cgroup are throttled and put under heavy reclaim
        pressure." v1 has no such file.
        """
        self.fs.write_text(self._file("memory.high"), str(nbytes))

    def kill(self) -> int:
        """SIGKILL every process left in the group (and below it), without waiting; how many there were."""
        return drain(self.root, self.fs, self.path, timeout=0, remove=False)[0]

    def remove(self) -> bool:
        """Kill what is left in the group, then remove it; False when it stays."""
        return drain(self.root, self.fs, self.path)[1] is None
