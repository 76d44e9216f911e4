"""Snapshots: a recording view of the live system, and the tarball it is written to.

The probe runs once against a recording view of the live system; every file it read,
every marker it found, every link it read (as a file holding the link's text: the namespace
links ``/proc/self/ns/pid`` and ``/proc/self/ns/cgroup``) and the environment variables the
probe reads are written as a tree rooted at "/" into a .tar.gz. ``check --root FILE`` then
computes what the node computed.

The environment is an allow-list: a snapshot is meant for bug reports, and a process's
environment holds tokens (``OOMGUARD_AGENT_TOKEN``, ``VAST_API_KEY``, cloud keys). ``ENV_KEEP``
is every variable the probe and the budget read (tests/sources/test_snapshot.py checks this against a
probe run), with its value; ``ENV_NAME_ONLY_PREFIXES`` are variables whose presence alone the
probe reads (any ``VAST_*`` variable means vast.ai, probes/container.py): their names are kept
with empty values.
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
        "OOMGUARD_BUDGET",  # policy/budget.py: the budget when no --budget is given
        "container",  # probes/container.py: set by podman, systemd-nspawn, LXC
        "KUBERNETES_SERVICE_HOST",  # probes/container.py: set in every Kubernetes pod
        "CONTAINER_ID",  # probes/container.py: a provider hint (vast.ai sets it)
        "VAST_CONTAINERLABEL",  # probes/container.py: the vast.ai instance label
        "CUDA_VISIBLE_DEVICES",  # probes/gpu.py: which GPUs a CUDA process sees
        "CUDA_DEVICE_ORDER",  # probes/gpu.py: how CUDA numbers them
        "NVIDIA_VISIBLE_DEVICES",  # probes/gpu.py: which GPUs the container runtime passed in
    }
)
ENV_NAME_ONLY_PREFIXES = ("VAST_",)
MANIFEST = "oomguard-snapshot.txt"


def keep_env(env: dict[str, str]) -> dict[str, str]:
    """The part of *env* a snapshot carries: ``ENV_KEEP`` with values, ``ENV_NAME_ONLY_PREFIXES``
    names with empty values, nothing else."""
    kept = {k: "" for k in env if k.startswith(ENV_NAME_ONLY_PREFIXES)}
    kept.update({k: v for k, v in env.items() if k in ENV_KEEP})
    return kept


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

    def readlink(self, path: str) -> str | Failure:
        text = self.inner.readlink(path)
        if isinstance(text, str):
            self.files[path] = text + "\n"  # a snapshot keeps a link as a file holding its text
        return text

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
