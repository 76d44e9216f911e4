"""Hostile inputs built for real: snapshot tarballs that are too large, too many, too deep.

``zero_tarball`` writes a ``.tar.gz`` snapshot (a ``proc/meminfo`` so that it is one) with *members*
files of *size* zero bytes each: 2,500 members of 1 MiB compress to a few MB and decompress to
2.5 GB. The zeros are streamed, never held in memory here.
"""

from __future__ import annotations

import io
import tarfile

MiB = 1 << 20


class _Zeros(io.RawIOBase):
    """*size* zero bytes, read in chunks."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def zero_tarball(path: str, members: int, size: int = MiB, *, meminfo: bool = True) -> str:
    """Write the snapshot (gzip level 1: the zeros compress about 1,000 to 1 at any level); *path*."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        if meminfo:
            text = b"MemTotal: 16384 kB\n"
            info = tarfile.TarInfo("proc/meminfo")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
        for i in range(members):
            info = tarfile.TarInfo(f"zero/{i:05d}")
            info.size = size
            tar.addfile(info, io.BufferedReader(_Zeros(size)))
    return path
