"""GPUs: what a worker may put on the device. NVML first, ``nvidia-smi`` second, snapshots replay.

No NVIDIA driver (neither ``/dev/nvidiactl`` nor ``/proc/driver/nvidia``) means no GPU,
silently and at no cost. With a driver, the Root answers the query (``sources/gpu.py``: NVML,
then ``nvidia-smi``, with a timeout). Any failure is a warning; the report is still made.

The raw query (all GPUs the driver shows) is kept apart from the visibility filter, so a
snapshot stores the query (``gpus.json``) and a replay filters it with the snapshot's own
``CUDA_VISIBLE_DEVICES``. ``NVIDIA_VISIBLE_DEVICES`` is reported, never applied (below).
"""

from __future__ import annotations

from oomguard.report import add_warning
from oomguard.sources.gpu import DEFAULT_TIMEOUT
from oomguard.units import format_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import GpuDriverSection, GpuEntry, GpuVisibility, MigDeviceEntry, WarningEntry
    from oomguard.sources.root import Root


def _visibility(env: dict[str, str]) -> GpuVisibility:
    return {
        "nvidia_visible_devices": env.get("NVIDIA_VISIBLE_DEVICES"),
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "cuda_device_order": env.get("CUDA_DEVICE_ORDER"),
    }


def skipped_driver(env: dict[str, str] | None = None) -> GpuDriverSection:
    """The ``gpu_driver`` section before (or without) a GPU probe: status "skipped"."""
    return {
        "status": "skipped",
        "source": None,
        "driver_version": None,
        "cuda_version": None,
        "visibility": _visibility(env or {}),
    }


def driver_present(root: Root) -> bool:
    return root.exists("/dev/nvidiactl") or root.exists("/proc/driver/nvidia")


# -- the driver's rows (a snapshot's gpus.json may be old or hostile: parsers never raise) -----------


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _mig_entry(raw: object) -> MigDeviceEntry | None:
    if not isinstance(raw, dict) or _int(raw.get("index")) is None or _int(raw.get("memory_total_bytes")) is None:
        return None
    if not isinstance(raw.get("uuid"), str):
        return None
    return {
        "index": raw["index"],
        "uuid": raw["uuid"],
        "name": _str(raw.get("name")),
        "gpu_instance_id": _int(raw.get("gpu_instance_id")),
        "compute_instance_id": _int(raw.get("compute_instance_id")),
        "memory_total_bytes": raw["memory_total_bytes"],
        "memory_used_bytes": _int(raw.get("memory_used_bytes")),
        "memory_free_bytes": _int(raw.get("memory_free_bytes")),
        "memory_reserved_bytes": _int(raw.get("memory_reserved_bytes")),
    }


def _mig_devices(raw: dict[str, object], mig_mode: str | None) -> list[MigDeviceEntry] | None:
    """A row's MIG devices; absent (an older gpus.json, nvidia-smi): none, or unknown in MIG mode."""
    migs = raw.get("mig_devices", None if mig_mode == "enabled" else [])
    if not isinstance(migs, list):
        return None
    entries = [_mig_entry(m) for m in migs]
    return [m for m in entries if m is not None] if None not in entries else None


def _row(raw: object) -> GpuEntry | None:
    """A GPU row of the driver's answer (sources/gpu.py, or a snapshot's gpus.json); None if it is not one."""
    if not isinstance(raw, dict) or _int(raw.get("index")) is None or _int(raw.get("memory_total_bytes")) is None:
        return None
    mig = raw.get("mig_mode")
    mig_mode = mig if mig in ("enabled", "disabled") else None
    return {
        "index": raw["index"],
        "uuid": str(raw.get("uuid", "")),
        "name": str(raw.get("name", "")),
        "memory_total_bytes": raw["memory_total_bytes"],
        "memory_used_bytes": _int(raw.get("memory_used_bytes")),
        "memory_free_bytes": _int(raw.get("memory_free_bytes")),
        "memory_reserved_bytes": _int(raw.get("memory_reserved_bytes")),
        "pci_bus_id": str(raw.get("pci_bus_id", "")),
        "mig_mode": mig_mode,
        "mig_devices": _mig_devices(raw, mig_mode),
        "parent_uuid": None,
    }


# -- visibility -------------------------------------------------------------------------------------
# NVIDIA_VISIBLE_DEVICES belongs to the NVIDIA Container Toolkit: it "controls which GPUs will be made
# accessible inside the container"; values "a comma-separated list of GPU UUID(s) or index(es)", "all",
# "none" (no GPU, driver capabilities only), "void"/empty/unset (as runc: nothing at all). Source:
# docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html
# ("Specialized Configurations with Docker", GPU Enumeration; `--gpus '"device=2,3"'` "will enumerate
# GPUs 2 and 3 to the container"). The runtime hook applies it before the container starts, with host
# indices; inside, NVML and nvidia-smi see only those GPUs and number them from 0 (NVML indices run over
# nvmlDeviceGetCount). Applied again inside, "2,3" names no GPU at all. On a host without the runtime it
# changes nothing. So: evidence (gpu_driver.visibility), never a filter.
#
# CUDA_VISIBLE_DEVICES narrows what CUDA uses (CUDA C++ Programming Guide, "CUDA Environment Variables",
# docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars, now
# docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html): integer indices,
# GPU UUIDs ("enough digits from the beginning of the GPU UUID to uniquely identify that GPU"), or MIG
# identifiers (MIG-GPU-<uuid>/<GPU instance>/<compute instance> in the guide's example; MIG-<uuid>, the
# UUID nvmlDeviceGetUUID gives a MIG device handle, on current drivers); devices are "enumerated in the
# order of the sequence"; "If one of the indices is invalid, only the devices whose index precedes the
# invalid index are visible"; an empty value hides all.


def _mig_instance(parent: GpuEntry, mig: MigDeviceEntry) -> GpuEntry:
    """A MIG instance as a gpus entry: the GPU's index and bus, the instance's own UUID and memory."""
    return {
        "index": parent["index"],
        "uuid": mig["uuid"],
        "name": mig["name"] or parent["name"],
        "memory_total_bytes": mig["memory_total_bytes"],
        "memory_used_bytes": mig["memory_used_bytes"],
        "memory_free_bytes": mig["memory_free_bytes"],
        "memory_reserved_bytes": mig["memory_reserved_bytes"],
        "pci_bus_id": parent["pci_bus_id"],
        "mig_mode": parent["mig_mode"],
        "mig_devices": [],
        "parent_uuid": parent["uuid"],
    }


def _resolve_mig(gpus: list[GpuEntry], item: str) -> list[GpuEntry]:
    """A MIG identifier -> its instance where NVML listed the instances, else its GPU(s) in MIG mode."""
    body = item[4:]
    old_form = body.upper().startswith("GPU-") and body.count("/") == 2  # MIG-GPU-<uuid>/<gi>/<ci>
    parents = [g for g in gpus if g.get("mig_mode") == "enabled"]
    if old_form:
        gpu_uuid, gi, ci = body.split("/")
        parents = [g for g in parents if g["uuid"].lower().startswith(gpu_uuid.lower())]
    out: list[GpuEntry] = []
    for g in parents:
        migs = g["mig_devices"]
        if migs is None:
            out.append(g)  # the instances are unknown (nvidia-smi): the GPU that holds it
            continue
        for m in migs:
            hit = (
                (str(m["gpu_instance_id"]), str(m["compute_instance_id"])) == (gi, ci)
                if old_form
                else m["uuid"].lower().startswith(item.lower())
            )
            if hit:
                out.append(_mig_instance(g, m))
    return out


def _is_index(item: str) -> bool:
    return item.isascii() and item.isdigit()


def _resolve(gpus: list[GpuEntry], item: str) -> list[GpuEntry]:
    if _is_index(item):
        return [g for g in gpus if g["index"] == int(item)]
    if item.upper().startswith("MIG-"):
        return _resolve_mig(gpus, item)
    if item.startswith("GPU-") or len(item) >= 4:
        return [g for g in gpus if g["uuid"].lower().startswith(item.lower())]
    return []


def _select(gpus: list[GpuEntry], spec: str) -> tuple[list[GpuEntry] | None, set[int]]:
    """(GPUs a CUDA_VISIBLE_DEVICES value names, None meaning all; the indices named by number)."""
    s = spec.strip()
    if s.lower() == "all":
        return None, set()
    if s.lower() in ("", "none", "void", "-1"):
        return [], set()
    chosen: list[GpuEntry] = []
    by_index: set[int] = set()
    for raw in s.split(","):
        item = raw.strip()
        match = _resolve(gpus, item)
        if not match:
            break  # CUDA ignores everything after the first entry it cannot resolve
        if _is_index(item):
            by_index.add(int(item))
        chosen.extend(g for g in match if g not in chosen)
    return chosen, by_index


def visible(gpus: list[GpuEntry], env: dict[str, str]) -> list[GpuEntry]:
    """The GPUs CUDA may use: the driver's, narrowed by CUDA_VISIBLE_DEVICES (NVIDIA_VISIBLE_DEVICES: above)."""
    if "CUDA_VISIBLE_DEVICES" not in env:
        return gpus
    sel, _ = _select(gpus, env["CUDA_VISIBLE_DEVICES"])
    return gpus if sel is None else sel


# CUDA_DEVICE_ORDER (same table of the CUDA guide): "FASTEST_FIRST, PCI_BUS_ID, (default is
# FASTEST_FIRST)"; "FASTEST_FIRST causes CUDA to enumerate the available devices in fastest to slowest
# order using a simple heuristic. PCI_BUS_ID orders devices by PCI bus ID in ascending order." NVML's
# index is PCI bus order, and the NVML reference says of nvmlDeviceGetIndex: "The NVML index may not
# correlate with other APIs, such as the CUDA device index." So an index in CUDA_VISIBLE_DEVICES names
# the GPU gpus lists only under PCI_BUS_ID; otherwise it matters when the index picks some GPUs and not
# others, and the GPUs differ (name or memory).
def order_ambiguity(gpus: list[GpuEntry], env: dict[str, str]) -> str | None:
    """Why the GPUs that CUDA_VISIBLE_DEVICES picks by index may not be the ones listed; None if they are."""
    spec, order = env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER")
    if spec is None or (order or "").strip() == "PCI_BUS_ID":
        return None
    _, by_index = _select(gpus, spec)
    kinds = {(g["name"], g["memory_total_bytes"]) for g in gpus}
    if not by_index or by_index >= {g["index"] for g in gpus} or len(kinds) < 2:
        return None
    shown = ", ".join(f"{g['index']}: {g['name']} {format_size(g['memory_total_bytes'])}" for g in gpus)
    picked = ",".join(str(i) for i in sorted(by_index))
    return (
        f"CUDA_VISIBLE_DEVICES={spec!r} picks GPUs by index, but CUDA_DEVICE_ORDER is "
        f"{'unset' if order is None else repr(order)}, so CUDA numbers the fastest GPU 0 while the driver "
        f"numbers them in PCI bus order ({shown}); gpus lists driver GPU(s) {picked}, CUDA may use others; "
        "set CUDA_DEVICE_ORDER=PCI_BUS_ID or name the GPUs by UUID"
    )


def probe_gpus(
    root: Root,
    env: dict[str, str],
    warnings: list[WarningEntry],
    *,
    enabled: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
) -> tuple[list[GpuEntry], GpuDriverSection]:
    """(visible GPUs, gpu_driver section)."""
    driver = skipped_driver(env)
    if not enabled:
        return [], driver
    if not driver_present(root):
        driver["status"] = "no-driver"
        return [], driver
    q = root.gpu_query(timeout)
    driver["source"] = q.get("source") if q.get("source") in ("nvml", "nvidia-smi") else None
    driver["driver_version"] = _str(q.get("driver_version"))
    driver["cuda_version"] = _str(q.get("cuda_version"))
    rows = q.get("gpus", [])
    gpus = [g for g in (_row(r) for r in (rows if isinstance(rows, list) else [])) if g is not None]
    if q.get("error"):
        add_warning(warnings, "gpu-probe-failed", f"an NVIDIA driver is present but the GPU query failed: {q['error']}")
    driver["status"] = "failed" if q.get("error") and not gpus else "ok"
    why = order_ambiguity(gpus, env)
    if why:
        add_warning(warnings, "gpu-order-ambiguous", why)
    return visible(gpus, env), driver
