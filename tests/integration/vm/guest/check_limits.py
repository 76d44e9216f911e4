"""cgroup v2 limits on a real kernel: each test writes the files and asserts oomguard's numbers."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.vm.guest.cg import CGROOT, HOG, PYTHON, Group, MiB, check, meminfo_bytes, warning_codes

GroupFactory = Callable[..., Group]


def test_leaf_memory_max(group: GroupFactory) -> None:
    g = group(300 * MiB)
    report = check(g)
    mem = report["memory"]
    assert mem["effective_bytes"] == 300 * MiB
    assert mem["limited_by"] == "cgroup-v2"
    assert mem["limit_file"] == f"{g.path}/memory.max"
    assert mem["host_total_bytes"] == meminfo_bytes("MemTotal")
    cg = mem["cgroup"]
    assert (cg["version"], cg["path"], cg["mount"], cg["mount_root"], cg["dir"]) == (
        2,
        g.rel,
        "/sys/fs/cgroup",
        "/",
        str(g.path),
    )
    assert cg["ancestors_visible"] is True
    assert cg["levels"] == [
        {"dir": str(g.path), "max_bytes": 300 * MiB, "high_bytes": None},
        {"dir": "/sys/fs/cgroup", "max_bytes": None, "high_bytes": None},
    ]
    # 300 MiB basis: 10% is 30 MiB, so the margin is the 256 MiB floor.
    assert report["budget"] == {
        "bytes": 44 * MiB,
        "source": "auto",
        "basis_bytes": 300 * MiB,
        "safety_margin_bytes": 256 * MiB,
        "requested": "auto",
    }
    assert "outside-mount-root" not in warning_codes(report)


def test_limit_on_the_parent_only(group: GroupFactory) -> None:
    parent = group(400 * MiB)
    child = parent.child("child")  # memory.max stays "max"
    assert child.read("memory.max").strip() == "max"
    mem = check(child)["memory"]
    assert mem["effective_bytes"] == 400 * MiB
    assert mem["limit_file"] == f"{parent.path}/memory.max"
    assert mem["cgroup"]["path"] == f"{parent.rel}/child"
    assert [lv["max_bytes"] for lv in mem["cgroup"]["levels"]] == [None, 400 * MiB, None]


@pytest.mark.parametrize(
    ("limits", "binding"),
    [
        ((600, 200, 500), 1),  # the middle one binds
        ((150, 600, None), 0),  # the top one binds, the leaf unlimited
        ((600, 500, 200), 2),  # the leaf binds
    ],
    ids=["middle", "top", "leaf"],
)
def test_three_levels_the_lowest_wins(group: GroupFactory, limits: tuple[int | None, ...], binding: int) -> None:
    a = group(None if limits[0] is None else limits[0] * MiB)
    b = a.child("b", None if limits[1] is None else limits[1] * MiB)
    c = b.child("c", None if limits[2] is None else limits[2] * MiB)
    mem = check(c)["memory"]
    chain = [a, b, c]
    assert mem["effective_bytes"] == min(x for x in limits if x is not None) * MiB
    assert mem["limit_file"] == f"{chain[binding].path}/memory.max"
    assert mem["cgroup"]["limit_file"] == mem["limit_file"]
    levels = mem["cgroup"]["levels"]
    assert [lv["dir"] for lv in levels] == [str(c.path), str(b.path), str(a.path), str(CGROOT)]
    assert [lv["max_bytes"] for lv in levels] == [None if x is None else x * MiB for x in reversed(limits)] + [None]


def test_memory_high_below_max_is_the_soft_limit_and_the_budget_basis(group: GroupFactory) -> None:
    g = group(512 * MiB)
    g.write("memory.high", 384 * MiB)
    report = check(g)
    mem = report["memory"]
    assert mem["effective_bytes"] == 512 * MiB  # memory.high throttles, it does not kill
    assert mem["soft_limit_bytes"] == 384 * MiB
    assert mem["soft_limit_file"] == f"{g.path}/memory.high"
    assert mem["cgroup"]["levels"][0] == {"dir": str(g.path), "max_bytes": 512 * MiB, "high_bytes": 384 * MiB}
    assert report["budget"]["basis_bytes"] == 384 * MiB
    assert report["budget"]["safety_margin_bytes"] == 256 * MiB
    assert report["budget"]["bytes"] == 128 * MiB


@pytest.mark.parametrize(
    ("swap_max", "expected"),
    [("max", None), (str(64 * MiB), 64 * MiB), ("0", 0)],
    ids=["unlimited", "64MiB", "zero"],
)
def test_memory_swap_max(group: GroupFactory, swap_max: str, expected: int | None) -> None:
    g = group(256 * MiB)
    g.write("memory.swap.max", swap_max)
    swap = check(g)["memory"]["swap"]
    assert swap["limit_bytes"] == expected
    assert swap["known"] is True
    assert swap["host_total_bytes"] == meminfo_bytes("SwapTotal") == 0  # the VM has no swap
    assert swap["usage_bytes"] == int(g.read("memory.swap.current"))


def test_usage_and_working_set_of_the_group(group: GroupFactory) -> None:
    g = group(256 * MiB)
    hold = (
        "import sys; n = 96 << 20; b = bytearray(n); b[::4096] = b'x' * (n // 4096); "
        "print('ready', flush=True); sys.stdin.read()"
    )
    holder = g.popen(PYTHON, "-c", hold, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        report = check(g)
        peak_after = int(g.read("memory.peak"))
    finally:
        holder.communicate("", timeout=30)
    mem = report["memory"]
    assert 96 * MiB < mem["usage_bytes"] <= peak_after  # the holder's 96 MiB + two interpreters
    assert mem["working_set_bytes"] == mem["usage_bytes"] - mem["inactive_file_bytes"]
    assert mem["available_bytes"] == min(256 * MiB - mem["working_set_bytes"], mem["host_available_bytes"])


def test_headroom_counts_a_sibling_under_the_parent_limit(group: GroupFactory) -> None:
    """issue #11 item 4: the parent's memory.current counts the sibling's 160 MiB, and a charge fails at
    the parent's 400 MiB first, so the headroom is below 400 - 160 MiB, not 400 MiB - our own usage."""
    parent = group(400 * MiB)
    sibling = parent.child("sibling")
    me = parent.child("me")
    hold = (
        "import sys; n = 160 << 20; b = bytearray(n); b[::4096] = b'x' * (n // 4096); "
        "print('ready', flush=True); sys.stdin.read()"
    )
    holder = sibling.popen(PYTHON, "-c", hold, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        report = check(me)
        parent_after = int(parent.read("memory.current"))
    finally:
        holder.communicate("", timeout=30)
    mem = report["memory"]
    assert mem["effective_bytes"] == 400 * MiB
    assert mem["limit_file"] == f"{parent.path}/memory.max"
    assert mem["working_set_bytes"] < 160 * MiB  # our own group holds one interpreter, not the sibling
    assert mem["available_bytes"] <= 400 * MiB - 160 * MiB
    assert mem["available_bytes"] >= 400 * MiB - parent_after - 64 * MiB  # parent's usage, give or take the probe


def test_oom_kill_and_pressure_of_the_group(group: GroupFactory) -> None:
    """A real OOM kill: memory.events counts it, memory.pressure shows the reclaim stalls before it."""
    g = group(64 * MiB)
    hog = g.run(PYTHON, "-c", HOG, str(256 * MiB))
    assert hog.returncode == -9, hog  # SIGKILL from the OOM killer
    g.write("memory.max", 256 * MiB)  # room for the interpreter that reads the counters
    mem = check(g)["memory"]
    events = g.keyed("memory.events")
    assert events["oom_kill"] == 1
    assert mem["oom"] == {
        "source": f"{g.path}/memory.events",
        "oom": events["oom"],
        "oom_kill": 1,
        "oom_group_kill": events["oom_group_kill"],
    }
    pressure = mem["pressure"]
    assert (pressure["source"], pressure["file"]) == ("cgroup", f"{g.path}/memory.pressure")
    some_total = int(Path(pressure["file"]).read_text().split("total=")[1].split()[0])
    assert 0 < pressure["some"]["total"] <= some_total  # microseconds stalled, as the kernel counts them
    assert set(pressure["some"]) == {"avg10", "avg60", "avg300", "total"}
    assert set(pressure["full"]) == {"avg10", "avg60", "avg300", "total"}
