"""The public entry point of the probe: ``probe()`` builds a full report, budget included."""

from __future__ import annotations

from .budget import resolve_budget
from .probes import probe_system
from .root import Root, open_root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._types import Report


def probe(
    root: Root | str | None = None,
    budget: str | None = None,
    margin: str | None = None,
    *,
    gpu: bool = True,
    gpu_timeout: float = 5.0,
) -> Report:
    """Probe the live system (or a snapshot: a ``Root``, directory or tarball) into a report.

    *budget* and *margin* take the same text as ``--budget``/``--margin``; without
    *budget*, ``OOMGUARD_BUDGET`` from the probed environment applies, then auto.
    *gpu* False skips the GPU probe; *gpu_timeout* bounds NVML and nvidia-smi (seconds).
    Raises ``UsageError`` for invalid sizes and ``SnapshotError`` for a bad snapshot.
    """
    r = root if isinstance(root, Root) else open_root(root)
    env = r.environ()
    report = probe_system(r, env, gpu=gpu, gpu_timeout=gpu_timeout)
    resolve_budget(report, budget=budget, margin=margin, env=env)
    return report
