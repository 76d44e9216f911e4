"""A snapshot tarball is read within limits (``sources/root.py``): files in all, one file, members,
and the decompressed stream itself. Beyond one, ``check --root`` says which in one line and exits 2,
after reading no more than the limit: memory stays bounded (measured on a real process)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from oomguard.errors import EXIT_USAGE
from oomguard.sources.root import MAX_FILE_BYTES, MAX_SNAPSHOT_BYTES, MAX_SNAPSHOT_MEMBERS
from tests.conftest import FIXTURES, REPO, run_oomguard
from tests.helpers.hostile import MiB, zero_tarball

MEMINFO = b"MemTotal: 16384 kB\n"


def _tar(path: Path, members: dict[str, bytes], mode: str = "w:gz", pax: dict[str, str] | None = None) -> str:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if pax:
                info.pax_headers = pax
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def _refused(tarball: str, words: str) -> None:
    proc = run_oomguard("check", "--json", "--root", tarball)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"oomguard: error: --root: snapshot {tarball!r} is too large: "), proc.stderr
    assert words in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def zeros(tmp_path_factory: pytest.TempPathFactory) -> str:
    """200 members of 1 MiB of zeros: 200 MiB to read whole, 0.6 MB on disk."""
    return zero_tarball(str(tmp_path_factory.mktemp("zeros") / "zeros.tar.gz"), 200)


def test_files_above_the_total_are_refused(zeros: str) -> None:
    _refused(zeros, f"its files hold more than {MAX_SNAPSHOT_BYTES >> 20} MiB")


def test_memory_stays_bounded_on_a_snapshot_of_zeros(zeros: str) -> None:
    """The process's peak RSS (ru_maxrss of the one child) stays far below the 200 MiB it would
    hold if every member were read (2,500 of them reached 2.5 GB before the limits)."""
    probe = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run([sys.executable, '-m', 'oomguard', 'check', '--root', sys.argv[1]], capture_output=True)\n"
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, "-c", probe, zeros], capture_output=True, text=True, env=env, timeout=120)
    code, max_rss_kib = (int(x) for x in out.stdout.split())
    assert code == EXIT_USAGE, out
    assert max_rss_kib < 120 * 1024, f"peak RSS {max_rss_kib} KiB"


def test_a_file_above_the_file_limit_is_refused(tmp_path: Path) -> None:
    big = _tar(
        tmp_path / "big.tar.gz", {"proc/meminfo": MEMINFO, "sys/fs/cgroup/memory.stat": bytes(MAX_FILE_BYTES + 1)}
    )
    _refused(big, "/sys/fs/cgroup/memory.stat holds more than 1 MiB")


def test_a_file_at_the_file_limit_is_read(tmp_path: Path) -> None:
    at = _tar(tmp_path / "at.tar.gz", {"proc/meminfo": MEMINFO, "sys/fs/cgroup/memory.stat": bytes(MAX_FILE_BYTES)})
    proc = run_oomguard("check", "--json", "--root", at)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["memory"]["host_total_bytes"] == 16384 * 1024


def test_too_many_members_are_refused(tmp_path: Path) -> None:
    members = {"proc/meminfo": MEMINFO, **{f"empty/{i}": b"" for i in range(MAX_SNAPSHOT_MEMBERS)}}
    _refused(_tar(tmp_path / "many.tar.gz", members), f"more than {MAX_SNAPSHOT_MEMBERS} members")


def test_a_huge_header_stops_at_the_stream_limit(tmp_path: Path) -> None:
    """A pax header is read whole by tarfile before any member: the counted stream cuts it."""
    tarball = _tar(
        tmp_path / "pax.tar.gz", {"proc/meminfo": MEMINFO}, pax={"comment": "x" * (2 * MAX_SNAPSHOT_BYTES + MiB)}
    )
    _refused(tarball, "MiB of tar data")


@pytest.mark.parametrize("mode", ["w:", "w:bz2", "w:xz"])
def test_other_compressions_are_still_read(tmp_path: Path, mode: str) -> None:
    case = FIXTURES / "docker_v2_swap_max" / "root"
    members = {str(p.relative_to(case)): p.read_bytes() for p in sorted(case.rglob("*")) if p.is_file()}
    tarball = _tar(tmp_path / "snap.tar", members, mode)
    direct = run_oomguard("check", "--json", "--root", str(case))
    replay = run_oomguard("check", "--json", "--root", tarball)
    assert replay.returncode == direct.returncode == 0, replay.stderr
    assert json.loads(replay.stdout)["memory"] == json.loads(direct.stdout)["memory"]


@pytest.mark.parametrize("what", ["fifo", "/dev/zero"])
def test_a_fifo_or_a_device_as_root_is_one_line(tmp_path: Path, what: str) -> None:
    path = what
    if what == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    proc = run_oomguard("check", "--root", path)
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr == f"oomguard: error: --root: {path!r} is neither a snapshot directory nor a regular file\n"
