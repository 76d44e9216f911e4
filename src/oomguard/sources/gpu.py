"""The NVIDIA driver's answer: NVML first (``nvidia-ml-py``, the ``[gpu]`` extra, imported lazily),
``nvidia-smi`` second, each with a timeout. I/O only: ``probes/gpu.py`` turns the answer into the
report's GPU section, and a snapshot stores the answer as ``gpus.json``.

Never raises: a failure is the ``error`` field of the answer
``{"source", "driver_version", "cuda_version", "gpus", "error"}``.
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
        try:
            v = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
            out["cuda_version"] = f"{v // 1000}.{v % 1000 // 10}"
        except Exception:
            pass
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
                reserved = int(mem.reserved)
            except Exception:
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                reserved = None
            try:
                mig = "enabled" if pynvml.nvmlDeviceGetMigMode(h)[0] else "disabled"
            except Exception:
                mig = None
            out["gpus"].append(
                {
                    "index": int(pynvml.nvmlDeviceGetIndex(h)),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                    "name": _text(pynvml.nvmlDeviceGetName(h)),
                    "memory_total_bytes": int(mem.total),
                    "memory_used_bytes": int(mem.used),
                    "memory_free_bytes": int(mem.free),
                    "memory_reserved_bytes": reserved,
                    "pci_bus_id": _text(pynvml.nvmlDeviceGetPciInfo(h).busId),
                    "mig_mode": mig,
                }
            )
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
