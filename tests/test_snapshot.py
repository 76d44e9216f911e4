"""Snapshots: capture writes what the probe reads; a replay computes what the node computed."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from oomguard import capture, probe
from oomguard.errors import UsageError
from oomguard.sources.root import DirRoot, Failure, LiveRoot, TarRoot
from tests.conftest import FIXTURES, run_oomguard

pytestmark = pytest.mark.usefixtures("clean_env")


def test_capture_then_replay_matches_live(tmp_path: Path) -> None:
    snap = tmp_path / "node.tar.gz"
    n = capture(str(snap))
    with tarfile.open(snap) as tar:
        names = set(tar.getnames())
    assert n == len(names)
    for needed in ("proc/self/cgroup", "proc/self/mountinfo", "proc/meminfo", "proc/self/status", "proc/self/environ"):
        assert needed in names
    live, replay = probe(), probe(root=str(snap))
    for section in ("container", "memlock", "cpu"):
        assert replay[section] == live[section], section
    for key in ("effective_bytes", "limited_by", "host_total_bytes", "soft_limit_bytes", "cgroup"):
        assert replay["memory"][key] == live["memory"][key], key


def test_capture_refuses_to_overwrite(tmp_path: Path) -> None:
    snap = tmp_path / "node.tar.gz"
    snap.write_text("precious")
    with pytest.raises(UsageError, match="exists"):
        capture(str(snap))
    assert snap.read_text() == "precious"
    proc = run_oomguard("capture", str(snap))
    assert proc.returncode == 2 and "use --force" in proc.stderr
    assert run_oomguard("capture", "--force", str(snap)).returncode == 0
    assert tarfile.is_tarfile(snap)


def test_capture_to_unwritable_place_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "no-such-dir" / "x.tar.gz"
    proc = run_oomguard("capture", str(target))
    assert proc.returncode == 2 and proc.stderr.startswith("oomguard: error: capture: cannot write")
    assert not target.parent.exists()


def test_tar_and_dir_roots_agree(tmp_path: Path) -> None:
    """A fixture tree packed as a tarball reads exactly as the tree does."""
    case = next(p for p in sorted(FIXTURES.iterdir()) if (p / "root").is_dir())
    tarball = tmp_path / "case.tar.gz"
    # Fixtures share boilerplate files through symlinks (tests/fixtures/_shared); a capture holds
    # plain files only, so the tarball gets what the links point at.
    with tarfile.open(tarball, "w:gz", dereference=True) as tar:
        tar.add(case / "root", arcname=".")
    a = probe(root=DirRoot(str(case / "root")))
    b = probe(root=TarRoot(str(tarball)))
    a.pop("root"), b.pop("root")  # type: ignore[misc]
    assert a == b


def test_tar_root_lists_and_normalises(tmp_path: Path) -> None:
    src = tmp_path / "tree"
    (src / "proc" / "self").mkdir(parents=True)
    (src / "proc" / "meminfo").write_text("MemTotal: 1 kB\n")
    (src / ".dockerenv").write_text("")
    tarball = tmp_path / "t.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(src, arcname="./")
    root = TarRoot(str(tarball))
    assert root.read("/proc/meminfo") == "MemTotal: 1 kB\n"
    assert root.exists("/.dockerenv") and root.exists("/proc/self")
    assert root.listdir("/proc") == ["meminfo", "self"]
    outside = root.read("/proc/../etc/shadow")
    assert isinstance(outside, Failure) and outside.kind == "missing"


def test_an_empty_file_is_text_and_a_failure_is_not_falsy(tmp_path: Path) -> None:
    """Failure has no __bool__: `if not text` would mix up an empty file and a missing one."""
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "stat").write_text("")
    (tmp_path / "proc" / "self").mkdir()
    root = DirRoot(str(tmp_path))
    assert root.read("/proc/1/stat") == ""
    missing = root.read("/proc/2/stat")
    assert isinstance(missing, Failure) and missing.kind == "missing" and missing
    assert root.listdir("/proc") == ["1", "self"]
    assert isinstance(root.listdir("/proc/nope"), Failure)
    assert str(os.getpid()) in LiveRoot().listdir("/proc")  # type: ignore[operator]


def test_snapshot_environment_comes_from_the_tree_not_the_caller(tmp_path: Path) -> None:
    case = tmp_path / "tree"
    (case / "proc" / "self").mkdir(parents=True)
    (case / "proc" / "meminfo").write_text("MemTotal:       8000000 kB\n")
    (case / "proc" / "self" / "environ").write_text("OOMGUARD_BUDGET=2GiB\0")
    env = {**os.environ, "OOMGUARD_BUDGET": "5GiB"}
    proc = run_oomguard("check", "--json", "--root", str(case), env=env)
    assert proc.returncode == 0, proc.stderr
    assert '"requested": "2GiB"' in proc.stdout
