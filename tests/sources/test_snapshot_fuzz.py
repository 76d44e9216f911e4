"""No traceback from any snapshot: whole trees, written as a directory and as a tarball.

Hypothesis builds small trees (path -> content) shaped like what the probe reads, with any
text in them: NUL bytes, line separators other than ``\\n``, ``..`` and odd names in cgroup
paths, bytes that are not UTF-8. ``probe()`` must return a report that matches the schema,
or raise ``SnapshotError`` (exit 2) for a snapshot it cannot read; never any other exception.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import oomguard
from oomguard.errors import SnapshotError
from oomguard.probes import probe_system
from oomguard.sources.root import DirRoot, TarRoot
from tests.conftest import FIXTURES, REPO, run_oomguard
from tests.helpers.fuzz import examples

SCHEMA = json.loads(resources.files("oomguard").joinpath("schema.json").read_text())
VALIDATOR = jsonschema.validators.validator_for(SCHEMA)(SCHEMA)  # built once: validate() checks the schema each call
ODD = "\x00\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\t \\:"
name_chars = st.sampled_from(list("abcgjos0123456789._-") + list(ODD) + ["\udcff", "é"])
names = st.text(name_chars, min_size=1, max_size=6)
ns_paths = st.builds(
    lambda ups, parts: "/" + "/".join([".."] * ups + parts),
    st.integers(0, 2),
    st.lists(st.one_of(names, st.sampled_from(["..", ".", "", "sub", "job_1"])), max_size=3),
)
kernelish = st.text(st.sampled_from(list("0123456789 -:/,=.\n\tabcdefmxkBslu\\") + list(ODD)), max_size=120)
values = st.one_of(
    st.sampled_from(["max\n", "536870912\n", "9223372036854771712\n", "-1\n", "0\n", "", "4242\n", "1\n4242\n"]),
    st.sampled_from(["max 100000\n", "150000 100000\n", "0-3,8\n", "anon 1\ninactive_file 5\n", "oom_kill 2\n"]),
    kernelish,
    st.text(max_size=60),
)
CGROUP_FILES = [
    "memory.max", "memory.high", "memory.current", "memory.stat", "memory.events", "memory.swap.max",
    "cgroup.controllers", "cgroup.procs", "cpu.max", "cpuset.cpus.effective", "memory.limit_in_bytes",
    "memory.usage_in_bytes", "memory.memsw.limit_in_bytes", "cpu.cfs_quota_us", "cpu.cfs_period_us",
]  # fmt: skip
MOUNT_POINTS = ["/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu,cpuacct", "/proc/meminfo", "/"]


def _escape(path: str) -> str:
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")


@st.composite
def mountinfo(draw: st.DrawFn) -> str:
    lines = []
    for i in range(draw(st.integers(0, 3))):
        fstype, opts = draw(st.sampled_from([("cgroup2", "rw"), ("cgroup", "rw,memory"), ("cgroup", "rw,cpu,cpuacct")]))
        root = draw(ns_paths)
        mp = draw(st.sampled_from(MOUNT_POINTS))
        lines.append(f"{30 + i} 23 0:2{i} {_escape(root)} {mp} rw,relatime shared:9 - {fstype} cgroup {opts}")
    if draw(st.booleans()):
        lines.append(draw(kernelish))
    return "\n".join(lines) + "\n"


@st.composite
def proc_cgroup(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 3))):
        head = draw(st.sampled_from(["0::", "5:memory:", "3:cpu,cpuacct:", "1:name=systemd:"]))
        lines.append(head + draw(ns_paths))
    if draw(st.booleans()):
        lines.append(draw(kernelish))
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\r\n"]))


@st.composite
def coherent_layout(draw: st.DrawFn) -> dict[str, str | bytes]:
    """A cgroup, its mount and its files that agree (so the probe gets far), with odd names.

    Styles: mount root "/" (host view), root == path (v1 Docker), both under the same ``/..``
    prefix (nsenter -C), and the group hidden below a ``/..`` root (unshare -C, found through
    cgroup.procs).
    """
    v2 = draw(st.booleans())
    mp = "/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/memory"
    group = draw(st.lists(names, max_size=3))
    style = draw(st.sampled_from(["host", "docker", "nsenter", "unshare"]))
    ups = draw(st.integers(1, 2))
    on_disk = [*group]
    if style == "host":
        path, root = "/" + "/".join(group), "/"
    elif style == "docker":
        path = root = "/" + "/".join(group)
        on_disk = []
    elif style == "nsenter":
        path, root = "/" + "/".join([".."] * ups + group), "/" + "/".join([".."] * ups)
    else:
        path, root = "/" + "/".join(group), "/" + "/".join([".."] * ups)
        on_disk = [draw(names) for _ in range(ups)] + group
    head = "0::" if v2 else "5:memory:"
    fstype, opts = ("cgroup2", "rw,nsdelegate") if v2 else ("cgroup", "rw,memory")
    tree: dict[str, str | bytes] = {
        "proc/self/cgroup": f"{head}{path}\n",
        "proc/self/mountinfo": f"31 23 0:27 {_escape(root)} {mp} rw,relatime - {fstype} cgroup {opts}\n",
    }
    for i in range(len(on_disk) + 1):
        d = "/".join([mp.strip("/"), *on_disk[:i]])
        limit = "memory.max" if v2 else "memory.limit_in_bytes"
        tree[f"{d}/{limit}"] = draw(values)
        tree[f"{d}/{'memory.current' if v2 else 'memory.usage_in_bytes'}"] = draw(values)
        tree[f"{d}/memory.stat"] = draw(values)
        tree[f"{d}/cgroup.procs"] = draw(st.sampled_from(["4242\n", "1\n", ""]))
    return tree


@st.composite
def trees(draw: st.DrawFn) -> dict[str, str | bytes]:
    """path (as under "/") -> content; paths may hold any name character, NUL included."""
    tree: dict[str, str | bytes] = {
        "proc/self/cgroup": draw(proc_cgroup()),
        "proc/self/mountinfo": draw(mountinfo()),
        "proc/self/status": "Name:\t" + draw(names) + f"\nPid:\t{draw(st.sampled_from(['4242', '1', 'x', '']))}\n",
        "proc/meminfo": draw(st.sampled_from(["MemTotal: 16384 kB\nMemAvailable: 8192 kB\n", "MemTotal: 0 kB\n", ""])),
    }
    if draw(st.integers(0, 3)):
        tree.update(draw(coherent_layout()))
    for path in draw(st.lists(st.sampled_from(["proc/self/limits", "proc/self/environ", "proc/pressure/memory",
                                               "sys/devices/system/cpu/online", "gpus.json", "dev/nvidiactl",
                                               ".dockerenv", "proc/sys/kernel/osrelease"]), max_size=4)):  # fmt: skip
        tree[path] = draw(values)
    for _ in range(draw(st.integers(0, 4))):
        top = draw(st.sampled_from(MOUNT_POINTS[:3]))
        parts = draw(st.lists(names, max_size=2))
        tree["/".join([top.strip("/"), *parts, draw(st.sampled_from(CGROUP_FILES))])] = draw(values)
    for key in draw(st.lists(st.sampled_from(sorted(tree)), max_size=2)):
        tree[key] = draw(st.binary(max_size=40))  # not UTF-8: read with surrogateescape
    return tree


def _encode(content: str | bytes) -> bytes:
    return content if isinstance(content, bytes) else content.encode("utf-8", "surrogateescape")


def write_dir(tree: dict[str, str | bytes], base: str) -> None:
    """Write *tree* where the file system allows it: no NUL or empty name, no file in a file's place."""
    for path, content in tree.items():
        parts = path.split("/")
        if any(p in ("", ".", "..") or "\0" in p or len(p.encode("utf-8", "surrogateescape")) > 255 for p in parts):
            continue
        target = os.path.join(base, *parts)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(_encode(content))
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            continue  # a name already taken by a file or a directory


def write_tar(tree: dict[str, str | bytes], path: str) -> None:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, content in tree.items():
            data = _encode(content)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def probe_cleanly(spec: str) -> dict[str, Any] | None:
    """probe() of *spec*: the report (checked against the schema), or None for SnapshotError."""
    try:
        report: dict[str, Any] = oomguard.probe(root=spec, gpu_timeout=1.0)  # type: ignore[assignment]
    except SnapshotError as exc:
        assert "\n" not in str(exc), str(exc)
        return None
    VALIDATOR.validate(report)
    json.dumps(report)
    return report


FUZZ = settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


NUL_IN_GROUP: dict[str, str | bytes] = {
    "proc/meminfo": "MemTotal: 16384 kB\n",
    "proc/self/cgroup": "0::/a\0b\n",  # a traceback before: DirRoot opened the path
    "proc/self/mountinfo": "31 23 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup rw\n",
}


@FUZZ
@example(NUL_IN_GROUP)
@given(trees())
def test_any_directory_tree_gives_a_report(tree: dict[str, str | bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_dir(tree, tmp)
        if not os.path.exists(os.path.join(tmp, "proc")):
            return
        report = probe_cleanly(tmp)
        assert report is not None  # a directory with proc/meminfo or proc/self/cgroup is a snapshot


@FUZZ
@given(trees())
def test_any_tarball_gives_a_report_or_a_snapshot_error(tree: dict[str, str | bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tarball = os.path.join(tmp, "snap.tar.gz")
        try:
            write_tar(tree, tarball)
        except (UnicodeEncodeError, ValueError):
            return  # tarfile itself refuses the name
        probe_cleanly(tarball)


@settings(max_examples=examples(100))
@given(st.binary(max_size=400))
def test_garbage_tarball_is_a_snapshot_error(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snap.tar.gz")
        Path(path).write_bytes(data)
        probe_cleanly(path)


def test_dir_root_answers_a_nul_byte_in_a_path_with_a_failure(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    root = DirRoot(str(tmp_path))
    failure = root.read("/sys/fs/cgroup/a\0b/memory.max")
    assert not isinstance(failure, str) and failure.kind == "error" and "NUL" in failure.detail
    assert not isinstance(root.listdir("/a\0b"), list)
    assert root.exists("/a\0b") is False


def test_dir_root_stays_inside_the_tree(tmp_path: Path) -> None:
    (tmp_path / "snap" / "proc").mkdir(parents=True)
    (tmp_path / "secret").write_text("outside the snapshot")
    root = DirRoot(str(tmp_path / "snap"))
    assert not isinstance(root.read("/../secret"), str)
    assert not isinstance(root.read("/sys/fs/cgroup/../../../../secret"), str)


def test_dir_root_refuses_a_fifo_instead_of_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    failure = DirRoot(str(tmp_path)).read("/fifo")
    assert not isinstance(failure, str) and failure.detail == "not a regular file"


def test_tar_root_keeps_a_nul_byte_in_a_member_name(tmp_path: Path) -> None:
    """A pax header (here for the non-ASCII name) carries a NUL byte; a ustar name would end there."""
    tarball = str(tmp_path / "snap.tar.gz")
    write_tar({"proc/meminfo": "MemTotal: 1024 kB\n", "sys/fs/cgroup/a\0\u00e9/memory.max": "1\n"}, tarball)
    with tarfile.open(tarball) as tar:
        assert "sys/fs/cgroup/a\0\u00e9/memory.max" in tar.getnames()
    root = TarRoot(tarball)
    assert root.read("/sys/fs/cgroup/a\0\u00e9/memory.max") == "1\n"
    assert root.listdir("/sys/fs/cgroup") == ["a\0\u00e9"]
    assert not isinstance(root.read("/sys/fs/cgroup/a/memory.max"), str)


@pytest.mark.parametrize("case", ["snapshot_nul_bytes_in_cgroup_and_mountinfo", "v2_group_name_with_form_feed"])
def test_check_of_an_odd_snapshot_exits_0_without_a_traceback(case: str) -> None:
    proc = run_oomguard("check", "--root", str(FIXTURES / case / "root"))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr


def _undecodable_snapshot(base: Path) -> None:
    tree: dict[str, str | bytes] = {
        "proc/meminfo": "MemTotal: 16384 kB\n",
        "proc/self/cgroup": b"0::/job\xff\xfe\n",
        "proc/self/mountinfo": "30 23 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        "sys/fs/cgroup/job\udcff\udcfe/memory.max": "1048576\n",
    }
    write_dir(tree, str(base))


def _check_bytes(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **env}
    cmd = [sys.executable, "-m", "oomguard", "check", *args, "--root", str(root)]
    return subprocess.run(cmd, capture_output=True, env=full_env, timeout=60, check=False)


def test_a_snapshot_with_undecodable_bytes_is_read_as_it_is(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 come back as surrogates and name the same files again."""
    _undecodable_snapshot(tmp_path)
    report = probe_system(DirRoot(str(tmp_path)))
    assert report["memory"]["cgroup"]["path"] == "/job\udcff\udcfe"
    assert report["memory"]["cgroup"]["limit_bytes"] == 1048576
    for args in ((), ("--json",)):
        proc = _check_bytes(tmp_path, *args)
        assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr


def test_check_of_undecodable_bytes_under_a_strict_utf8_stdout(tmp_path: Path) -> None:
    _undecodable_snapshot(tmp_path)
    proc = _check_bytes(tmp_path, PYTHONIOENCODING="utf-8:strict")
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
