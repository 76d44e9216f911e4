"""tools/new_fixture.py: a `capture` snapshot becomes a fixture tree plus an expected.json skeleton."""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import oomguard
from oomguard.sources.root import DirRoot, TarRoot
from tests.helpers.corpus import FIXTURES, check_case, lookup
from tests.helpers.paths import REPO

TOOL = REPO / "tools" / "new_fixture.py"


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("new_fixture", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


nf = _load_tool()


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """An empty corpus with the real shared boilerplate."""
    fixtures = tmp_path / "fixtures"
    shutil.copytree(FIXTURES / "_shared", fixtures / "_shared")
    return fixtures


def without_root(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k != "root"}


def test_live_capture_becomes_a_fixture_that_probes_back_the_same(tmp_path: Path, corpus: Path) -> None:
    snap = tmp_path / "live.tar.gz"
    oomguard.capture(str(snap))
    proc = run_tool(str(snap), "live_node", "--fixtures", str(corpus))
    assert proc.returncode == 0, proc.stderr
    case = corpus / "live_node"

    # The tree: every file of the snapshot, same bytes (read through any shared link); no manifest.
    with tarfile.open(snap) as tar:
        members = {m.name.removeprefix("./"): tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    assert nf.MANIFEST in members
    written = {p.relative_to(case / "root").as_posix() for p in (case / "root").rglob("*") if p.is_file()}
    assert written == set(members) - {nf.MANIFEST}
    for rel in written:
        assert (case / "root" / rel).read_bytes() == members[rel], rel

    # The skeleton: placeholders to fill, fields and warnings from the probe of the snapshot itself.
    expected = json.loads((case / "expected.json").read_text())
    assert expected["description"].startswith("TODO") and expected["source"].startswith("TODO")
    assert f"captured with oomguard {oomguard.__version__} " in expected["source"]
    from_snapshot: dict[str, Any] = oomguard.probe(root=TarRoot(str(snap)))  # type: ignore[assignment]
    assert expected["fields"]["memory.effective_bytes"] == from_snapshot["memory"]["effective_bytes"]
    assert expected["fields"]["budget.bytes"] == from_snapshot["budget"]["bytes"]
    for dotted, value in expected["fields"].items():
        assert lookup(from_snapshot, dotted) == value, dotted
    assert [w["code"] for w in expected["warnings"]] == [w["code"] for w in from_snapshot["warnings"]]
    assert check_case(case) == []
    from_tree: dict[str, Any] = oomguard.probe(root=DirRoot(str(case / "root")))  # type: ignore[assignment]
    assert without_root(from_tree) == without_root(from_snapshot)


def test_a_fixture_tree_round_trips_and_shares_its_limits(tmp_path: Path, corpus: Path) -> None:
    source = FIXTURES / "budget_env_above_memory_high"
    snapshot = tmp_path / "snapshot"
    shutil.copytree(source / "root", snapshot)  # links followed: the snapshot holds a plain limits file
    assert not (snapshot / "proc/self/limits").is_symlink()

    assert run_tool(str(snapshot), "again", "--fixtures", str(corpus)).returncode == 0
    case = corpus / "again"
    limits = case / "root" / "proc/self/limits"
    assert limits.is_symlink() and not Path(limits.readlink()).is_absolute()
    assert limits.resolve() == (corpus / "_shared/limits/memlock-unlimited").resolve()
    expected = json.loads((case / "expected.json").read_text())
    original = json.loads((source / "expected.json").read_text())
    assert [w["code"] for w in expected["warnings"]] == [w["code"] for w in original["warnings"]]
    for made, pinned in zip(expected["warnings"], original["warnings"], strict=True):
        assert set(made["facts"]) <= set(pinned["facts"])  # the corpus pins these facts (and hand-picked ones)
    for dotted, value in original["fields"].items():
        if dotted in expected["fields"]:
            assert expected["fields"][dotted] == value, dotted
    assert check_case(case) == []


def test_args_are_probed_and_kept(tmp_path: Path, corpus: Path) -> None:
    proc = run_tool(
        str(FIXTURES / "budget_flag_above_limit" / "root"), "flagged", "--fixtures", str(corpus), "--budget", "600GiB"
    )
    assert proc.returncode == 0, proc.stderr
    expected = json.loads((corpus / "flagged" / "expected.json").read_text())
    assert expected["args"] == {"budget": "600GiB"}
    assert expected["fields"]["budget.source"] == "explicit"
    codes = [w["code"] for w in expected["warnings"]]
    assert codes == ["limit-may-be-hidden", "budget-exceeds-limit"]  # a private v2 cgroupns: said first
    assert {"600 GiB", "480 GiB", "hard ceiling"} <= set(expected["warnings"][1]["facts"])


def _tar_with(path: Path, name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE) -> None:
    with tarfile.open(path, "w:gz") as tar:
        meminfo = tarfile.TarInfo("proc/meminfo")
        meminfo.size = 16
        tar.addfile(meminfo, io.BytesIO(b"MemTotal: 1 kB\n\n"))
        info = tarfile.TarInfo(name)
        info.type = kind
        if kind == tarfile.SYMTYPE:
            info.linkname = "/etc/shadow"
        else:
            info.size = len(data)
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


@pytest.mark.parametrize(
    ("member", "kind", "message"),
    [
        ("../../escape", tarfile.REGTYPE, "points outside the tree"),
        ("proc/self/limits", tarfile.SYMTYPE, "is not a regular file"),
    ],
)
def test_unsafe_snapshots_are_refused(tmp_path: Path, corpus: Path, member: str, kind: bytes, message: str) -> None:
    snap = tmp_path / "bad.tar.gz"
    _tar_with(snap, member, kind=kind)
    proc = run_tool(str(snap), "bad", "--fixtures", str(corpus))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (corpus / "bad").exists()
    assert not (tmp_path / "escape").exists()


def test_a_directory_marker_stays_a_directory(tmp_path: Path, corpus: Path) -> None:
    snap = tmp_path / "gpu.tar.gz"
    with tarfile.open(snap, "w:gz") as tar:
        for name, data in (("proc/meminfo", b"MemTotal: 1024 kB\n"), ("dev", b""), ("dev/nvidiactl", b"")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    proc = run_tool(str(snap), "gpu_node", "--fixtures", str(corpus))
    assert proc.returncode == 0, proc.stderr
    assert (corpus / "gpu_node/root/dev/nvidiactl").is_file()


def test_usage_errors(tmp_path: Path, corpus: Path) -> None:
    root = str(FIXTURES / "k8s_v2_private_ns" / "root")
    assert run_tool(root, "Bad-Name", "--fixtures", str(corpus)).returncode == 2
    assert run_tool(str(tmp_path / "nothing"), "x", "--fixtures", str(corpus)).returncode == 2
    (tmp_path / "empty").mkdir()
    proc = run_tool(str(tmp_path / "empty"), "x", "--fixtures", str(corpus))
    assert proc.returncode == 2 and "not an oomguard snapshot" in proc.stderr
    assert run_tool(root, "twice", "--fixtures", str(corpus)).returncode == 0
    proc = run_tool(root, "twice", "--fixtures", str(corpus))
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert run_tool(root, "twice", "--fixtures", str(corpus), "--force").returncode == 0


def test_message_facts_are_the_numbers_sizes_and_paths() -> None:
    facts = nf.message_facts
    message = "the env budget 14 GiB is above the soft limit 12 GiB (memory.high); the worker will be throttled"
    assert facts(message) == [
        "14 GiB",
        "soft limit",
        "12 GiB",
        "(memory.high)",
    ]
    assert facts("usage (1288490188 bytes) is above the limit (1073741824 bytes)") == ["1288490188", "1073741824"]
    assert facts("/sys/fs/cgroup/x/memory.max holds 'unlimited', not a size or 'max'; ignored") == [
        "/sys/fs/cgroup/x/memory.max",
        "'unlimited'",
        "'max'",
    ]
    assert facts("/proc/meminfo is an lxcfs mount: MemTotal is the container's limit, not the host's RAM") == [
        "/proc/meminfo",
        "MemTotal",
    ]
    assert facts("the memory ceiling is unknown, so no budget could be computed") == []


def test_expected_json_layout() -> None:
    data = {"description": "d", "source": "s", "fields": {"a.b": 1}, "warnings": [{"code": "c", "facts": ["é"]}]}
    text = nf.dump_expected(data)
    assert json.loads(text) == data
    assert '    {"code": "c", "facts": ["é"]}\n' in text and text.endswith("}\n")
    assert '"warnings": []' in nf.dump_expected({**data, "warnings": []})
