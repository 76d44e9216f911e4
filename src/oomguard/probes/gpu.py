"""GPUs: what a worker may put on the device. NVML first, ``nvidia-smi`` second, snapshots replay.

No NVIDIA driver (neither ``/dev/nvidiactl`` nor ``/proc/driver/nvidia``) means no GPU,
silently and at no cost. With a driver, the Root answers the query (``sources/gpu.py``: NVML,
then ``nvidia-smi``, with a timeout). Any failure is a warning; the report is still made.

The raw query (all GPUs the driver shows) is kept apart from the visibility filter, so a
snapshot stores the query (``gpus.json``) and a replay filters it with the snapshot's own
``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

from oomguard.report import add_warning
from oomguard.sources.gpu import DEFAULT_TIMEOUT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import GpuDriverSection, GpuEntry, WarningEntry
    from oomguard.sources.root import Root


def skipped_driver() -> GpuDriverSection:
    """The ``gpu_driver`` section before (or without) a GPU probe: status "skipped"."""
    return {"status": "skipped", "source": None, "driver_version": None, "cuda_version": None}


def driver_present(root: Root) -> bool:
    return root.exists("/dev/nvidiactl") or root.exists("/proc/driver/nvidia")


# -- visibility ---------------------------------------------------------------------------------


def _select(gpus: list[GpuEntry], spec: str) -> list[GpuEntry] | None:
    """GPUs named by a CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES value; None means all."""
    s = spec.strip()
    if s.lower() in ("all", ""):
        return None if s.lower() == "all" else []
    if s.lower() in ("none", "void", "-1"):
        return []
    chosen: list[GpuEntry] = []
    for raw in s.split(","):
        item = raw.strip()
        if item.isdigit():
            match = [g for g in gpus if g["index"] == int(item)]
        elif item.startswith("MIG-"):
            match = [g for g in gpus if g.get("mig_mode") == "enabled"]  # the instance's parent
        elif item.startswith("GPU-") or len(item) >= 4:
            match = [g for g in gpus if str(g.get("uuid", "")).lower().startswith(item.lower())]
        else:
            match = []
        if not match:
            break  # CUDA ignores everything after the first entry it cannot resolve
        chosen.extend(g for g in match if g not in chosen)
    return chosen


def _is_row(row: object) -> bool:
    return isinstance(row, dict) and isinstance(row.get("index"), int)


def visible(gpus: list[GpuEntry], env: dict[str, str]) -> list[GpuEntry]:
    out = gpus
    for var in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        if var in env:
            sel = _select(out, env[var])
            out = out if sel is None else sel
    return out


def probe_gpus(
    root: Root,
    env: dict[str, str],
    warnings: list[WarningEntry],
    *,
    enabled: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
) -> tuple[list[GpuEntry], GpuDriverSection]:
    """(visible GPUs, gpu_driver section)."""
    driver = skipped_driver()
    if not enabled:
        return [], driver
    if not driver_present(root):
        driver["status"] = "no-driver"
        return [], driver
    q = root.gpu_query(timeout)
    driver["source"] = q.get("source")
    driver["driver_version"] = q.get("driver_version")
    driver["cuda_version"] = q.get("cuda_version")
    # Rows of the driver's answer (sources/gpu.py) carry GpuEntry's keys; only the index is checked.
    gpus: list[GpuEntry] = [g for g in q.get("gpus", []) if _is_row(g)]
    if q.get("error"):
        add_warning(warnings, "gpu-probe-failed", f"an NVIDIA driver is present but the GPU query failed: {q['error']}")
    driver["status"] = "failed" if q.get("error") and not gpus else "ok"
    return visible(gpus, env), driver
