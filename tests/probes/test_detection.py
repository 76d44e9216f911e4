"""Detection rules of issue #11 on small trees: headroom over ancestors, CPU warnings, no-cgroup.

The fixture corpus (tests/fixtures) pins real-world layouts; these tests build trees with
hypothesis or by hand to check each rule's edges.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from oomguard._types import WarningEntry
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
    assert mem["host_available_bytes"] is not None and mem["available_bytes"] <= mem["host_available_bytes"]


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


# --- containers that set no marker, and limits hidden above a namespace root (issue #19) -------------

PID_INIT, CGROUP_INIT = 4026531836, 4026531835  # include/linux/proc_ns.h: 0xEFFFFFFC, 0xEFFFFFFB


@given(st.text(max_size=40))
def test_parse_ns_link_takes_any_text(text: str) -> None:
    from oomguard.probes.container import parse_ns_link

    n = parse_ns_link(text)
    assert n is None or (n >= 0 and text.strip().endswith(f"[{n}]"))


def test_parse_ns_link_examples() -> None:
    from oomguard.probes.container import parse_ns_link

    assert parse_ns_link("pid:[4026531836]") == PID_INIT
    assert parse_ns_link("cgroup:[4026532279]\n") == 4026532279
    for bad in ("", "pid:", "pid:[]", "pid:[12", "pid:[1x2]", ":[12]", "pid:[١٢]", "pid[12]"):
        assert parse_ns_link(bad) is None, bad


def test_namespaces_other_than_the_initial_ones_are_a_container(tmp_path: Path) -> None:
    tree = v2_tree("/", {"sys/fs/cgroup/memory.max": "max\n"})
    initial = write(tmp_path / "a", {**tree, "proc/self/ns/pid": f"pid:[{PID_INIT}]\n"})
    c = probe_system(initial, {}, gpu=False)["container"]
    assert (c["in_container"], c["runtime"], c["evidence"]) == (False, None, [])
    private = write(
        tmp_path / "b",
        {**tree, "proc/self/ns/pid": f"pid:[{PID_INIT}]\n", "proc/self/ns/cgroup": "cgroup:[4026532279]\n"},
    )
    c = probe_system(private, {}, gpu=False)["container"]
    assert (c["in_container"], c["runtime"]) == (True, "container-other")
    assert c["evidence"] == [
        "namespace: /proc/self/ns/cgroup is cgroup:[4026532279], not the initial cgroup namespace (4026531835)"
    ]
    # a stronger signal names the runtime; the namespace stays in the evidence
    docker = write(tmp_path / "c", {**tree, "proc/self/ns/pid": "pid:[4026532001]\n", ".dockerenv": ""})
    c = probe_system(docker, {}, gpu=False)["container"]
    assert (c["runtime"], len(c["evidence"])) == ("docker", 2)
    garbage = write(tmp_path / "d", {**tree, "proc/self/ns/pid": "pid:[oops]\n"})
    assert probe_system(garbage, {}, gpu=False)["container"]["in_container"] is False


def test_a_v1_cgroup_path_is_evidence_once_not_once_per_hierarchy(tmp_path: Path) -> None:
    path = "/machine.slice/libpod-3f2a.scope"
    lines = "".join(f"{i}:{c}:{path}\n" for i, c in enumerate(["memory", "cpu,cpuacct", "pids", "blkio"], 1))
    root = write(tmp_path, {"proc/meminfo": MEMINFO.format(avail=1 << 20), "proc/self/cgroup": lines})
    c = probe_system(root, {}, gpu=False)["container"]
    assert c["evidence"] == [f"cgroup path: {path}"] and c["runtime"] == "podman"


def test_a_limit_of_the_leaf_does_not_silence_limit_may_be_hidden(tmp_path: Path) -> None:
    """The walk stops at a v2 namespace root (it has memory.max): whatever is above it is unseen."""
    for limit, fact in (("2147483648", "the lowest limit up to it is 2 GiB"), ("max", "no group up to it")):
        root = write(tmp_path / limit, v2_tree("/", {"sys/fs/cgroup/memory.max": limit + "\n"}))
        report = probe_system(root, {}, gpu=False)
        assert report["memory"]["cgroup"]["ancestors_visible"] is False
        hidden = [w["message"] for w in report["warnings"] if w["code"] == "limit-may-be-hidden"]
        assert len(hidden) == 1 and fact in hidden[0], hidden
        assert report["container"]["in_container"] is False  # no container seen: it is said all the same
    # the host's root group (no memory.max, lists memory): nothing is above it, nothing is said
    host = write(tmp_path / "host", v2_tree("/", {}))
    report = probe_system(host, {}, gpu=False)
    assert report["memory"]["cgroup"]["ancestors_visible"] is True
    assert "limit-may-be-hidden" not in {w["code"] for w in report["warnings"]}


def test_the_live_namespace_links_are_read_and_replayed_from_a_snapshot(tmp_path: Path) -> None:
    """A real private PID namespace (unshare -p) is seen live; capture keeps the links as files."""
    import json
    import shutil
    import subprocess
    import sys

    from tests.conftest import REPO

    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare or "unshare", "-p", "-f", "true"], capture_output=True) if unshare else None
    if probe is None or probe.returncode != 0:
        import pytest

        pytest.skip(f"cannot make a PID namespace here: {repr(probe.stderr) if probe else 'no unshare'}")
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    snap, out = tmp_path / "snap.tar.gz", tmp_path / "live.json"
    og = f"{sys.executable} -m oomguard"
    script = f"{og} check --json --no-gpu > {out} && {og} capture {snap}"  # one namespace for both
    live = subprocess.run(
        ["unshare", "-p", "-f", "--mount-proc", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert live.returncode == 0, live.stderr
    evidence = json.loads(out.read_text())["container"]["evidence"]
    assert any(e.startswith("namespace: /proc/self/ns/pid is pid:[") for e in evidence), evidence
    replay = subprocess.run(
        [*og.split(), "check", "--json", "--no-gpu", "--root", str(snap)], env=env, capture_output=True, text=True
    )
    assert json.loads(replay.stdout)["container"]["evidence"] == evidence


# --- one working-set definition (issue #20): the probe, the run side and the watch agree ------------


@given(
    usage=st.integers(0, 1 << 40),
    own=st.none() | st.integers(0, 1 << 40),
    total=st.none() | st.integers(0, 1 << 40),
    version=st.sampled_from([1, 2]),
)
def test_the_probe_the_run_side_and_the_watch_read_one_working_set(
    usage: int, own: int | None, total: int | None, version: int
) -> None:
    from oomguard.probes.counters import read_sample, read_working_set

    stat = "".join(f"{k} {v}\n" for k, v in (("inactive_file", own), ("total_inactive_file", total)) if v is not None)
    with tempfile.TemporaryDirectory() as d:
        if version == 2:
            files = v2_tree("/", {"sys/fs/cgroup/memory.max": "max\n"})
            files.update({"sys/fs/cgroup/memory.current": f"{usage}\n", "sys/fs/cgroup/memory.stat": stat})
        else:
            files = {
                "proc/meminfo": MEMINFO.format(avail=1 << 20),
                "proc/self/cgroup": "4:memory:/\n",
                "proc/self/mountinfo": "30 23 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
                "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{usage}\n",
                "sys/fs/cgroup/memory/memory.stat": stat,
            }
        root = write(Path(d), files)
        group = "/sys/fs/cgroup" if version == 2 else "/sys/fs/cgroup/memory"
        probed = probe_system(root, {}, gpu=False)["memory"]["working_set_bytes"]
        assert probed == read_working_set(root, group, version) == read_sample(root, group, version).working_set
    # v2 counts its own inactive_file (hierarchical already); v1 the total_ one when it is there
    inactive = (own if version == 2 else (total if total is not None else own)) or 0
    assert probed == max(0, usage - inactive)


def test_root_text_is_the_one_read_or_warn_step(tmp_path: Path) -> None:
    """Root.text: the text, or None; a failure other than missing warns, missing only when asked."""
    root = write(tmp_path, {"ok": "42\n", "dir/x": "1"})
    warnings: list[WarningEntry] = []
    assert root.text("/ok", warnings) == "42\n" and warnings == []
    assert root.text("/absent", warnings) is None and warnings == []  # absent: no news by default
    assert root.text("/absent", warnings, lost="MemTotal is unknown", missing=True) is None
    assert warnings == [{"code": "missing", "message": "/absent does not exist; MemTotal is unknown"}]
    assert root.text("/dir", warnings) is None  # not a regular file: an error, always warned
    assert [w["code"] for w in warnings] == ["missing", "unreadable"]
    assert "its value is ignored" in warnings[1]["message"]
    assert root.text("/dir") is None  # without warnings: just None
    assert root.names("/dir") == ["x"] and root.names("/absent") == []
