"""GPUs and pinning: fake nvidia-smi and NVML, visibility filters, snapshots, the real mlock probe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomguard import capture, probe
from oomguard.probes.gpu import order_ambiguity, probe_gpus, visible
from oomguard.sources.gpu import parse_smi_csv
from oomguard.sources.root import LiveRoot
from tests.conftest import REPO, run_oomguard
from tests.helpers.fuzz import examples

FAKES = Path(__file__).resolve().parents[1] / "fakes"
SCHEMA = json.loads((REPO / "src" / "oomguard" / "schema.json").read_text())
GiB = 1024**3
MiB = 1024**2


class DriverRoot(LiveRoot):
    """The live system, but with an NVIDIA driver present."""

    def exists(self, path: str) -> bool:
        return path == "/dev/nvidiactl" or super().exists(path)


@pytest.fixture
def fake_smi(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PATH", f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}")
    for var in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "OOMGUARD_BUDGET", "FAKE_NVML"):
        monkeypatch.delenv(var, raising=False)
    yield
    sys.modules.pop("pynvml", None)  # a fake NVML imported by a test must not outlive it


def gpu_report(monkeypatch: pytest.MonkeyPatch, mode: str, **kw: Any) -> dict[str, Any]:
    monkeypatch.setenv("FAKE_SMI", mode)
    return probe(root=DriverRoot(), **kw)  # type: ignore[return-value]


def codes(report: dict[str, Any]) -> list[str]:
    return [w["code"] for w in report["warnings"]]


NO_VISIBILITY = {"nvidia_visible_devices": None, "cuda_visible_devices": None, "cuda_device_order": None}


def test_no_driver_means_no_gpu_silently() -> None:
    report = probe()
    assert report["gpus"] == [] and report["gpu_driver"]["status"] == "no-driver"
    assert "gpu-probe-failed" not in codes(report)  # type: ignore[arg-type]


@pytest.mark.usefixtures("fake_smi")
@pytest.mark.parametrize("mode, count", [("0", 0), ("1", 1), ("8", 8)])
def test_nvidia_smi_counts(monkeypatch: pytest.MonkeyPatch, mode: str, count: int) -> None:
    report = gpu_report(monkeypatch, mode)
    assert len(report["gpus"]) == count
    assert report["gpu_driver"] == {
        "status": "ok",
        "source": "nvidia-smi",
        "driver_version": "550.54.15" if count else None,
        "cuda_version": None,
        "visibility": NO_VISIBILITY,
    }
    if count:
        g = report["gpus"][-1]
        assert g["index"] == count - 1 and g["name"] == "NVIDIA H100 80GB HBM3"
        assert g["memory_total_bytes"] == 81559 * MiB and g["memory_reserved_bytes"] == 548 * MiB
        assert g["memory_used_bytes"] + g["memory_free_bytes"] + g["memory_reserved_bytes"] == 81559 * MiB
        assert g["pci_bus_id"].startswith("00000000:") and g["mig_mode"] == "disabled"
        assert g["mig_devices"] == [] and g["parent_uuid"] is None
    assert "gpu-probe-failed" not in codes(report)


@pytest.mark.usefixtures("fake_smi")
def test_mig_and_old_drivers(monkeypatch: pytest.MonkeyPatch) -> None:
    mig = gpu_report(monkeypatch, "mig")["gpus"]
    assert [(g["mig_mode"], g["mig_devices"]) for g in mig] == [("disabled", []), ("enabled", None)]  # smi: unknown
    old = gpu_report(monkeypatch, "old")  # no memory.reserved field: asked again without it
    assert old["gpus"][0]["memory_reserved_bytes"] is None and old["gpus"][0]["mig_mode"] is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1c2b3a4d-0000")
    resolved = gpu_report(monkeypatch, "mig")["gpus"]  # instances unknown: the GPU in MIG mode, as before
    assert [(g["index"], g["memory_total_bytes"], g["parent_uuid"]) for g in resolved] == [(1, 81559 * MiB, None)]


@pytest.mark.usefixtures("fake_smi")
@pytest.mark.parametrize(
    ("mode", "words"),
    [("hang", "did not answer within 0.5 s"), ("fail", "failed (exit 9)"), ("garbage", "not GPU rows")],
)
def test_broken_nvidia_smi_is_a_warning(monkeypatch: pytest.MonkeyPatch, mode: str, words: str) -> None:
    # 0.5 s only where the fake hangs: a loaded machine can take longer than that to start it at all
    report = gpu_report(monkeypatch, mode, gpu_timeout=0.5 if mode == "hang" else 20.0)
    assert report["gpus"] == [] and report["gpu_driver"]["status"] == "failed"
    warning = next(w for w in report["warnings"] if w["code"] == "gpu-probe-failed")
    assert words in warning["message"] and "nvidia-ml-py is not installed" in warning["message"]


def test_missing_nvidia_smi_with_a_driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    report = probe(root=DriverRoot())
    assert "gpu-probe-failed" in codes(report)  # type: ignore[arg-type]
    assert "not installed (not on PATH)" in report["warnings"][-1]["message"]


@pytest.mark.usefixtures("fake_smi")
def test_no_gpu_skips_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    report = gpu_report(monkeypatch, "8", gpu=False)
    assert report["gpus"] == [] and report["gpu_driver"]["status"] == "skipped"


@pytest.mark.usefixtures("fake_smi")
def test_fake_nvml_comes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FAKES / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    report = gpu_report(monkeypatch, "8")
    assert report["gpu_driver"] == {
        "status": "ok",
        "source": "nvml",
        "driver_version": "535.104.05",
        "cuda_version": "12.2",
        "visibility": NO_VISIBILITY,
    }
    a, b = report["gpus"]
    assert (a["uuid"], a["mig_mode"], b["mig_mode"]) == ("GPU-aaaaaaaa-0000", None, "enabled")
    assert a["memory_free_bytes"] == 80 * GiB - 2 * GiB - 512 * MiB and a["memory_reserved_bytes"] == 512 * MiB
    assert a["pci_bus_id"] == "00000000:07:00.0" and a["mig_devices"] == []
    assert b["mig_devices"] == [MIG_3G, MIG_1G]  # slots 1 and 3-6 are empty
    import pynvml  # type: ignore[import-not-found,unused-ignore]  # the fake, on sys.path at run time only

    assert pynvml.shutdowns  # NVML is always shut down
    monkeypatch.setenv("FAKE_NVML", "fail")  # NVML fails: nvidia-smi answers instead
    assert gpu_report(monkeypatch, "1")["gpu_driver"]["source"] == "nvidia-smi"


MIG_3G = {
    "index": 0,
    "uuid": "MIG-c0ffee00-3g40-4000-8000-000000000001",
    "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
    "gpu_instance_id": 1,
    "compute_instance_id": 0,
    "memory_total_bytes": 40192 * MiB,
    "memory_used_bytes": 5 * GiB,
    "memory_free_bytes": 40192 * MiB - 5 * GiB,
    "memory_reserved_bytes": None,  # the fake has no v2 memory info for a MIG device: v1, no reserved
}
MIG_1G = {
    "index": 2,
    "uuid": "MIG-deadbeef-1g10-4000-8000-000000000002",
    "name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
    "gpu_instance_id": 9,
    "compute_instance_id": 0,
    "memory_total_bytes": 9728 * MiB,
    "memory_used_bytes": 13 * MiB,
    "memory_free_bytes": 9715 * MiB,
    "memory_reserved_bytes": None,
}


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch, fake_smi: None) -> None:
    monkeypatch.syspath_prepend(str(FAKES / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)


# -- NVIDIA_VISIBLE_DEVICES: applied by the container runtime, so evidence and never a filter -----------


@pytest.mark.parametrize("value", ["2,3", "GPU-fef8089b,GPU-0badcafe", "none", "all"])
@pytest.mark.parametrize("driver", ["nvidia-smi", "nvml"])
def test_nvidia_visible_devices_is_evidence_not_a_filter(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, driver: str, value: str
) -> None:
    """`docker run --gpus '"device=2,3"'`: inside, the driver shows two GPUs, 0 and 1; both are usable."""
    request.getfixturevalue("fake_nvml" if driver == "nvml" else "fake_smi")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", value)
    report = gpu_report(monkeypatch, "2")
    assert [g["index"] for g in report["gpus"]] == [0, 1]
    assert report["gpu_driver"]["source"] == driver and report["gpu_driver"]["status"] == "ok"
    assert report["gpu_driver"]["visibility"] == {**NO_VISIBILITY, "nvidia_visible_devices": value}
    assert not codes(report)


@pytest.mark.usefixtures("fake_smi")
def test_container_snapshot_replays_both_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAKE_SMI", "2")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "2,3")
    snap = tmp_path / "container.tar.gz"
    capture(str(snap), source=DriverRoot())
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES")
    replay = probe(root=str(snap))
    assert [g["index"] for g in replay["gpus"]] == [0, 1]
    assert replay["gpu_driver"]["visibility"]["nvidia_visible_devices"] == "2,3"  # the snapshot's own


# -- CUDA_VISIBLE_DEVICES: narrows --------------------------------------------------------------------

GPUS = [
    {**g, "parent_uuid": None}
    for g in parse_smi_csv("\n".join(f"{i}, GPU-{i}abc{i}, X, 100, 1, 98, 1, 0:{i}, Disabled, 1" for i in range(4)))[0]
]


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, [0, 1, 2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "2,0"}, [2, 0]),  # the driver's own indices, in the order given
        ({"CUDA_VISIBLE_DEVICES": "GPU-3abc3,1"}, [3, 1]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-1ab"}, [1]),  # a unique UUID prefix
        ({"CUDA_VISIBLE_DEVICES": "1,7,2"}, [1]),  # CUDA stops at the first entry it cannot resolve
        ({"CUDA_VISIBLE_DEVICES": "0,2,-1,1"}, [0, 2]),  # the CUDA guide's own example
        ({"CUDA_VISIBLE_DEVICES": "1,\u00b2,2"}, [1]),  # a superscript two is a digit to str.isdigit, not an index
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, []),
        ({"CUDA_VISIBLE_DEVICES": "all"}, [0, 1, 2, 3]),
        ({"NVIDIA_VISIBLE_DEVICES": "none"}, [0, 1, 2, 3]),  # evidence only: the runtime applied it already
        ({"NVIDIA_VISIBLE_DEVICES": "5,6"}, [0, 1, 2, 3]),
        ({"NVIDIA_VISIBLE_DEVICES": "1,2,3", "CUDA_VISIBLE_DEVICES": "3"}, [3]),
        ({"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "3"}, [3]),
    ],
)
def test_visibility(env: dict[str, str], want: list[int]) -> None:
    assert [g["index"] for g in visible(GPUS, env)] == want  # type: ignore[arg-type]


# -- CUDA_DEVICE_ORDER: an index is the driver's only in PCI bus order ----------------------------------

T4_H100 = [
    {**g, "parent_uuid": None}
    for g in parse_smi_csv(
        "0, GPU-00000000-t4, Tesla T4, 15360, 1, 14811, 548, 00000000:19:00.0, Disabled, 550\n"
        "1, GPU-00000001-h100, NVIDIA H100 80GB HBM3, 81559, 1, 81010, 548, 00000000:1A:00.0, Disabled, 550\n"
        "2, GPU-00000002-h100, NVIDIA H100 80GB HBM3, 81559, 1, 81010, 548, 00000000:1B:00.0, Disabled, 550\n"
    )[0]
]


@pytest.mark.parametrize(
    ("env", "ambiguous"),
    [
        ({"CUDA_VISIBLE_DEVICES": "0"}, True),  # FASTEST_FIRST (the default): CUDA's 0 is an H100
        ({"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, True),
        ({"CUDA_VISIBLE_DEVICES": "2,9"}, True),  # 9 ends the list; 2 still picks by index
        ({"CUDA_VISIBLE_DEVICES": "GPU-00000001,2"}, True),  # the UUID is sure, the 2 is not
        ({"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, False),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, False),  # every GPU: which is which does not change the set
        ({"CUDA_VISIBLE_DEVICES": "GPU-00000000"}, False),  # by UUID
        ({"CUDA_VISIBLE_DEVICES": ""}, False),
        ({"CUDA_VISIBLE_DEVICES": "9"}, False),  # names no GPU in any order
        ({}, False),
    ],
)
def test_order_ambiguity(env: dict[str, str], ambiguous: bool) -> None:
    assert (order_ambiguity(T4_H100, env) is not None) is ambiguous  # type: ignore[arg-type]
    same = [{**g, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 81559 * MiB} for g in T4_H100]
    assert order_ambiguity(same, env) is None  # type: ignore[arg-type]  # alike GPUs: any order picks the same


@pytest.mark.usefixtures("fake_smi")
@pytest.mark.parametrize(("order", "said"), [(None, "unset"), ("FASTEST_FIRST", "'FASTEST_FIRST'"), ("PCI_BUS_ID", "")])
def test_mixed_gpus_by_index_warn(monkeypatch: pytest.MonkeyPatch, order: str | None, said: str) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    if order:
        monkeypatch.setenv("CUDA_DEVICE_ORDER", order)
    report = gpu_report(monkeypatch, "mixed")
    assert [(g["index"], g["name"]) for g in report["gpus"]] == [(0, "Tesla T4")]  # the driver's 0, as before
    assert report["gpu_driver"]["visibility"] == {
        **NO_VISIBILITY,
        "cuda_visible_devices": "0",
        "cuda_device_order": order,
    }
    warned = [w for w in report["warnings"] if w["code"] == "gpu-order-ambiguous"]
    if not said:
        assert warned == []
        return
    (w,) = warned
    for fact in (
        "CUDA_VISIBLE_DEVICES='0'",
        f"CUDA_DEVICE_ORDER is {said}",
        "0: Tesla T4 15 GiB",
        "1: NVIDIA H100 80GB HBM3 79.65 GiB",
        "driver GPU(s) 0",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
    ):
        assert fact in w["message"], fact


# -- MIG: an instance resolves to its own memory where NVML lists it --------------------------------------


@pytest.mark.usefixtures("fake_nvml")
@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("MIG-deadbeef-1g10-4000-8000-000000000002", [MIG_1G]),  # MIG-<uuid> (R470 and later)
        ("MIG-deadbeef", [MIG_1G]),  # a prefix, as for GPU UUIDs
        ("MIG-GPU-bbbbbbbb-1111/1/0", [MIG_3G]),  # MIG-GPU-<uuid>/<GPU instance>/<compute instance>
        ("MIG-GPU-bbbbbbbb-1111/9/0,0", [MIG_1G, "GPU-aaaaaaaa-0000"]),
        ("MIG-GPU-bbbbbbbb-1111/2/0,0", []),  # no such instance: CUDA stops there
        ("0,MIG-ffffffff,1", ["GPU-aaaaaaaa-0000"]),
        ("MIG-GPU-aaaaaaaa-0000/1/0", []),  # GPU 0 is not in MIG mode
    ],
)
def test_mig_instance_resolves_to_its_own_memory(monkeypatch: pytest.MonkeyPatch, spec: str, want: list[Any]) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    gpus = gpu_report(monkeypatch, "2")["gpus"]
    assert [g["uuid"] for g in gpus] == [w if isinstance(w, str) else w["uuid"] for w in want]
    for g, w in zip(gpus, want, strict=True):
        if isinstance(w, str):
            assert g["parent_uuid"] is None and g["memory_total_bytes"] == 80 * GiB
            continue
        mem = ("memory_total_bytes", "memory_used_bytes", "memory_free_bytes", "memory_reserved_bytes")
        assert {k: g[k] for k in ("uuid", "name", *mem)} == {k: w[k] for k in ("uuid", "name", *mem)}
        assert (g["index"], g["pci_bus_id"], g["mig_mode"]) == (1, "00000000:0F:00.0", "enabled")
        assert g["parent_uuid"] == "GPU-bbbbbbbb-1111" and g["mig_devices"] == []


@pytest.mark.usefixtures("fake_nvml")
def test_mig_without_the_nvml_mig_calls_keeps_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML", "no-mig-api")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-deadbeef-1g10-4000-8000-000000000002")
    report = gpu_report(monkeypatch, "2")
    assert report["gpu_driver"]["source"] == "nvml"
    (g,) = report["gpus"]  # the instances are unknown: the GPU in MIG mode, as before
    assert (g["uuid"], g["mig_devices"], g["memory_total_bytes"]) == ("GPU-bbbbbbbb-1111", None, 80 * GiB)


@pytest.mark.usefixtures("fake_nvml")
@pytest.mark.parametrize("spec", [None, "MIG-deadbeef,0", "MIG-GPU-bbbbbbbb-1111/1/0", "1"])
def test_gpu_reports_match_the_schema(monkeypatch: pytest.MonkeyPatch, spec: str | None) -> None:
    if spec is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    jsonschema.validate(gpu_report(monkeypatch, "2"), SCHEMA)
    monkeypatch.setenv("FAKE_NVML", "fail")  # nvidia-smi: MIG devices unknown
    jsonschema.validate(gpu_report(monkeypatch, "mig"), SCHEMA)


class AnswerRoot:
    """A Root whose driver answers what a snapshot's gpus.json says (DirRoot.gpu_query passes dicts through)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer

    def exists(self, path: str) -> bool:
        return path == "/dev/nvidiactl"

    def gpu_query(self, timeout: float) -> dict[str, Any]:
        return self.answer


json_data = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
ints = st.integers(0, 3) | st.integers(0, 2**40) | st.sampled_from([-1, None, "12", True, 1.5])
mig_like = st.fixed_dictionaries(
    {"index": ints, "uuid": st.sampled_from(["MIG-a", "MIG-GPU-1a/1/0", 7, None]), "memory_total_bytes": ints},
    optional={"gpu_instance_id": ints, "compute_instance_id": ints, "name": st.sampled_from(["x", None, 3])},
)
gpu_like = st.fixed_dictionaries(
    {
        "index": ints,
        "memory_total_bytes": ints,
        "mig_mode": st.sampled_from(["enabled", "disabled", None, 3]),
        "mig_devices": st.lists(mig_like, max_size=3) | st.lists(mig_like, max_size=3) | json_data,
    },
    optional={
        "uuid": st.sampled_from(["GPU-0", "GPU-1a", "", None, 5]),
        "name": st.sampled_from(["A", "B", None, 3]),
        "memory_free_bytes": ints,
        "pci_bus_id": st.sampled_from(["0:1", None, 2]),
    },
)
specs = st.lists(st.sampled_from(["0", "1", "9", "-1", "GPU-1", "MIG-a", "MIG-GPU-1a/1/0", "all", "", " "]), max_size=4)


@settings(max_examples=examples(300))
@given(
    rows=st.lists(gpu_like | gpu_like | json_data, max_size=4),
    top=st.dictionaries(st.sampled_from(["source", "driver_version", "cuda_version", "error"]), json_data),
    spec=st.none() | specs.map(",".join) | st.text(max_size=12),
    order=st.sampled_from([None, "PCI_BUS_ID", "FASTEST_FIRST", ""]),
)
def test_any_gpus_json_gives_a_gpu_section_that_fits_the_schema(
    rows: list[Any], top: dict[str, Any], spec: str | None, order: str | None
) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "2,3"}
    if spec is not None:
        env["CUDA_VISIBLE_DEVICES"] = spec
    if order:
        env["CUDA_DEVICE_ORDER"] = order
    warnings: list[Any] = []
    gpus, driver = probe_gpus(AnswerRoot({**top, "gpus": rows}), env, warnings)  # type: ignore[arg-type]
    jsonschema.validate(gpus, SCHEMA["properties"]["gpus"])
    jsonschema.validate(driver, SCHEMA["properties"]["gpu_driver"])
    assert {w["code"] for w in warnings} <= {"gpu-probe-failed", "gpu-order-ambiguous"}


@pytest.mark.usefixtures("fake_smi")
def test_capture_stores_gpus_json_and_replay_filters(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAKE_SMI", "8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    snap = tmp_path / "gpu-node.tar.gz"
    capture(str(snap), source=DriverRoot())
    with tarfile.open(snap) as tar:
        stored = json.loads(tar.extractfile("gpus.json").read())  # type: ignore[union-attr]
        assert "dev/nvidiactl" in tar.getnames()
    assert len(stored["gpus"]) == 8  # the whole query; the filter is applied on replay
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    replay = probe(root=str(snap))
    assert [g["index"] for g in replay["gpus"]] == [5, 6]  # the snapshot's own CUDA_VISIBLE_DEVICES
    assert replay["gpu_driver"]["source"] == "nvidia-smi"


def test_plan_uses_the_gpus_of_a_snapshot(tmp_path: Path) -> None:
    root = tmp_path / "node"
    shutil.copytree(REPO / "tests" / "fixtures" / "original_503g_host_342g_v2_container" / "root", root)
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev" / "nvidiactl").write_text("")
    gpus, driver, _ = parse_smi_csv(
        "0, GPU-0, H100, 81559, 0, 81011, 548, 0:1, Disabled, 550\n"
        "1, GPU-1, H100, 81559, 40000, 41011, 548, 0:2, Disabled, 550\n"
    )
    (root / "gpus.json").write_text(json.dumps({"source": "nvidia-smi", "driver_version": driver, "gpus": gpus}))
    proc = run_oomguard("plan", "--json", "--root", str(root), "--per-job", "14GiB", "--gpu-per-job", "20GiB")
    out = json.loads(proc.stdout)
    # 81011 MiB free = 3 jobs of 20 GiB; 41011 MiB = 2; memory alone would fit 23.
    assert (out["concurrency"], out["binding"], out["capacity"]["gpu"]) == (5, "gpu", 5)


def test_plan_counts_a_mig_instance_by_its_own_memory(tmp_path: Path) -> None:
    """A container given one MIG instance: the plan divides the instance's free memory, not the GPU's."""
    root = tmp_path / "mig-node"
    shutil.copytree(REPO / "tests" / "fixtures" / "original_503g_host_342g_v2_container" / "root", root)
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev" / "nvidiactl").write_text("")
    environ = root / "proc" / "self" / "environ"
    environ.write_bytes(environ.read_bytes() + b"CUDA_VISIBLE_DEVICES=MIG-deadbeef-1g10-4000-8000-000000000002\0")
    gpu = {
        "index": 0,
        "uuid": "GPU-bbbbbbbb-1111",
        "name": "NVIDIA A100-SXM4-80GB",
        "memory_total_bytes": 80 * GiB,
        "memory_used_bytes": 10 * GiB,
        "memory_free_bytes": 70 * GiB,
        "memory_reserved_bytes": None,
        "pci_bus_id": "00000000:0F:00.0",
        "mig_mode": "enabled",
        "mig_devices": [MIG_3G, MIG_1G],
    }
    (root / "gpus.json").write_text(json.dumps({"source": "nvml", "driver_version": "535", "gpus": [gpu]}))
    proc = run_oomguard("plan", "--json", "--root", str(root), "--per-job", "1GiB", "--gpu-per-job", "4GiB")
    out = json.loads(proc.stdout)
    # 9715 MiB free in the 1g.10gb instance = 2 jobs of 4 GiB; the whole GPU's 70 GiB would give 17.
    assert (out["capacity"]["gpu"], out["concurrency"], out["binding"]) == (2, 2, "gpu")


# -- pinning ---------------------------------------------------------------------------------

UNPRIVILEGED = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]


def unprivileged_python(tmp_path: Path) -> tuple[str, str] | None:
    """(interpreter, PYTHONPATH) that uid 65534 can use, or None with the reason printed."""
    interp = "/usr/bin/python3"
    if not shutil.which("setpriv") or not os.access(interp, os.X_OK) or os.geteuid() != 0:
        print("SKIP reason: needs root, setpriv and /usr/bin/python3", file=sys.stderr)
        return None
    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "oomguard", src / "oomguard")
    for p in [tmp_path, *tmp_path.parents]:
        if p == Path("/"):
            break
        p.chmod(p.stat().st_mode | 0o005)
    for p in src.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return interp, str(src)


@pytest.mark.parametrize(("ulimit_kib", "probe_size", "ok"), [(1024, "4MiB", False), (8192, "4MiB", True)])
def test_real_mlock_probe_without_cap_ipc_lock(tmp_path: Path, ulimit_kib: int, probe_size: str, ok: bool) -> None:
    found = unprivileged_python(tmp_path)
    if found is None:
        pytest.skip("cannot run a child without CAP_IPC_LOCK here")
    interp, pythonpath = found
    hard = int(subprocess.run(["sh", "-c", "ulimit -H -l"], capture_output=True, text=True).stdout.strip() or 0)
    if hard < 8192:
        pytest.skip(f"the hard memlock limit is {hard} KiB, under the 8 MiB this test needs")
    script = f"ulimit -l {ulimit_kib}; exec {interp} -m oomguard check --json --no-gpu --probe-mlock {probe_size}"
    proc = subprocess.run(
        [*UNPRIVILEGED, "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": pythonpath, "PATH": "/usr/bin:/bin"},
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    ml = json.loads(proc.stdout)["memlock"]
    assert ml["cap_ipc_lock"] is False and ml["soft_bytes"] == ulimit_kib * 1024
    assert ml["probe"]["bytes"] == 4 * MiB and ml["probe"]["ok"] is ok
    if not ok:
        assert ml["probe"]["errno"] in (1, 12)  # EPERM or ENOMEM: over RLIMIT_MEMLOCK
    else:  # mlock'ed private memory is VmLck (RLIMIT_MEMLOCK's count), not shmem
        charged = ml["probe"]["charged"]
        assert (charged["vm_lck_bytes"], charged["rss_shmem_bytes"]) == (4 * MiB, 0), charged


def test_the_mlock_probe_says_where_the_kernel_charged_it() -> None:
    """VmLck rises by the size, RssShmem does not; the cgroup's shmem moves only with shmem pages."""
    proc = run_oomguard("check", "--json", "--no-gpu", "--probe-mlock", "6MiB")
    assert proc.returncode == 0, proc.stderr
    probe = json.loads(proc.stdout)["memlock"]["probe"]
    if not probe["ok"]:
        pytest.skip(f"mlock of 6 MiB is refused here ({probe['error']}): nothing was charged")
    charged = probe["charged"]
    assert charged["vm_lck_bytes"] == 6 * MiB
    assert charged["held"]["vm_lck_bytes"] - charged["before"]["vm_lck_bytes"] == 6 * MiB
    assert charged["rss_shmem_bytes"] == 0
    assert charged["cgroup_stat_file"] is None or charged["cgroup_stat_file"].endswith("/memory.stat")
    assert charged["cgroup_shmem_bytes"] is None or abs(charged["cgroup_shmem_bytes"]) < 6 * MiB


def test_pinned_probe_without_libcudart_is_skipped() -> None:
    proc = run_oomguard("check", "--json", "--no-gpu", "--probe-pinned", "1MiB")
    pinned = json.loads(proc.stdout)["memlock"]["pinned_probe"]
    if pinned["skipped"] is None:
        assert pinned["ok"] in (True, False)  # a machine with CUDA: the real call ran
    else:
        print(f"\nSKIP reason (CUDA pinned probe): {pinned['skipped']}", file=sys.stderr)
        assert pinned["ok"] is None and "no libcudart found" in pinned["skipped"]
        assert pinned["charged"] is None
