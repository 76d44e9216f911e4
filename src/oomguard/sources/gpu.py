"""The NVIDIA driver's answer: NVML first (``nvidia-ml-py``, the ``[gpu]`` extra, imported lazily),
``nvidia-smi`` second, each with a timeout. I/O only: ``probes/gpu.py`` turns the answer into the
report's GPU section, and a snapshot stores the answer as ``gpus.json``.

Never raises: a failure is the ``error`` field of the answer
``{"source", "driver_version", "cuda_version", "gpus", "error"}``. Each GPU row carries the keys of
``GpuEntry`` but ``parent_uuid``; ``mig_devices`` lists a MIG-mode GPU's instances (NVML only).
"""

from __future__ import annotations

from oomguard.units import MiB

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SMI_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "memory.free",
    "memory.reserved",
    "pci.bus_id",
    "mig.mode.current",
    "driver_version",
)
DEFAULT_TIMEOUT = 5.0


def _mig(value: str) -> str | None:
    v = value.strip().lower()
    return v if v in ("enabled", "disabled") else None


def _mib(value: str) -> int | None:
    v = value.strip()
    return int(float(v) * MiB) if v.replace(".", "", 1).isdigit() else None


def parse_smi_csv(text: str, fields: tuple[str, ...] = SMI_FIELDS) -> tuple[list[dict[str, Any]], str | None, int]:
    """``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` -> (gpus, driver version, bad lines).

    One line per GPU (memory in MiB)::

        0, GPU-5e5f..., NVIDIA H100 80GB HBM3, 81559, 1, 81010, 548, 00000000:19:00.0, Disabled, 550.54.15

    Lines with the wrong number of fields or a non-numeric index are bad.
    """
    gpus: list[dict[str, Any]] = []
    driver: str | None = None
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields) or not parts[0].isdigit():
            bad += 1
            continue
        row = dict(zip(fields, parts, strict=True))
        total = _mib(row["memory.total"])
        if total is None:
            bad += 1
            continue
        gpus.append(
            {
                "index": int(row["index"]),
                "uuid": row["uuid"],
                "name": row["name"],
                "memory_total_bytes": total,
                "memory_used_bytes": _mib(row["memory.used"]),
                "memory_free_bytes": _mib(row["memory.free"]),
                "memory_reserved_bytes": _mib(row.get("memory.reserved", "")),
                "pci_bus_id": row["pci.bus_id"],
                "mig_mode": _mig(row["mig.mode.current"]),
                # --query-gpu has no MIG device rows: unknown in MIG mode, none without it
                "mig_devices": None if _mig(row["mig.mode.current"]) == "enabled" else [],
            }
        )
        driver = row["driver_version"] or driver
    return gpus, driver, bad


def query_nvidia_smi(timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """Run nvidia-smi; {"source", "driver_version", "cuda_version", "gpus", "error"}."""
    import subprocess

    out: dict[str, Any] = {
        "source": "nvidia-smi",
        "driver_version": None,
        "cuda_version": None,
        "gpus": [],
        "error": None,
    }
    fields: tuple[str, ...] = SMI_FIELDS
    for attempt in range(2):
        cmd = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except FileNotFoundError:
            out["error"] = "nvidia-smi is not installed (not on PATH)"
            return out
        except subprocess.TimeoutExpired:
            out["error"] = f"nvidia-smi did not answer within {timeout:g} s"
            return out
        except OSError as exc:
            out["error"] = f"nvidia-smi could not run: {exc.strerror or exc}"
            return out
        if proc.returncode != 0 and attempt == 0 and "memory.reserved" in (proc.stdout + proc.stderr):
            fields = tuple(f for f in SMI_FIELDS if f != "memory.reserved")  # older drivers lack the field
            continue
        if proc.returncode != 0:
            msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            out["error"] = f"nvidia-smi failed (exit {proc.returncode}): {msg[0][:200] if msg else 'no output'}"
            return out
        gpus, driver, bad = parse_smi_csv(proc.stdout, fields)
        out["gpus"], out["driver_version"] = gpus, driver
        if bad:
            out["error"] = f"nvidia-smi printed {bad} line(s) that are not GPU rows; they were ignored"
        return out
    return out


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _memory(nv: Any, h: Any) -> dict[str, int | None]:
    """nvmlDeviceGetMemoryInfo: v2 (with ``reserved``) where the driver has it, else v1."""
    try:
        mem = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        reserved: int | None = int(mem.reserved)
    except Exception:
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        reserved = None
    return {
        "memory_total_bytes": int(mem.total),
        "memory_used_bytes": int(mem.used),
        "memory_free_bytes": int(mem.free),
        "memory_reserved_bytes": reserved,
    }


def _optional(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception:
        return None


# MIG devices (NVML API Reference, docs.nvidia.com/deploy/nvml-api, "Multi Instance GPU Management"):
# nvmlDeviceGetMaxMigDeviceCount is "the maximum number of MIG devices that can exist under a given
# parent NVML device" (zero without MIG mode); nvmlDeviceGetMigDeviceHandleByIndex gives the handle in
# one of those slots, and an empty slot answers an error (skipped here). A MIG device handle answers
# the device queries "at a per-compute instance granularity"; nvmlDeviceGetMemoryInfo: "In MIG mode, if
# device handle is provided, the API returns aggregate information, only if the caller has appropriate
# privileges. Per-instance information can be queried by using specific MIG device handles."
# Its UUID (nvmlDeviceGetUUID) is the ``MIG-...`` identifier that CUDA_VISIBLE_DEVICES takes.
def _mig_devices(nv: Any, h: Any) -> list[dict[str, Any]] | None:
    """The MIG devices of one GPU with their own memory; None when NVML cannot list them."""
    try:
        slots = int(nv.nvmlDeviceGetMaxMigDeviceCount(h))
    except Exception:
        return None
    out: list[dict[str, Any]] = []
    for j in range(slots):
        try:
            mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            entry: dict[str, Any] = {"index": j, "uuid": _text(nv.nvmlDeviceGetUUID(mh))}
            entry.update(_memory(nv, mh))
        except Exception:
            continue  # an empty slot, or a MIG device destroyed meanwhile
        name = _optional(nv.nvmlDeviceGetName, mh)
        entry["name"] = None if name is None else _text(name)
        entry["gpu_instance_id"] = _optional(nv.nvmlDeviceGetGpuInstanceId, mh)
        entry["compute_instance_id"] = _optional(nv.nvmlDeviceGetComputeInstanceId, mh)
        out.append(entry)
    return out


def _nvml_gpu(nv: Any, i: int) -> dict[str, Any]:
    h = nv.nvmlDeviceGetHandleByIndex(i)
    mig_on = _optional(nv.nvmlDeviceGetMigMode, h)
    mig = None if mig_on is None else "enabled" if mig_on[0] else "disabled"
    return {
        "index": int(nv.nvmlDeviceGetIndex(h)),
        "uuid": _text(nv.nvmlDeviceGetUUID(h)),
        "name": _text(nv.nvmlDeviceGetName(h)),
        **_memory(nv, h),
        "pci_bus_id": _text(nv.nvmlDeviceGetPciInfo(h).busId),
        "mig_mode": mig,
        "mig_devices": _mig_devices(nv, h) if mig == "enabled" else [],
    }


def query_nvml() -> dict[str, Any]:
    """Ask NVML (pynvml from nvidia-ml-py). Raises ImportError or the library's errors."""
    import pynvml  # type: ignore[import-not-found,unused-ignore]

    pynvml.nvmlInit()
    try:
        out: dict[str, Any] = {
            "source": "nvml",
            "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_version": None,
            "gpus": [],
            "error": None,
        }
        v = _optional(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        if isinstance(v, int):
            out["cuda_version"] = f"{v // 1000}.{v % 1000 // 10}"
        out["gpus"] = [_nvml_gpu(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
        return out
    finally:
        pynvml.nvmlShutdown()


def query_live(timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """NVML in a thread (it can hang too), then nvidia-smi. Never raises."""
    import threading

    result: dict[str, Any] = {}

    def ask() -> None:
        try:
            result.update(query_nvml())
        except ImportError:
            result["nvml_error"] = "nvidia-ml-py is not installed"
        except Exception as exc:
            result["nvml_error"] = f"NVML failed: {type(exc).__name__}: {exc}"

    t = threading.Thread(target=ask, daemon=True)
    t.start()
    t.join(timeout)
    if result.get("source") == "nvml":
        return result
    smi = query_nvidia_smi(timeout)
    if smi["error"] and not smi["gpus"]:
        nvml = result.get("nvml_error", f"NVML did not answer within {timeout:g} s")
        smi["error"] = f"{nvml}; {smi['error']}"
    return smi
