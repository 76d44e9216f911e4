"""Parsers for the small text formats of /proc and cgroupfs. Any text in, never an exception out.

Each function quotes the format it reads. Values the kernel would never write
(negative sizes, NaN, absurd ranges) are treated as malformed, not trusted.

Lines end at ``\\n`` only (``text.split("\\n")``): ``str.splitlines()`` also breaks at
``\\r \\v \\f \\x1c-\\x1e \\x85 U+2028 U+2029``, which a process name in /proc/self/status
(prctl(2) PR_SET_NAME) or a cgroup name may hold.
"""

from __future__ import annotations

KB = 1024
LONG_MAX = (1 << 63) - 1
# cgroup v1 shows "no limit" as LONG_MAX rounded down to the page size:
# 9223372036854771712 on 4 KiB pages, 9223372036854710272 on 64 KiB pages
# (arm64, ppc64le). Accept any page size up to 1 MiB rather than hard-coding one.
V1_UNLIMITED_FLOOR = LONG_MAX - (1 << 20)

VALUE = "value"
UNLIMITED = "unlimited"
MALFORMED = "malformed"


def _int(s: str) -> int | None:
    s = s.strip()
    if not s or len(s) > 40 or not (s.isdigit() or (s[0] == "-" and s[1:].isdigit())) or not s.isascii():
        return None
    return int(s)


def parse_limit(text: str) -> tuple[str, int | None]:
    """A cgroup limit file: v2 ``max`` or bytes, v1 bytes with the LONG_MAX sentinel.

    ``memory.max`` / ``memory.high`` / ``memory.swap.max``: ``max\\n`` or ``536870912\\n``.
    ``memory.limit_in_bytes``: ``9223372036854771712\\n`` means unlimited.
    Returns ``("value", n)``, ``("unlimited", None)`` or ``("malformed", None)``.
    """
    s = text.strip()
    if s == "max":
        return UNLIMITED, None
    n = _int(s)
    if n is None:
        return MALFORMED, None
    if n == -1 or n >= V1_UNLIMITED_FLOOR:
        return UNLIMITED, None
    if n < 0:
        return MALFORMED, None
    return VALUE, n


def parse_int_file(text: str) -> int | None:
    """A file holding one non-negative integer (``memory.current``), else None."""
    n = _int(text)
    return n if n is not None and n >= 0 else None


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (``memory.stat``, ``memory.events``, ``memory.oom_control``).

    ``anon 751619276`` / ``oom_kill 3``. Lines that do not fit are skipped.
    """
    out: dict[str, int] = {}
    for line in text.split("\n"):
        parts = line.split()
        if len(parts) == 2:
            n = _int(parts[1])
            if n is not None and n >= 0:
                out[parts[0]] = n
    return out


def parse_pid_list(text: str) -> set[int]:
    """``cgroup.procs``: one PID a line (``1234``); lines that are not a PID are skipped."""
    pids = set()
    for line in text.split("\n"):
        n = _int(line)
        if n is not None and n > 0:
            pids.add(n)
    return pids


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo``: ``MemTotal:       24684092 kB`` -> {"MemTotal": bytes}.

    Values without a unit (``HugePages_Total: 0``) are counts and kept as they are.
    """
    out: dict[str, int] = {}
    for line in text.split("\n"):
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if not parts or len(parts) > 2:
            continue
        n = _int(parts[0])
        if n is None or n < 0:
            continue
        if len(parts) == 2:
            if parts[1] != "kB":
                continue
            n *= KB
        out[key.strip()] = n
    return out


def parse_pressure(text: str) -> dict[str, dict[str, float]]:
    """PSI (``/proc/pressure/memory``, ``memory.pressure``)::

        some avg10=0.00 avg60=0.00 avg300=0.00 total=3508
        full avg10=0.00 avg60=0.00 avg300=0.00 total=3032

    -> {"some": {"avg10": 0.0, ..., "total": 3508.0}, "full": {...}}; avg in %, total in µs.
    """
    out: dict[str, dict[str, float]] = {}
    for line in text.split("\n"):
        parts = line.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        values: dict[str, float] = {}
        for item in parts[1:]:
            key, sep, val = item.partition("=")
            if not sep:
                continue
            try:
                f = float(val)
            except ValueError:
                continue
            if f - f == 0.0 and f >= 0:  # finite (inf - inf and nan - nan are nan), not negative
                values[key] = f
        if values:
            out[parts[0]] = values
    return out


def parse_cpu_max(text: str) -> tuple[str, float | None]:
    """v2 ``cpu.max``: ``max 100000`` (no quota) or ``150000 100000`` (1.5 CPUs)."""
    parts = text.split()
    if len(parts) not in (1, 2):
        return MALFORMED, None
    period = _int(parts[1]) if len(parts) == 2 else 100000
    if period is None or period <= 0:
        return MALFORMED, None
    if parts[0] == "max":
        return UNLIMITED, None
    quota = _int(parts[0])
    if quota is None or quota <= 0:
        return MALFORMED, None
    return VALUE, quota / period


def parse_cfs(quota_text: str, period_text: str) -> tuple[str, float | None]:
    """v1 ``cpu.cfs_quota_us`` (``-1`` = no quota) over ``cpu.cfs_period_us``."""
    quota = _int(quota_text)
    period = _int(period_text)
    if quota is None or period is None or period <= 0:
        return MALFORMED, None
    if quota < 0:
        return UNLIMITED, None
    if quota == 0:
        return MALFORMED, None
    return VALUE, quota / period


MAX_CPU_ID = 1 << 20


def parse_cpu_list(text: str) -> int | None:
    """A CPU list (``0-3,8,10-11``, as in ``cpuset.cpus`` or ``Cpus_allowed_list``): how many CPUs.

    None when empty or malformed (an empty cpuset means "inherit" in v2).
    """
    s = text.strip()
    if not s:
        return None
    count = 0
    for part in s.split(","):
        lo_s, sep, hi_s = part.partition("-")
        lo = _int(lo_s)
        hi = _int(hi_s) if sep else lo
        if lo is None or hi is None or lo < 0 or hi < lo or hi > MAX_CPU_ID:
            return None
        count += hi - lo + 1
    return count


def parse_proc_limits(text: str) -> dict[str, tuple[int | None, int | None]]:
    """``/proc/self/limits``::

        Limit                     Soft Limit           Hard Limit           Units
        Max locked memory         8388608              8388608              bytes

    -> {"Max locked memory": (soft, hard)}; None means ``unlimited``. Columns are
    fixed-width, but names contain spaces, so the numbers are taken from the right.
    """
    out: dict[str, tuple[int | None, int | None]] = {}
    for line in text.split("\n")[1:]:
        parts = line.split()
        if len(parts) < 4:
            continue
        # Units are optional (e.g. "Max processes ... processes" vs "Max nice priority 0 0").
        if _int(parts[-1]) is None and parts[-1] != "unlimited":
            soft_s, hard_s, name_parts = parts[-3], parts[-2], parts[:-3]
        else:
            soft_s, hard_s, name_parts = parts[-2], parts[-1], parts[:-2]
        values: list[int | None] = []
        for v in (soft_s, hard_s):
            if v == "unlimited":
                values.append(None)
            else:
                n = _int(v)
                if n is None or n < 0:
                    break
                values.append(n)
        if len(values) == 2 and name_parts:
            out[" ".join(name_parts)] = (values[0], values[1])
    return out


def parse_status(text: str) -> dict[str, str]:
    """``/proc/self/status``: ``Name:\\tvalue`` lines -> {"Name": "value"}."""
    out: dict[str, str] = {}
    for line in text.split("\n"):
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def status_kb(status: dict[str, str], key: str) -> int | None:
    """A ``VmLck:     0 kB`` style field of ``/proc/self/status``, in bytes."""
    parts = status.get(key, "").split()
    if len(parts) != 2 or parts[1] != "kB":
        return None
    n = _int(parts[0])
    return n * KB if n is not None and n >= 0 else None


CAP_IPC_LOCK = 14


def has_capability(status: dict[str, str], bit: int, field: str = "CapEff") -> bool | None:
    """Whether capability *bit* is set in the hex mask ``CapEff: 000001ffffffffff``."""
    mask = status.get(field)
    if mask is None:
        return None
    try:
        return bool((int(mask, 16) >> bit) & 1) if mask and len(mask) <= 32 else None
    except ValueError:
        return None


# The working set: usage - inactive_file (the kubelet's definition, kubernetes#43916), never below
# 0. Which memory.stat key is inactive_file, by cgroup version: v2 ``inactive_file`` counts the group
# and its descendants (cgroup-v2.rst, "memory.stat": "Amount of memory ... on the internal memory
# management lists used by the page reclaim algorithm"); v1 ``total_inactive_file`` is the
# hierarchical one (cgroup-v1/memory.rst 5.2: "total_<counter>: # hierarchical version of
# <counter>"), else v1's own ``inactive_file``. shmem (tmpfs, memfd, CUDA's pinned pages) sits on
# the anon lists, never in inactive_file, so it stays in the working set. The one definition: the
# probe (probes/memory.py, memcg.py), the run side (counters.py) and the watch use these two.
INACTIVE_FILE_KEYS = {1: ("total_inactive_file", "inactive_file"), 2: ("inactive_file",)}


def inactive_file(stat: dict[str, int], version: int) -> int | None:
    """The inactive file cache of a parsed ``memory.stat`` (``INACTIVE_FILE_KEYS``); None without one."""
    return next((stat[k] for k in INACTIVE_FILE_KEYS.get(version, ()) if k in stat), None)


def working_set(usage: int | None, inactive: int | None) -> int | None:
    """usage - inactive_file, never below 0 (an unknown inactive_file counts 0); None without usage."""
    return None if usage is None else max(0, usage - (inactive or 0))
