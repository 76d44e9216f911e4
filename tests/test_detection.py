"""Detection rules of issue #11 on small trees: headroom over ancestors, CPU warnings, no-cgroup.

The fixture corpus (tests/fixtures) pins real-world layouts; these tests build trees with
hypothesis or by hand to check each rule's edges.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from oomguard.probes import probe_system
from oomguard.sources.root import DirRoot

MiB = 1 << 20
MEMINFO = "MemTotal: 67108864 kB\nMemAvailable: {avail} kB\n"  # 64 GiB of RAM


def write(base: Path, files: dict[str, str]) -> DirRoot:
    for rel, text in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if text == "<dir>":
            p.mkdir()
        else:
            p.write_text(text)
    return DirRoot(str(base))


def v2_tree(path: str, extra: dict[str, str], avail_kb: int = 60 << 20) -> dict[str, str]:
    return {
        "proc/meminfo": MEMINFO.format(avail=avail_kb),
        "proc/self/cgroup": f"0::{path}\n",
        "proc/self/mountinfo": "31 23 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        "proc/self/status": "Name:\tpython3\nPid:\t4242\nCpus_allowed_list:\t0-7\n",
        "sys/fs/cgroup/cgroup.controllers": "cpuset cpu memory\n",
        **extra,
    }


# --- headroom: a charge fails at whichever limited ancestor fills first ---------------------------------

level = st.tuples(
    st.one_of(st.none(), st.integers(64, 8192)),  # memory.max in MiB, None: "max"
    st.integers(0, 4096),  # usage this level adds (its other children), MiB
    st.integers(0, 256),  # of which inactive page cache, MiB
)


@given(st.lists(level, min_size=1, max_size=4), st.integers(1, 60 << 10))
def test_available_is_the_smallest_headroom_over_limited_levels(
    levels: list[tuple[int | None, int, int]], avail_mib: int
) -> None:
    """Usage and inactive_file grow up the walk (each level adds its other children, as the kernel
    counts them); available = min(limit - (usage - inactive_file) over every limited level,
    effective - the group's working set, MemAvailable)."""
    names = [f"l{i}" for i in range(len(levels))]  # l0 is the top, the last one the group
    files: dict[str, str] = {}
    usage = inactive = 0
    expect = [avail_mib * MiB]
    for depth in range(len(levels) - 1, -1, -1):
        limit, adds, adds_inactive = levels[depth]
        usage, inactive = usage + adds, inactive + min(adds, adds_inactive)
        d = "sys/fs/cgroup/" + "/".join(names[: depth + 1])
        files[f"{d}/memory.max"] = "max\n" if limit is None else f"{limit * MiB}\n"
        files[f"{d}/memory.current"] = f"{usage * MiB}\n"
        files[f"{d}/memory.stat"] = f"inactive_file {inactive * MiB}\n"
        if limit is not None:
            expect.append(max(0, limit - (usage - inactive)) * MiB)
        if depth == len(levels) - 1:
            group_ws = usage - inactive
    effective = min([64 << 10] + [lim for lim, _, _ in levels if lim is not None])
    expect.append(max(0, effective - group_ws) * MiB)
    with tempfile.TemporaryDirectory() as tmp:
        report = probe_system(write(Path(tmp), v2_tree("/" + "/".join(names), files, avail_mib * 1024)), gpu=False)
    mem = report["memory"]
    assert mem["working_set_bytes"] == group_ws * MiB
    assert mem["available_bytes"] == min(expect)
    assert mem["available_bytes"] <= mem["host_available_bytes"]


def test_an_ancestor_without_memory_stat_counts_the_group_s_page_cache(tmp_path: Path) -> None:
    """memory.stat counts descendants, so the group's inactive_file is a floor for the ancestor's."""
    files = {
        "sys/fs/cgroup/job/memory.max": f"{4096 * MiB}\n",
        "sys/fs/cgroup/job/memory.current": f"{3072 * MiB}\n",  # a sibling uses 2 GiB
        "sys/fs/cgroup/job/step/memory.max": "max\n",
        "sys/fs/cgroup/job/step/memory.current": f"{1024 * MiB}\n",
        "sys/fs/cgroup/job/step/memory.stat": f"inactive_file {256 * MiB}\n",
    }
    mem = probe_system(write(tmp_path, v2_tree("/job/step", files)), gpu=False)["memory"]
    assert mem["working_set_bytes"] == 768 * MiB
    assert mem["available_bytes"] == (4096 - 3072 + 256) * MiB


def test_an_ancestor_whose_usage_is_unknown_falls_back_to_the_group(tmp_path: Path) -> None:
    files = {
        "sys/fs/cgroup/job/memory.max": f"{2048 * MiB}\n",  # no memory.current: unknown usage
        "sys/fs/cgroup/job/step/memory.current": f"{1024 * MiB}\n",
    }
    mem = probe_system(write(tmp_path, v2_tree("/job/step", files)), gpu=False)["memory"]
    assert mem["available_bytes"] == 1024 * MiB  # effective (the job's limit) - the group's usage


# --- CPU and cpuset warn like memory ---------------------------------------------------------------------


def test_cpu_files_that_cannot_be_read_or_parsed_warn(tmp_path: Path) -> None:
    files = {
        "sys/fs/cgroup/g/memory.max": "max\n",
        "sys/fs/cgroup/g/cpu.max": "<dir>",  # exists, but reading it fails (EISDIR)
        "sys/fs/cgroup/g/cpuset.cpus.effective": "0-3,x\n",
        "sys/devices/system/cpu/online": "0-7\n",
    }
    report = probe_system(write(tmp_path, v2_tree("/g", files)), gpu=False)
    got = [(w["code"], w["message"]) for w in report["warnings"]]
    assert ("unreadable", "cannot read /sys/fs/cgroup/g/cpu.max (not a regular file); its value is ignored") in got
    assert any(c == "malformed" and "cpuset.cpus.effective holds '0-3,x'" in m for c, m in got), got
    assert report["cpu"]["quota_cpus"] is None and report["cpu"]["cpuset_cpus"] is None


def test_v1_cpu_and_cpuset_hierarchies_outside_their_roots_warn_each(tmp_path: Path) -> None:
    files = {
        "proc/meminfo": MEMINFO.format(avail=1 << 20),
        "proc/self/cgroup": "5:memory:/a\n3:cpu,cpuacct:/b\n2:cpuset:/c\n",
        "proc/self/mountinfo": (
            "32 28 0:29 /a /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
            "31 28 0:28 /x /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
            "33 28 0:30 /y /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
        ),
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    }
    report = probe_system(write(tmp_path, files), gpu=False)
    outside = [w["message"] for w in report["warnings"] if w["code"] == "outside-mount-root"]
    assert len(outside) == 2, report["warnings"]  # memory's group is the mount root: no warning
    assert "'/b'" in outside[0] and "/sys/fs/cgroup/cpu,cpuacct;" in outside[0]
    assert "'/c'" in outside[1] and "/sys/fs/cgroup/cpuset;" in outside[1]
    assert report["cpu"]["quota_cpus"] == 0.5  # the mount root's quota, as the warning says


def test_v2_warns_once_for_all_three_controllers(tmp_path: Path) -> None:
    report = probe_system(write(tmp_path, v2_tree("/../sibling", {})), gpu=False)
    assert [w["code"] for w in report["warnings"]].count("outside-mount-root") == 1


# --- no cgroup at all -----------------------------------------------------------------------------------


def test_an_empty_proc_self_cgroup_warns_no_cgroup(tmp_path: Path) -> None:
    files = {"proc/meminfo": MEMINFO.format(avail=1 << 20), "proc/self/cgroup": "", "proc/self/mountinfo": ""}
    report = probe_system(write(tmp_path, files), gpu=False)
    warnings = [
        w for w in report["warnings"] if "/proc/self/status" not in w["message"] and w["code"] != "memlock-unknown"
    ]
    assert [(w["code"], w["message"][:37]) for w in warnings] == [
        ("no-cgroup", "/proc/self/cgroup lists no cgroup hie")
    ]
    assert report["memory"]["limited_by"] == "meminfo"


def test_an_unreadable_proc_self_cgroup_says_missing_not_no_cgroup(tmp_path: Path) -> None:
    report = probe_system(write(tmp_path, {"proc/meminfo": MEMINFO.format(avail=1 << 20)}), gpu=False)
    codes = [w["code"] for w in report["warnings"]]
    assert "no-cgroup" not in codes and codes.count("missing") >= 2


# --- a group hidden by a cgroup namespace is found again from a capture ---------------------------------


def test_capture_records_the_search_for_a_hidden_group_and_replays_it(tmp_path: Path) -> None:
    """The search reads cgroup.procs through the Root, so a capture of the unshare -C layout carries
    what it read and the tarball gives the same answer (nothing else of the tree is needed)."""
    from oomguard.probes.capture import capture
    from oomguard.sources.root import TarRoot
    from tests.conftest import FIXTURES

    fixture = DirRoot(str(FIXTURES / "v2_cgroupns_unshare_without_remount_two_levels" / "root"))
    tarball = str(tmp_path / "snap.tar.gz")
    capture(tarball, source=fixture)
    replay = TarRoot(tarball)
    leaf = "/sys/fs/cgroup/system.slice/batch-runner.service"
    assert replay.read(f"{leaf}/cgroup.procs") == "4242\n4250\n"
    assert replay.read("/sys/fs/cgroup/system.slice/cron.service/memory.max").__class__.__name__ == "Failure"
    live, again = probe_system(fixture, gpu=False), probe_system(replay, gpu=False)
    assert again["memory"] == live["memory"] and again["cpu"] == live["cpu"]
    assert again["memory"]["cgroup"]["dir"] == leaf
