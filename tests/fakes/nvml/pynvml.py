"""A fake of nvidia-ml-py's pynvml for tests: two GPUs, the second in MIG mode with two MIG devices.

FAKE_NVML=fail makes nvmlInit raise, as on a machine whose driver and library disagree.
FAKE_NVML=no-mig-api: a driver or library without the MIG device calls (the instances are unknown).

MIG devices as NVML shows them: nvmlDeviceGetMaxMigDeviceCount slots under the GPU (7 on an A100),
nvmlDeviceGetMigDeviceHandleByIndex raises NVMLError_NotFound for an empty slot, and a MIG device
handle answers nvmlDeviceGetUUID (MIG-...), nvmlDeviceGetName, nvmlDeviceGetMemoryInfo (its own
memory; here without the v2 struct, so the probe's fallback to v1 runs) and its instance IDs.
"""

import os
from typing import TypedDict


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


class NVMLError_FunctionNotFound(NVMLError):
    pass


nvmlMemory_v2 = 0x02000028
MiB = 1 << 20


class _MigDev(TypedDict):
    uuid: str
    name: str
    total: int
    used: int
    gi: int
    ci: int


class _Gpu(TypedDict):
    uuid: str
    name: str
    total: int
    used: int
    reserved: int
    bus: str
    mig: int | None
    slots: int
    migs: dict[int, _MigDev]


# A GPU's handle is its index; a MIG device's is (GPU index, slot).
_Handle = int | tuple[int, int]
_GPUS: list[_Gpu] = [
    {
        "uuid": "GPU-aaaaaaaa-0000",
        "name": "NVIDIA A100-SXM4-80GB",
        "total": 80 << 30,
        "used": 2 << 30,
        "reserved": 512 << 20,
        "bus": "00000000:07:00.0",
        "mig": None,
        "slots": 0,
        "migs": {},
    },
    {
        "uuid": "GPU-bbbbbbbb-1111",
        "name": "NVIDIA A100-SXM4-80GB",
        "total": 80 << 30,
        "used": 10 << 30,
        "reserved": 512 << 20,
        "bus": "00000000:0F:00.0",
        "mig": 1,
        "slots": 7,
        "migs": {  # slot -> MIG device; slots 1, 3-6 are empty
            0: {
                "uuid": "MIG-c0ffee00-3g40-4000-8000-000000000001",
                "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                "total": 40192 * MiB,
                "used": 5 << 30,
                "gi": 1,
                "ci": 0,
            },
            2: {
                "uuid": "MIG-deadbeef-1g10-4000-8000-000000000002",
                "name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
                "total": 9728 * MiB,
                "used": 13 * MiB,
                "gi": 9,
                "ci": 0,
            },
        },
    },
]
shutdowns: list[int] = []


class _Mem:
    def __init__(self, total: int, used: int, reserved: int, v2: bool) -> None:
        self.total = total
        self.used = used
        self.free = total - used - (reserved if v2 else 0)
        if v2:
            self.reserved = reserved


class _Pci:
    def __init__(self, bus: str) -> None:
        self.busId = bus.encode()


def _mig(h: tuple[int, int]) -> _MigDev:
    return _GPUS[h[0]]["migs"][h[1]]


def nvmlInit() -> None:
    if os.environ.get("FAKE_NVML") == "fail":
        raise NVMLError("Driver/library version mismatch")


def nvmlShutdown() -> None:
    shutdowns.append(1)


def nvmlSystemGetDriverVersion() -> bytes:
    return b"535.104.05"


def nvmlSystemGetCudaDriverVersion_v2() -> int:
    return 12020


def nvmlDeviceGetCount() -> int:
    return len(_GPUS)


def nvmlDeviceGetHandleByIndex(i: int) -> int:
    return i


def nvmlDeviceGetIndex(h: _Handle) -> int:
    return h if isinstance(h, int) else h[1]


def nvmlDeviceGetUUID(h: _Handle) -> str:
    return _GPUS[h]["uuid"] if isinstance(h, int) else _mig(h)["uuid"]


def nvmlDeviceGetName(h: _Handle) -> str | bytes:
    return _GPUS[h]["name"] if isinstance(h, int) else _mig(h)["name"].encode()


def nvmlDeviceGetMemoryInfo(h: _Handle, version: int | None = None) -> _Mem:
    if isinstance(h, int):
        g = _GPUS[h]
        return _Mem(g["total"], g["used"], g["reserved"], version == nvmlMemory_v2)
    if version == nvmlMemory_v2:
        raise NVMLError_NotSupported("Not Supported")
    m = _mig(h)
    return _Mem(m["total"], m["used"], 0, False)


def nvmlDeviceGetPciInfo(h: int) -> _Pci:
    return _Pci(_GPUS[h]["bus"])


def nvmlDeviceGetMigMode(h: int) -> list[int]:
    mode = _GPUS[h]["mig"]
    if mode is None:
        raise NVMLError_NotSupported("Not Supported")
    return [mode, mode]


def _mig_api() -> None:
    if os.environ.get("FAKE_NVML") == "no-mig-api":
        raise NVMLError_FunctionNotFound("Function Not Found")


def nvmlDeviceGetMaxMigDeviceCount(h: int) -> int:
    _mig_api()
    return _GPUS[h]["slots"]


def nvmlDeviceGetMigDeviceHandleByIndex(h: int, j: int) -> tuple[int, int]:
    _mig_api()
    if j not in _GPUS[h]["migs"]:
        raise NVMLError_NotFound("Not Found")
    return (h, j)


def nvmlDeviceGetGpuInstanceId(h: tuple[int, int]) -> int:
    return _mig(h)["gi"]


def nvmlDeviceGetComputeInstanceId(h: tuple[int, int]) -> int:
    return _mig(h)["ci"]
