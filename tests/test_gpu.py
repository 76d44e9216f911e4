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

import pytest

from oomguard import capture, probe
from oomguard.probes.gpu import visible
from oomguard.sources.gpu import parse_smi_csv
from oomguard.sources.root import LiveRoot
from tests.conftest import REPO, run_oomguard

FAKES = Path(__file__).parent / "fakes"
GiB = 1024**3
MiB = 1024**2


class DriverRoot(LiveRoot):
    """The live system, but with an NVIDIA driver present."""

    def exists(self, path: str) -> bool:
        return path == "/dev/nvidiactl" or super().exists(path)


@pytest.fixture
def fake_smi(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PATH", f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}")
    for var in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "OOMGUARD_BUDGET"):
        monkeypatch.delenv(var, raising=False)
    yield
    sys.modules.pop("pynvml", None)  # a fake NVML imported by a test must not outlive it


def gpu_report(monkeypatch: pytest.MonkeyPatch, mode: str, **kw: Any) -> dict[str, Any]:
    monkeypatch.setenv("FAKE_SMI", mode)
    return probe(root=DriverRoot(), **kw)  # type: ignore[return-value]


def codes(report: dict[str, Any]) -> list[str]:
    return [w["code"] for w in report["warnings"]]


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
    }
    if count:
        g = report["gpus"][-1]
        assert g["index"] == count - 1 and g["name"] == "NVIDIA H100 80GB HBM3"
        assert g["memory_total_bytes"] == 81559 * MiB and g["memory_reserved_bytes"] == 548 * MiB
        assert g["memory_used_bytes"] + g["memory_free_bytes"] + g["memory_reserved_bytes"] == 81559 * MiB
        assert g["pci_bus_id"].startswith("00000000:") and g["mig_mode"] == "disabled"
    assert "gpu-probe-failed" not in codes(report)


@pytest.mark.usefixtures("fake_smi")
def test_mig_and_old_drivers(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [g["mig_mode"] for g in gpu_report(monkeypatch, "mig")["gpus"]] == ["disabled", "enabled"]
    old = gpu_report(monkeypatch, "old")  # no memory.reserved field: asked again without it
    assert old["gpus"][0]["memory_reserved_bytes"] is None and old["gpus"][0]["mig_mode"] is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1c2b3a4d-0000")
    assert [g["index"] for g in gpu_report(monkeypatch, "mig")["gpus"]] == [1]


@pytest.mark.usefixtures("fake_smi")
@pytest.mark.parametrize(
    ("mode", "words"),
    [("hang", "did not answer within 0.5 s"), ("fail", "failed (exit 9)"), ("garbage", "not GPU rows")],
)
def test_broken_nvidia_smi_is_a_warning(monkeypatch: pytest.MonkeyPatch, mode: str, words: str) -> None:
    report = gpu_report(monkeypatch, mode, gpu_timeout=0.5)
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
    }
    a, b = report["gpus"]
    assert (a["uuid"], a["mig_mode"], b["mig_mode"]) == ("GPU-aaaaaaaa-0000", None, "enabled")
    assert a["memory_free_bytes"] == 80 * GiB - 2 * GiB - 512 * MiB and a["memory_reserved_bytes"] == 512 * MiB
    assert a["pci_bus_id"] == "00000000:07:00.0"
    import pynvml  # the fake

    assert pynvml.shutdowns  # NVML is always shut down
    monkeypatch.setenv("FAKE_NVML", "fail")  # NVML fails: nvidia-smi answers instead
    assert gpu_report(monkeypatch, "1")["gpu_driver"]["source"] == "nvidia-smi"


GPUS = parse_smi_csv("\n".join(f"{i}, GPU-{i}abc{i}, X, 100, 1, 98, 1, 0:{i}, Disabled, 1" for i in range(4)))[0]


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, [0, 1, 2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "2,0"}, [2, 0]),  # the driver's own indices, in the order given
        ({"CUDA_VISIBLE_DEVICES": "GPU-3abc3,1"}, [3, 1]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-1ab"}, [1]),  # a unique UUID prefix
        ({"CUDA_VISIBLE_DEVICES": "1,7,2"}, [1]),  # CUDA stops at the first entry it cannot resolve
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, []),
        ({"NVIDIA_VISIBLE_DEVICES": "none"}, []),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, [0, 1, 2, 3]),
        ({"NVIDIA_VISIBLE_DEVICES": "1,2,3", "CUDA_VISIBLE_DEVICES": "3"}, [3]),
    ],
)
def test_visibility(env: dict[str, str], want: list[int]) -> None:
    assert [g["index"] for g in visible(GPUS, env)] == want


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


def test_pinned_probe_without_libcudart_is_skipped() -> None:
    proc = run_oomguard("check", "--json", "--no-gpu", "--probe-pinned", "1MiB")
    pinned = json.loads(proc.stdout)["memlock"]["pinned_probe"]
    if pinned["skipped"] is None:
        assert pinned["ok"] in (True, False)  # a machine with CUDA: the real call ran
    else:
        print(f"\nSKIP reason (CUDA pinned probe): {pinned['skipped']}", file=sys.stderr)
        assert pinned["ok"] is None and "no libcudart found" in pinned["skipped"]
