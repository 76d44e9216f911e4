"""Snapshots: capture writes what the probe reads; a replay computes what the node computed."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oomguard import capture, probe
from oomguard.errors import UsageError
from oomguard.sources.root import DirRoot, Failure, LiveRoot, TarRoot
from oomguard.sources.snapshot import ENV_KEEP, ENV_NAME_ONLY_PREFIXES, keep_env
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


# --- the environment: an allow-list (tokens never enter a snapshot) ------------------------------

SECRETS = {
    "OOMGUARD_AGENT_TOKEN": "agent-secret-0xA1",
    "OOMGUARD_VIEWER_TOKEN": "viewer-secret-0xB2",
    "OOMGUARD_DATABASE": "postgresql://u:db-secret-0xC3@host/db",
    "VAST_API_KEY": "vast-secret-0xD4",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-0xE5",
    "HF_TOKEN": "hf-secret-0xF6",
}
NEEDED = {
    "OOMGUARD_BUDGET": "2GiB",
    "container": "podman",
    "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    "CONTAINER_ID": "12345",
    "VAST_CONTAINERLABEL": "C.12345",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "NVIDIA_VISIBLE_DEVICES": "all",
}


class ReadEnv(dict[str, str]):
    """An environment that remembers which variables were read by name, and whether it was iterated."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(env)
        self.read: set[str] = set()
        self.iterated = False

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)

    def __iter__(self) -> Iterator[str]:
        self.iterated = True
        return super().__iter__()

    def keys(self) -> Any:
        self.iterated = True
        return super().keys()

    def items(self) -> Any:
        self.iterated = True
        return super().items()


class EnvRoot(DirRoot):
    """A fixture tree whose process environment is *env*."""

    def __init__(self, base: str, env: dict[str, str]) -> None:
        super().__init__(base)
        self.env = env

    def environ(self) -> dict[str, str]:
        return self.env


def _a_fixture() -> Path:
    return next(p / "root" for p in sorted(FIXTURES.iterdir()) if (p / "root" / "proc").is_dir())


def test_the_allow_list_is_exactly_what_the_probe_reads() -> None:
    """A probe (budget included) over an environment that records reads: every variable read by
    name is kept, and every kept one is read (no stale entry). Iteration is for the VAST_ prefix."""
    env = ReadEnv({**NEEDED, **SECRETS, "VAST_TCP_PORT_22": "40022"})
    probe(root=EnvRoot(str(_a_fixture()), env))
    assert env.read == set(ENV_KEEP)
    assert ENV_NAME_ONLY_PREFIXES == ("VAST_",)


def test_tokens_never_enter_a_snapshot(tmp_path: Path) -> None:
    env = {**NEEDED, **SECRETS, "VAST_TCP_PORT_22": "40022", "PATH": "/usr/bin", "HOME": "/root"}
    snap = tmp_path / "node.tar.gz"
    capture(str(snap), source=EnvRoot(str(_a_fixture()), env))
    with tarfile.open(snap) as tar:
        blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    for secret in SECRETS.values():
        leaks = [name for name, data in blobs.items() if secret.encode() in data]
        assert leaks == [], f"{secret} leaked into {leaks}"
    written = blobs["proc/self/environ"].decode()
    assert written == "".join(
        f"{k}={v}\0" for k, v in sorted({**NEEDED, "VAST_API_KEY": "", "VAST_TCP_PORT_22": ""}.items())
    )
    assert keep_env(env) == {**NEEDED, "VAST_API_KEY": "", "VAST_TCP_PORT_22": ""}


def test_a_replay_computes_what_the_node_computed_from_the_kept_variables(tmp_path: Path) -> None:
    env = {**NEEDED, **SECRETS}
    root = EnvRoot(str(_a_fixture()), env)
    snap = tmp_path / "node.tar.gz"
    capture(str(snap), source=root)
    live, replay = probe(root=EnvRoot(str(_a_fixture()), env), gpu=False), probe(root=str(snap), gpu=False)
    for section in ("container", "budget"):
        assert replay[section] == live[section], section
    assert replay["gpu_driver"]["visibility"] == live["gpu_driver"]["visibility"]
    assert replay["container"]["provider"] == "vast.ai" and replay["budget"]["requested"] == "2GiB"
