"""Child process of ``--probe-mlock`` / ``--probe-pinned``: try to page-lock memory, report, exit.

``python -m oomguard.verify._pin mlock NBYTES``: mmap NBYTES and mlock(2) them (ctypes, stdlib).
``python -m oomguard.verify._pin cuda NBYTES``: cudaHostAlloc through libcudart, then cudaFreeHost.
Prints one JSON line ``{"bytes", "ok", "errno", "error", "skipped", "charged"}``. Run in a
child so a failure, or memory that stays locked, never touches the caller.

``charged`` says where the kernel charged the pages while they were held: ``VmLck`` (mlock'ed,
RLIMIT_MEMLOCK's count) and ``RssShmem`` of /proc/self/status (proc(5)), and ``shmem`` of the
child's memory cgroup's memory.stat (``total_shmem`` on v1: cgroup-v1/memory.rst §5.2; ``shmem``
on v2: cgroup-v2.rst), before, while held, and the difference. mlock(2) raises VmLck; CUDA's
cudaHostAlloc was measured elsewhere to raise RssShmem and the cgroup's shmem with VmLck flat
(MakazhanAlpamys/Soup#655): this is how a GPU machine checks it (bench/gpu_check.sh).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import mmap
import os
import sys

CUDART_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")
COUNTERS = ("vm_lck_bytes", "rss_shmem_bytes", "cgroup_shmem_bytes")


def _stat_file() -> str | None:
    """This process's memory cgroup's memory.stat, found as ``oomguard check`` finds the group."""
    from oomguard.probes import probe_system

    d = probe_system(gpu=False)["memory"]["cgroup"]["dir"]
    return None if d is None else d + "/memory.stat"


def _kb(status: str, key: str) -> int | None:
    for line in status.split("\n"):
        name, _, rest = line.partition(":")
        if name == key and rest.split():
            return int(rest.split()[0]) * 1024  # "VmLck:      4096 kB"
    return None


def _sample(stat_file: str | None) -> dict[str, int | None]:
    with open("/proc/self/status", encoding="utf-8") as f:
        status = f.read()
    shmem: int | None = None
    if stat_file is not None:
        try:
            with open(stat_file, encoding="utf-8") as f:
                stat = dict(line.split(" ", 1) for line in f.read().split("\n") if " " in line)
            raw = stat.get("total_shmem", stat.get("shmem"))
            shmem = int(raw) if raw is not None else None
        except (OSError, ValueError):
            shmem = None
    return {
        "vm_lck_bytes": _kb(status, "VmLck"),
        "rss_shmem_bytes": _kb(status, "RssShmem"),
        "cgroup_shmem_bytes": shmem,
    }


def _charged(before: dict[str, int | None], held: dict[str, int | None], stat_file: str | None) -> dict[str, object]:
    diff = {k: None if before[k] is None or held[k] is None else held[k] - before[k] for k in COUNTERS}  # type: ignore[operator]
    return {**diff, "before": before, "held": held, "cgroup_stat_file": stat_file}


def _mlock(n: int, stat_file: str | None) -> dict[str, object]:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    # Private anonymous memory, as malloc's: mmap(-1, n) alone is MAP_SHARED, which is shmem.
    buf = mmap.mmap(-1, max(n, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    before = _sample(stat_file)
    rc = libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(n))
    err = ctypes.get_errno() if rc != 0 else 0
    charged = None
    if rc == 0:
        charged = _charged(before, _sample(stat_file), stat_file)
        libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(n))
    return {
        "bytes": n,
        "ok": rc == 0,
        "errno": err or None,
        "error": os.strerror(err) if err else None,
        "skipped": None,
        "charged": charged,
    }


def _cuda(n: int, stat_file: str | None) -> dict[str, object]:
    lib = None
    for name in CUDART_NAMES:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return {
            "bytes": n,
            "ok": None,
            "errno": None,
            "error": None,
            "skipped": "no libcudart found (" + ", ".join(CUDART_NAMES) + ")",
            "charged": None,
        }
    ptr = ctypes.c_void_p()
    lib.cudaFree(ctypes.c_void_p(0))  # the CUDA context first, so its own memory is not counted as the allocation's
    before = _sample(stat_file)
    rc = lib.cudaHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(n), ctypes.c_uint(0))
    if rc == 0:
        charged = _charged(before, _sample(stat_file), stat_file)
        lib.cudaFreeHost(ptr)
        return {"bytes": n, "ok": True, "errno": None, "error": None, "skipped": None, "charged": charged}
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    message = lib.cudaGetErrorString(rc)
    return {
        "bytes": n,
        "ok": False,
        "errno": None,
        "skipped": None,
        "error": f"cudaHostAlloc returned {rc}: {message.decode() if message else 'unknown error'}",
        "charged": None,
    }


def main(argv: list[str]) -> int:
    kind, n = argv[0], int(argv[1])
    stat_file = _stat_file()
    print(json.dumps(_mlock(n, stat_file) if kind == "mlock" else _cuda(n, stat_file)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
