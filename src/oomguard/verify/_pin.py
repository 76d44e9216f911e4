"""Child process of ``--probe-mlock`` / ``--probe-pinned``: try to page-lock memory, report, exit.

``python -m oomguard.verify._pin mlock NBYTES``: mmap NBYTES and mlock(2) them (ctypes, stdlib).
``python -m oomguard.verify._pin cuda NBYTES``: cudaHostAlloc through libcudart, then cudaFreeHost.
Prints one JSON line ``{"bytes", "ok", "errno", "error", "skipped"}``. Run in a child so a
failure, or memory that stays locked, never touches the caller.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import mmap
import os
import sys

CUDART_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")


def _mlock(n: int) -> dict[str, object]:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    buf = mmap.mmap(-1, max(n, 1))
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    rc = libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(n))
    err = ctypes.get_errno() if rc != 0 else 0
    if rc == 0:
        libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(n))
    return {
        "bytes": n,
        "ok": rc == 0,
        "errno": err or None,
        "error": os.strerror(err) if err else None,
        "skipped": None,
    }


def _cuda(n: int) -> dict[str, object]:
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
        }
    ptr = ctypes.c_void_p()
    rc = lib.cudaHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(n), ctypes.c_uint(0))
    if rc == 0:
        lib.cudaFreeHost(ptr)
        return {"bytes": n, "ok": True, "errno": None, "error": None, "skipped": None}
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    message = lib.cudaGetErrorString(rc)
    return {
        "bytes": n,
        "ok": False,
        "errno": None,
        "skipped": None,
        "error": f"cudaHostAlloc returned {rc}: {message.decode() if message else 'unknown error'}",
    }


def main(argv: list[str]) -> int:
    kind, n = argv[0], int(argv[1])
    print(json.dumps(_mlock(n) if kind == "mlock" else _cuda(n)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
