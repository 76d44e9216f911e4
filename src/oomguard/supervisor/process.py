"""Process primitives of ``run``: prctl(2) for "no orphans", and killing the orphans that escaped.

``oomguard run`` promises that no worker outlives it and no process it started is left behind.
Two prctl(2) options carry that promise (man 2 prctl):

- ``PR_SET_CHILD_SUBREAPER`` (36, Linux >= 3.4), on the supervisor: orphaned descendants of
  the worker are re-parented to the supervisor, which can then kill and reap them.
- ``PR_SET_PDEATHSIG`` (1, Linux >= 2.1.57), in the worker before exec: the worker gets SIGKILL
  when the supervisor dies.

Either can fail (a seccomp filter, a libc without ``prctl``): the promise is then void, and the
supervisor says so in one line on stderr, once, naming the option and the errno.
``prepare_child`` is what the worker runs between fork and exec: PR_SET_PDEATHSIG, then the
move into its ``--isolate`` group.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
from typing import Any

from oomguard.probes.counters import child_pids
from oomguard.sources.root import Root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard.supervisor.isolate import Isolation

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PRCTL_NAMES = {PR_SET_PDEATHSIG: "PR_SET_PDEATHSIG", PR_SET_CHILD_SUBREAPER: "PR_SET_CHILD_SUBREAPER"}
PRCTL_VOIDS = {
    PR_SET_PDEATHSIG: "the worker survives if the supervisor dies",
    PR_SET_CHILD_SUBREAPER: "processes the worker leaves behind are not reaped",
}


def load_libc() -> Any:
    """The C library, with errno kept for ``ctypes.get_errno``; None where it cannot be loaded."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def set_prctl(option: int, value: int, libc: Any) -> int:
    """``prctl(option, value, 0, 0, 0)``: 0 when it worked, else the errno (ENOSYS: no prctl at all)."""
    fn = getattr(libc, "prctl", None)
    if fn is None:
        return errno.ENOSYS
    ctypes.set_errno(0)
    if fn(option, value, 0, 0, 0) == 0:
        return 0
    return ctypes.get_errno() or errno.EINVAL


def prctl_failure(option: int, err: int) -> str:
    """The one stderr line for a failed prctl: which option, which errno, what is lost."""
    name = PRCTL_NAMES.get(option, f"option {option}")
    code = errno.errorcode.get(err, str(err))
    void = PRCTL_VOIDS.get(option, "the no-orphans promise is void")
    return f"oomguard run: prctl({name}) failed: {code} ({os.strerror(err)}); {void}\n"


def kill_orphans(root: Root, parent: int) -> int:
    """SIGKILL every process whose parent is *parent* (orphans that left the worker's group); how many."""
    killed = 0
    for pid in child_pids(root, parent):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def prepare_child(libc: Any, tell: bool, isolation: Isolation | None) -> None:
    """In the worker after fork, before exec: SIGKILL on the supervisor's death, then the group.

    Only a raw write(2) is safe here; *tell* False keeps a failed prctl quiet after the first start.
    """
    err = set_prctl(PR_SET_PDEATHSIG, signal.SIGKILL, libc)
    if err and tell:
        os.write(2, prctl_failure(PR_SET_PDEATHSIG, err).encode())
    if isolation is not None:
        try:
            isolation.place_self()
        except OSError as exc:  # the worker runs on, outside the group: said, not a traceback
            os.write(2, f"oomguard run: cannot move the worker into {isolation.path}: {exc.strerror}\n".encode())
