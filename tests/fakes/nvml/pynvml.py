"""A fake of nvidia-ml-py's pynvml for tests: two GPUs, the second in MIG mode with two MIG devices.

FAKE_NVML=fail makes nvmlInit raise, as on a machine whose driver and library disagree.
FAKE_NVML=no-mig-api: a driver or library without the MIG device calls (the instances are unknown).

MIG devices as NVML shows them: nvmlDeviceGetMaxMigDeviceCount slots under the GPU (7 on an A100),
nvmlDeviceGetMigDeviceHandleByIndex raises NVMLError_NotFound for an empty slot, and a MIG device
handle answers nvmlDeviceGetUUID (MIG-...), nvmlDeviceGetName, nvmlDeviceGetMemoryInfo (its own
memory; here without the v2 struct, so the probe's fallback to v1 runs) and its instance IDs.
"""

import os


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
_GPUS = [
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
shutdowns = []


class _Mem:
    def __init__(self, total, used, reserved, v2):
        self.total = total
        self.used = used
        self.free = total - used - (reserved if v2 else 0)
        if v2:
            self.reserved = reserved


class _Pci:
    def __init__(self, bus):
        self.busId = bus.encode()


def _mig(h):
    return _GPUS[h[0]]["migs"][h[1]]


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
    return h if isinstance(h, int) else h[1]


def nvmlDeviceGetUUID(h):
    return _GPUS[h]["uuid"] if isinstance(h, int) else _mig(h)["uuid"]


def nvmlDeviceGetName(h):
    return _GPUS[h]["name"] if isinstance(h, int) else _mig(h)["name"].encode()


def nvmlDeviceGetMemoryInfo(h, version=None):
    if isinstance(h, int):
        g = _GPUS[h]
        return _Mem(g["total"], g["used"], g["reserved"], version == nvmlMemory_v2)
    if version == nvmlMemory_v2:
        raise NVMLError_NotSupported("Not Supported")
    m = _mig(h)
    return _Mem(m["total"], m["used"], 0, False)


def nvmlDeviceGetPciInfo(h):
    return _Pci(_GPUS[h]["bus"])


def nvmlDeviceGetMigMode(h):
    if _GPUS[h]["mig"] is None:
        raise NVMLError_NotSupported("Not Supported")
    return [_GPUS[h]["mig"], _GPUS[h]["mig"]]


def _mig_api():
    if os.environ.get("FAKE_NVML") == "no-mig-api":
        raise NVMLError_FunctionNotFound("Function Not Found")


def nvmlDeviceGetMaxMigDeviceCount(h):
    _mig_api()
    return _GPUS[h]["slots"]


def nvmlDeviceGetMigDeviceHandleByIndex(h, j):
    _mig_api()
    if j not in _GPUS[h]["migs"]:
        raise NVMLError_NotFound("Not Found")
    return (h, j)


def nvmlDeviceGetGpuInstanceId(h):
    return _mig(h)["gi"]


def nvmlDeviceGetComputeInstanceId(h):
    return _mig(h)["ci"]
