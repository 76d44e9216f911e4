"""oomguard check inside real cgroups on this machine: limits set by the test, numbers asserted."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers.realcgroup import Group, limited_group, writable_parent

MiB = 1024 * 1024
GiB = 1024 * MiB

VERSION, PARENT = writable_parent()
if VERSION is None:
    print(f"\nSKIP real cgroup tests: {PARENT}", file=sys.stderr)
pytestmark = [
    pytest.mark.skipif(VERSION is None, reason=f"real cgroups unavailable: {PARENT}"),
    pytest.mark.usefixtures("clean_env"),
]


@pytest.fixture
def group() -> Iterator[Group]:
    with limited_group() as g:
        yield g


def check(g: Group, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:  # type: ignore[type-arg]
    full_env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    proc = g.run(sys.executable, "-m", "oomguard", "check", "--json", *args, env=full_env)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout) if proc.stdout else {}


def test_limited_group(group: Group) -> None:
    group.set_limit(1536 * MiB)
    rc, report = check(group)
    assert rc == 0
    mem = report["memory"]
    assert mem["effective_bytes"] == 1536 * MiB
    assert mem["limited_by"] == f"cgroup-v{VERSION}"
    assert mem["cgroup"]["path"].endswith("/" + group.dir.name)
    assert mem["host_total_bytes"] > mem["effective_bytes"]
    assert 0 < mem["usage_bytes"] < 1536 * MiB
    # 1.5 GiB basis: 10% is 153.6 MiB, so the margin is the 256 MiB floor.
    assert report["budget"]["bytes"] == 1280 * MiB
    assert report["budget"]["safety_margin_bytes"] == 256 * MiB


def test_limited_parent_unlimited_child(group: Group) -> None:
    group.set_limit(GiB)
    child = group.child()
    rc, report = check(child)
    assert rc == 0
    mem = report["memory"]
    assert mem["effective_bytes"] == GiB
    assert mem["cgroup"]["path"].endswith(f"/{group.dir.name}/child")
    assert mem["cgroup"]["levels"][0]["max_bytes"] is None  # the child itself: unlimited
    assert mem["cgroup"]["levels"][1]["max_bytes"] == GiB  # its parent carries the limit
    assert mem["limit_file"].startswith(str(group.dir))


def test_child_lower_than_parent(group: Group) -> None:
    group.set_limit(2 * GiB)
    child = group.child()
    child.set_limit(512 * MiB)
    _, report = check(child)
    assert report["memory"]["effective_bytes"] == 512 * MiB
    assert report["memory"]["limit_file"].startswith(str(child.dir))


def test_require_refuses_a_small_group(group: Group) -> None:
    group.set_limit(1536 * MiB)
    rc, _ = check(group, "--require", "2GiB")
    assert rc == 3
    rc, _ = check(group, "--require", "1GiB")
    assert rc == 0


def test_swap_limit(group: Group) -> None:
    if VERSION == 1:
        if not (group.dir / "memory.memsw.limit_in_bytes").exists():
            pytest.skip("swap accounting is off (no memory.memsw.limit_in_bytes)")
        group.set_limit(GiB)
        group.write("memory.memsw.limit_in_bytes", str(GiB + 256 * MiB))
    else:
        group.set_limit(GiB)
        group.write("memory.swap.max", str(256 * MiB))
    _, report = check(group)
    assert report["memory"]["swap"]["limit_bytes"] == 256 * MiB
    assert report["memory"]["swap"]["known"] is True


def test_oom_kill_is_counted(group: Group) -> None:
    """A real OOM kill inside the group shows in oomguard's OOM counter."""
    group.set_limit(64 * MiB)
    if VERSION == 1 and (group.dir / "memory.memsw.limit_in_bytes").exists():
        group.write("memory.memsw.limit_in_bytes", str(64 * MiB))  # no escape into swap
    hog = group.run(sys.executable, "-c", "b = bytearray(512 * 1024 * 1024); b[::4096] = b'x' * (len(b) // 4096)")
    assert hog.returncode == -9, hog  # SIGKILL from the OOM killer
    # Room for the interpreter that reads the counter (v1: memsw first, it must stay >= the limit).
    if VERSION == 1 and (group.dir / "memory.memsw.limit_in_bytes").exists():
        group.write("memory.memsw.limit_in_bytes", str(GiB))
    group.set_limit(GiB)
    _, report = check(group)
    oom = report["memory"]["oom"]
    if oom is None or oom["oom_kill"] is None:
        pytest.skip("this kernel exposes no oom_kill counter")
    assert oom["oom_kill"] >= 1
    seen = [w for w in report["warnings"] if w["code"] == "oom-kills-seen"]
    assert len(seen) == 1 and f"oom_kill counter is {oom['oom_kill']} ({oom['source']})" in seen[0]["message"]


def test_a_zero_budget_is_too_small(group: Group) -> None:
    group.set_limit(256 * MiB)  # the 256 MiB margin floor takes all of it
    rc, report = check(group)
    assert rc == 0 and report["budget"]["bytes"] == 0
    assert [w["code"] for w in report["warnings"] if w["code"].startswith("budget")] == ["budget-too-small"]
    rc, report = check(group, "--require", "1B")
    assert rc == 3


def test_capture_in_group_replays_the_same_limit(group: Group, tmp_path: Path) -> None:
    group.set_limit(768 * MiB)
    snap = tmp_path / "node.tar.gz"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OOMGUARD_BUDGET": "600MiB", "SECRET_TOKEN": "x"}
    proc = group.run(sys.executable, "-m", "oomguard", "capture", str(snap), env=env)
    assert proc.returncode == 0, proc.stderr
    # Replayed outside the group, from the snapshot alone.
    replay = json.loads(
        __import__("subprocess")
        .run(
            [sys.executable, "-m", "oomguard", "check", "--json", "--root", str(snap)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
        .stdout
    )
    assert replay["memory"]["effective_bytes"] == 768 * MiB
    assert replay["budget"] == {
        "bytes": 600 * MiB,
        "source": "env",
        "basis_bytes": 768 * MiB,
        "safety_margin_bytes": None,
        "requested": "600MiB",
    }
    import tarfile

    with tarfile.open(snap) as tar:
        environ = tar.extractfile("proc/self/environ").read().decode()  # type: ignore[union-attr]
    assert "OOMGUARD_BUDGET=600MiB" in environ
    assert "SECRET_TOKEN" not in environ  # snapshots carry only the variables oomguard reads


def verify_in(g: Group, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = g.run(sys.executable, "-m", "oomguard", "verify", "--json", "--hold", "0.5", *args, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    out["_stderr"] = proc.stderr
    return proc.returncode, out


def test_verify_delivers_the_auto_budget(group: Group) -> None:
    group.set_limit(768 * MiB)
    rc, out = verify_in(group)
    assert rc == 0, out
    assert out["delivered"] is True
    assert out["target_bytes"] == out["touched_bytes"] == 512 * MiB  # 768 MiB - 256 MiB margin
    assert out["oom_kills"] == 0
    assert all(c["outcome"] == "ok" for c in out["children"])
    assert out["children_vmhwm_sum_bytes"] >= 512 * MiB  # labelled as the sum it is
    assert 512 * MiB <= out["group_peak_bytes"] < 768 * MiB  # the group's own peak while verify ran
    assert out["fault_in_bytes_per_second"] > 0
    # stderr is no terminal here: one summary line, no per-child lines
    n = len(out["children"])
    assert re.fullmatch(
        rf"oomguard verify: {n} children touched 512 MiB of 512 MiB in \d+\.\ds \(\d+\.\d\d GB/s\)\n", out["_stderr"]
    ), out["_stderr"]


def test_verify_catches_a_budget_sized_from_memtotal(group: Group) -> None:
    """The outage: a budget far above the container limit. verify sees the OOM kill and exits 4."""
    group.set_limit(512 * MiB)
    if VERSION == 1 and (group.dir / "memory.memsw.limit_in_bytes").exists():
        group.write("memory.memsw.limit_in_bytes", str(512 * MiB))
    rc, out = verify_in(group, "--budget", "2GiB")
    assert rc == 4, out  # the verify process itself survived to say so
    assert out["delivered"] is False
    assert out["oom_kills"] >= 1
    assert "oom-kill" in {c["outcome"] for c in out["children"]}
    assert any(w["code"] == "budget-exceeds-limit" for w in out["warnings"])


def test_verify_a_plan_and_a_fraction(group: Group) -> None:
    group.set_limit(GiB)
    rc, out = verify_in(group, "--per-job", "128MiB", "--baseline", "64MiB", "--fraction", "0.5")
    assert rc == 0, out
    # budget 768 MiB: (768 - 64) / 128 = 5 jobs; half of 64 + 5 x 128 MiB
    assert out["plan"]["concurrency"] == 5
    # 6 shares (the baseline and 5 jobs) over at most --children processes (default: the CPUs, up to 8)
    assert len(out["children"]) == min(6, out["children_limit"])
    assert (out["jobs"], out["jobs_touched"]) == (5, 5)
    assert sum(c["baseline_bytes"] for c in out["children"]) == 32 * MiB
    assert out["target_bytes"] == (64 + 5 * 128) * MiB // 2
