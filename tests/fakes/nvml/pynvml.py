"""A fake of nvidia-ml-py's pynvml for tests: two GPUs, the second in MIG mode.

FAKE_NVML=fail makes nvmlInit raise, as on a machine whose driver and library disagree.
"""

import os


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


nvmlMemory_v2 = 0x02000028
_GPUS = [
    {
        "uuid": "GPU-aaaaaaaa-0000",
        "name": "NVIDIA A100-SXM4-80GB",
        "total": 80 << 30,
        "used": 2 << 30,
        "reserved": 512 << 20,
        "bus": "00000000:07:00.0",
        "mig": None,
    },
    {
        "uuid": "GPU-bbbbbbbb-1111",
        "name": "NVIDIA A100-SXM4-80GB",
        "total": 80 << 30,
        "used": 10 << 30,
        "reserved": 512 << 20,
        "bus": "00000000:0F:00.0",
        "mig": 1,
    },
]
shutdowns = []


class _Mem:
    def __init__(self, g, v2):
        self.total = g["total"]
        self.used = g["used"]
        self.free = g["total"] - g["used"] - (g["reserved"] if v2 else 0)
        if v2:
            self.reserved = g["reserved"]


class _Pci:
    def __init__(self, bus):
        self.busId = bus.encode()


def nvmlInit():
    if os.environ.get("FAKE_NVML") == "fail":
        raise NVMLError("Driver/library version mismatch")


def nvmlShutdown():
    shutdowns.append(1)


def nvmlSystemGetDriverVersion():
    return b"535.104.05"


def nvmlSystemGetCudaDriverVersion_v2():
    return 12020


def nvmlDeviceGetCount():
    return len(_GPUS)


def nvmlDeviceGetHandleByIndex(i):
    return i


def nvmlDeviceGetIndex(h):
    return h


def nvmlDeviceGetUUID(h):
    return _GPUS[h]["uuid"]


def nvmlDeviceGetName(h):
    return _GPUS[h]["name"]


def nvmlDeviceGetMemoryInfo(h, version=None):
    return _Mem(_GPUS[h], version == nvmlMemory_v2)


def nvmlDeviceGetPciInfo(h):
    return _Pci(_GPUS[h]["bus"])


def nvmlDeviceGetMigMode(h):
    if _GPUS[h]["mig"] is None:
        raise NVMLError_NotSupported("Not Supported")
    return (_GPUS[h]["mig"], _GPUS[h]["mig"])
