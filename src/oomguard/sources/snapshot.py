"""Snapshots: a recording view of the live system, and the tarball it is written to.

The probe runs once against a recording view of the live system; every file it read,
every marker it found and the environment variables oomguard uses are written as a tree
rooted at "/" into a .tar.gz. ``check --root FILE`` then computes what the node computed.
Only the variables in ``ENV_KEEP`` (and ``OOMGUARD_*``, ``VAST_*``) are kept: a snapshot
meant for a bug report must not carry tokens from the environment.
"""

from __future__ import annotations

import io
import os
import tarfile
import time

from oomguard._version import __version__
from oomguard.errors import UsageError
from oomguard.sources.root import Failure, LiveRoot, Root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ENV_KEEP = frozenset(
    {
        "container",
        "KUBERNETES_SERVICE_HOST",
        "KUBERNETES_SERVICE_PORT",
        "CONTAINER_ID",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
    }
)
ENV_KEEP_PREFIXES = ("OOMGUARD_", "VAST_")
MANIFEST = "oomguard-snapshot.txt"


def keep_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}


class RecordingRoot(Root):
    """The live system, remembering every path read or found."""

    live = True

    def __init__(self, inner: Root | None = None) -> None:
        self.inner = inner or LiveRoot()
        self.files: dict[str, str] = {}
        self.markers: set[str] = set()
        self.gpus: dict[str, Any] | None = None  # the GPU query, when a driver was found

    def read(self, path: str) -> str | Failure:
        text = self.inner.read(path)
        if isinstance(text, str):
            self.files[path] = text
        return text

    def exists(self, path: str) -> bool:
        found = self.inner.exists(path)
        if found:
            self.markers.add(path)
        return found

    def listdir(self, path: str) -> list[str] | Failure:
        return self.inner.listdir(path)

    def environ(self) -> dict[str, str]:
        return self.inner.environ()

    def gpu_query(self, timeout: float) -> dict[str, Any]:
        self.gpus = self.inner.gpu_query(timeout)
        return self.gpus


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.size = len(data)
    info.mtime = int(mtime)
    info.mode = 0o444
    tar.addfile(info, io.BytesIO(data))


def write_snapshot(rec: RecordingRoot, path: str) -> int:
    """Write what *rec* read as a .tar.gz at *path* (a temp file, then renamed); the file count."""
    now = time.time()
    files = dict(rec.files)
    env = keep_env(rec.environ())
    files["/proc/self/environ"] = "".join(f"{k}={v}\0" for k, v in sorted(env.items()))
    for marker in rec.markers:
        if marker not in files:
            text = rec.inner.read(marker)
            files[marker] = text if isinstance(text, str) else ""
    if rec.gpus is not None:
        import json

        files["/gpus.json"] = json.dumps(rec.gpus, indent=2) + "\n"
    files["/" + MANIFEST] = (
        f"oomguard {__version__}\ncaptured {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now))}\n"
    )
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for name in sorted(files):
                _add(tar, name, files[name].encode("utf-8", "surrogateescape"), now)
        os.replace(tmp, path)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise UsageError(f"capture: cannot write {path}: {exc.strerror or exc}") from None
    return len(files)
