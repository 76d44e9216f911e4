"""Every parser takes any text without raising, and reads the documented shapes right."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from oomguard.probes import parsers, probe_system
from oomguard.probes.counters import parse_ppid, read_oom_kills, read_peak, read_peak_rss, read_usage
from oomguard.probes.mounts import parse_mountinfo, parse_mountinfo_line, parse_proc_cgroup, unescape_octal
from oomguard.probes.namespace import HIDDEN, MAX_CANDIDATES, OUTSIDE, UNDER, find_hidden_group, locate, split_ns_path
from oomguard.sources.root import DirRoot, parse_environ

# Text shaped like the kernel's files hits the interesting branches more often than random text.
kernelish = st.text(alphabet=st.sampled_from(list("0123456789 -:/,=.\n\tabcdefmxkBslu\\")), max_size=300)
any_text = st.one_of(st.text(), kernelish)

TEXT_PARSERS = [
    parsers.parse_limit,
    parsers.parse_int_file,
    parsers.parse_flat_keyed,
    parsers.parse_meminfo,
    parsers.parse_pressure,
    parsers.parse_cpu_max,
    parsers.parse_cpu_list,
    parsers.parse_proc_limits,
    parsers.parse_status,
    parse_mountinfo,
    parse_mountinfo_line,
    parse_proc_cgroup,
    unescape_octal,
    parse_environ,
    parse_ppid,
    parsers.parse_pid_list,
    split_ns_path,
]


@given(any_text)
def test_no_parser_raises(text: str) -> None:
    for parse in TEXT_PARSERS:
        parse(text)
    parsers.parse_cfs(text, text)
    parsers.has_capability({"CapEff": text}, parsers.CAP_IPC_LOCK)
    parsers.status_kb({"VmLck": text}, "VmLck")
    locate(text, text)
    locate(text, "/..")


@given(any_text)
def test_parsed_sizes_are_never_negative(text: str) -> None:
    status, n = parsers.parse_limit(text)
    assert (status == parsers.VALUE) == (n is not None)
    assert n is None or n >= 0
    assert all(v >= 0 for v in parsers.parse_meminfo(text).values())
    assert all(v >= 0 for v in parsers.parse_flat_keyed(text).values())
    count = parsers.parse_cpu_list(text)
    assert count is None or count > 0


def test_limit_values() -> None:
    assert parsers.parse_limit("max\n") == ("unlimited", None)
    assert parsers.parse_limit("536870912\n") == ("value", 536870912)
    assert parsers.parse_limit("9223372036854771712\n") == ("unlimited", None)  # 4K pages
    assert parsers.parse_limit("9223372036854710272") == ("unlimited", None)  # 64K pages
    assert parsers.parse_limit("-1") == ("unlimited", None)
    assert parsers.parse_limit("0") == ("value", 0)
    assert parsers.parse_limit("lots")[0] == "malformed"
    assert parsers.parse_limit("-5")[0] == "malformed"
    assert parsers.parse_limit("")[0] == "malformed"


def test_meminfo() -> None:
    text = "MemTotal:       24684092 kB\nMemAvailable:   24381748 kB\nHugePages_Total:       0\nBad line\n"
    info = parsers.parse_meminfo(text)
    assert info == {"MemTotal": 24684092 * 1024, "MemAvailable": 24381748 * 1024, "HugePages_Total": 0}


def test_pressure() -> None:
    text = "some avg10=1.50 avg60=0.00 avg300=0.00 total=3508\nfull avg10=0.00 avg60=0.00 avg300=nan total=3032\n"
    psi = parsers.parse_pressure(text)
    assert psi["some"] == {"avg10": 1.5, "avg60": 0.0, "avg300": 0.0, "total": 3508.0}
    assert "avg300" not in psi["full"]  # NaN is not trusted


def test_cpu() -> None:
    assert parsers.parse_cpu_max("max 100000") == ("unlimited", None)
    assert parsers.parse_cpu_max("150000 100000") == ("value", 1.5)
    assert parsers.parse_cpu_max("150000 0")[0] == "malformed"
    assert parsers.parse_cfs("-1", "100000") == ("unlimited", None)
    assert parsers.parse_cfs("200000", "100000") == ("value", 2.0)
    assert parsers.parse_cpu_list("0-3,8,10-11\n") == 7
    assert parsers.parse_cpu_list("") is None
    assert parsers.parse_cpu_list("3-1") is None
    assert parsers.parse_cpu_list("0-99999999999") is None


def test_proc_limits() -> None:
    text = (
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max cpu time              unlimited            unlimited            seconds   \n"
        "Max locked memory         8388608              8388608              bytes     \n"
        "Max nice priority         0                    0                    \n"
        "Max address space         unlimited            17179869184          bytes     \n"
    )
    limits = parsers.parse_proc_limits(text)
    assert limits["Max locked memory"] == (8388608, 8388608)
    assert limits["Max cpu time"] == (None, None)
    assert limits["Max nice priority"] == (0, 0)
    assert limits["Max address space"] == (None, 17179869184)


def test_status_and_caps() -> None:
    status = parsers.parse_status("CapEff:\t000001fffeffffff\nVmLck:\t     128 kB\nCpus_allowed_list:\t0-1\n")
    assert parsers.has_capability(status, parsers.CAP_IPC_LOCK) is True
    assert parsers.has_capability({"CapEff": "0000000000000000"}, parsers.CAP_IPC_LOCK) is False
    assert parsers.has_capability({}, parsers.CAP_IPC_LOCK) is None
    assert parsers.status_kb(status, "VmLck") == 128 * 1024


def test_mountinfo_shapes() -> None:
    text = (
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "465 34 253:0 / / rw,relatime shared:409 master:1 - xfs /dev/mapper/fedora-root rw,seclabel\n"
        "1391 1160 0:151 / /Docker/host rw,noatime - 9p C:\\134Program\\040Files\\134Docker "
        "rw,dirsync,aname=drvfs;path=C:\\Program Files\\Docker;symlinkroot=/mnt/\n"
        "99 1 0:5 /a\\040b /mnt/with\\040space rw - ext4 /dev/x rw\n"
        "not a mount line\n"
    )
    mounts, bad = parse_mountinfo(text)
    assert bad == 1
    assert [m.mount_point for m in mounts] == ["/sys/fs/cgroup/memory", "/", "/Docker/host", "/mnt/with space"]
    assert mounts[0].fstype == "cgroup" and "memory" in mounts[0].options()
    assert mounts[1].fstype == "xfs"
    assert mounts[2].source == "C:\\Program Files\\Docker"
    assert "path=C:\\Program Files\\Docker" in mounts[2].super_options
    assert mounts[3].root == "/a b"


def test_proc_cgroup_colons() -> None:
    path = "/kubepods-burstable-podf65e.slice:cri-containerd:86ac6260"
    entries, bad = parse_proc_cgroup(f"11:memory:{path}\n2:cpu,cpuacct:/\n0::/\ngarbage\n")
    assert bad == 1
    assert entries[0].path == path and entries[0].controllers == ["memory"]
    assert entries[1].controllers == ["cpu", "cpuacct"]
    assert entries[2].hierarchy_id == "0" and entries[2].controllers == []


def test_unescape_octal() -> None:
    assert unescape_octal("a\\040b\\011c\\012d\\134e") == "a b\tc\nd\\e"
    assert unescape_octal("trailing\\04") == "trailing\\04"
    assert unescape_octal("\\999") == "\\999"


def test_ppid_from_proc_stat() -> None:
    assert parse_ppid("1234 (sh) S 1200 1234 1234 0 -1") == 1200
    assert parse_ppid("77 (a) b) (c) R 4242 77 77 0") == 4242  # comm may hold spaces and ")"
    assert parse_ppid("1 (init) S 0 1 1") == 0
    for bad in ("", "1 (x", "1 (x) S", "1 (x) S -3 1", "1 (x) S \u00b2 1", "garbage"):
        assert parse_ppid(bad) is None, bad


def test_run_time_counters_read_through_a_root(tmp_path: Path) -> None:
    from oomguard.sources.root import DirRoot

    files = {
        "cg/memory.events": "low 0\nhigh 3\nmax 9\noom 2\noom_kill 1\noom_group_kill 0\n",
        "cg/memory.current": "4096\n",
        "cg/memory.peak": "8192\n",
        "v1/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n",
        "v1/memory.usage_in_bytes": "100\n",
        "v1/memory.max_usage_in_bytes": "200\n",
        "proc/42/status": "Name:\tx\nVmPeak:\t 9999 kB\nVmHWM:\t    1536 kB\nVmRSS:\t 1000 kB\n",
        "proc/43/status": "Name:\tkernel thread, no VmHWM\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    root = DirRoot(str(tmp_path))
    assert read_oom_kills(root, "/cg/memory.events") == 1
    assert read_oom_kills(root, "/v1/memory.oom_control") == 5
    assert read_oom_kills(root, "/nope/memory.events") is None and read_oom_kills(root, None) is None
    assert (read_usage(root, "/cg", 2), read_usage(root, "/v1", 1), read_usage(root, None, 2)) == (4096, 100, None)
    assert (read_peak(root, "/cg", 2), read_peak(root, "/v1", 1), read_peak(root, "/v1", 2)) == (8192, 200, None)
    assert (read_peak_rss(root, 42), read_peak_rss(root, 43), read_peak_rss(root, 44)) == (1536 * 1024, None, None)


# --- line splitting: "\n" only (issue #11) --------------------------------------------------------------

# Every character str.splitlines() breaks at except "\n", which the kernel refuses in a cgroup name
# (kernel/cgroup/cgroup.c cgroup_mkdir()), plus the four mountinfo escapes.
SPLITLINES_ONLY = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
# Lone surrogates other than the surrogateescape range (U+DC80-U+DCFF) cannot name a file at all.
name_chars = st.one_of(
    st.sampled_from([*SPLITLINES_ONLY, *" \t\\:,-_.", "\udcff"]), st.characters(blacklist_categories=["Cs"])
)
group_names = st.text(name_chars, min_size=1, max_size=12).filter(
    lambda n: "/" not in n and "\0" not in n and "\n" not in n and n not in (".", "..")
)
group_paths = st.lists(group_names, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))


def kernel_escape(field: str) -> str:
    """What show_mountinfo()/cgroup_show_path() write: only space, tab, newline, backslash escaped."""
    return field.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")


def test_splitlines_breaks_where_the_kernel_does_not() -> None:
    """The reason for split("\n"): each of these is a line break to str.splitlines()."""
    for c in SPLITLINES_ONLY:
        assert len(f"a{c}b".splitlines()) == 2, repr(c)
        assert len(f"a{c}b".split("\n")) == 1


@given(group_paths, group_paths)
def test_group_names_round_trip_through_proc_self_cgroup(path: str, other: str) -> None:
    text = f"12:memory:{path}\n3:cpu,cpuacct:{other}\n0::{path}\n"
    entries, bad = parse_proc_cgroup(text)
    assert bad == 0
    assert [(e.hierarchy_id, e.path) for e in entries] == [("12", path), ("3", other), ("0", path)]


@given(group_paths, st.sampled_from(["/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/mnt/a b\\c"]))
def test_mount_roots_round_trip_through_mountinfo(root: str, mount_point: str) -> None:
    line = (
        f"32 28 0:29 {kernel_escape(root)} {kernel_escape(mount_point)} rw,relatime shared:8 - cgroup cgroup rw,memory"
    )
    text = f"22 1 8:2 / / rw - xfs /dev/sda2 rw\n{line}\n31 23 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    mounts, bad = parse_mountinfo(text)
    assert bad == 0
    assert [(m.root, m.mount_point) for m in mounts][1] == (root, mount_point)
    assert len(mounts) == 3


def test_a_nul_byte_makes_a_line_malformed() -> None:
    entries, bad = parse_proc_cgroup("0::/a\0b\n5:memory:/ok\n")
    assert (bad, [e.path for e in entries]) == (1, ["/ok"])
    mounts, bad = parse_mountinfo("31 23 0:27 /\0 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    assert (mounts, bad) == ([], 1)


def test_status_name_with_a_line_separator_injects_nothing() -> None:
    """A process may name itself (prctl PR_SET_NAME) with U+2028 followed by a fake field."""
    status = parsers.parse_status("Name:\tx\u2028CapEff:\t000001ffffffffff\nCapEff:\t0000000000000000\nPid:\t7\n")
    assert status["Name"] == "x\u2028CapEff:\t000001ffffffffff"
    assert parsers.has_capability(status, parsers.CAP_IPC_LOCK) is False
    stat = parsers.parse_flat_keyed("anon 5\x0cinactive_file 99\ninactive_file 3\n")
    assert stat == {"inactive_file": 3}  # "anon 5\x0cinactive_file 99" is one line of three fields


@given(group_paths)
@example("/memory.max")
def test_a_group_with_any_name_is_found_and_its_limit_read(path: str) -> None:
    """The whole probe: /proc/self/cgroup, mountinfo and the group's directory agree on the name."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        group = base / "sys/fs/cgroup" / path.lstrip("/")
        try:
            group.mkdir(parents=True)
        except OSError:  # a name longer than the file system allows
            return
        (group / "memory.max").write_text("536870912\n")
        (base / "proc/self").mkdir(parents=True)
        (base / "proc/meminfo").write_text("MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n")
        (base / "proc/self/cgroup").write_bytes(f"0::{path}\n".encode("utf-8", "surrogateescape"))
        line = f"31 23 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n22 1 8:2 {kernel_escape(path)} /x rw - xfs a rw\n"
        (base / "proc/self/mountinfo").write_bytes(line.encode("utf-8", "surrogateescape"))
        report = probe_system(DirRoot(tmp), gpu=False)
    assert report["memory"]["cgroup"]["path"] == path
    assert report["memory"]["effective_bytes"] == 536870912
    codes = {w["code"] for w in report["warnings"]}
    assert codes <= {"missing", "memlock-unknown", "unreadable"}, report["warnings"]  # no status, no limits
    # A group named as a control file (hypothesis found "/memory.max" in a fresh clone) is a
    # directory where the probe reads its parent's file of that name: said, and its value ignored.
    parts = [p for p in path.split("/") if p]
    groups = ["/sys/fs/cgroup/" + "/".join(parts[:k]) for k in range(1, len(parts) + 1)]
    for w in report["warnings"]:
        if w["code"] == "unreadable":
            assert any(f"cannot read {g} (not a regular file)" in w["message"] for g in groups), w


# --- cgroup namespaces: paths compared as they are, ".." included ----------------------------------------

ups = st.integers(0, 3)
plain = st.lists(st.sampled_from(["a", "b", "job_1", "x y"]), max_size=3)


def ns(n_up: int, names: list[str]) -> str:
    return "/" + "/".join([".."] * n_up + names)


@given(ups, plain, plain)
def test_same_prefix_is_under_the_root(n_up: int, root: list[str], below: list[str]) -> None:
    assert locate(ns(n_up, root + below), ns(n_up, root)) == (UNDER, below, 0)


@given(ups, plain)
def test_a_path_equal_to_the_mount_root_is_never_outside(n_up: int, names: list[str]) -> None:
    assert locate(ns(n_up, names), ns(n_up, names)) == (UNDER, [], 0)


@given(ups, st.integers(1, 3), plain)
def test_a_root_of_only_dotdots_above_the_path_hides_names(n_up: int, more: int, names: list[str]) -> None:
    assert locate(ns(n_up, names), ns(n_up + more, [])) == (HIDDEN, names, more)


@given(ups, st.integers(1, 3), plain, st.lists(st.sampled_from(["r", "s"]), min_size=1, max_size=2))
def test_really_outside(n_up: int, more: int, names: list[str], root_names: list[str]) -> None:
    assert locate(ns(n_up + more, names), ns(n_up, root_names))[0] == OUTSIDE  # the path starts higher
    assert locate(ns(n_up, names), ns(n_up + more, root_names))[0] == OUTSIDE  # the root is off the path
    assert locate(ns(n_up, ["q", *names]), ns(n_up, root_names))[0] == OUTSIDE  # a sibling


def test_split_ns_path_refuses_what_the_kernel_never_writes() -> None:
    assert split_ns_path("/../../a/b") == (2, ["a", "b"])
    assert split_ns_path("/") == (0, [])
    assert split_ns_path("/a/../b") is None  # ".." after a name
    assert split_ns_path("/./a") is None
    assert split_ns_path("a/b") is None
    assert locate("/a/../b", "/")[0] == OUTSIDE


def _groups(base: Path, procs: dict[str, str]) -> DirRoot:
    for rel, text in procs.items():
        (base / rel).mkdir(parents=True, exist_ok=True)
        (base / rel / "cgroup.procs").write_text(text)
    return DirRoot(str(base))


def test_hidden_group_is_the_one_whose_cgroup_procs_lists_the_pid(tmp_path: Path) -> None:
    root = _groups(tmp_path, {"cg": "1\n", "cg/a": "42420\n", "cg/b": "7\n42\n", "cg/c": "", "cg/b/sub": "42\n"})
    assert find_hidden_group(root, "/cg", 1, [], 42) == ("/cg/b", "")
    assert find_hidden_group(root, "/cg", 1, ["sub"], 42) == ("/cg/b/sub", "")
    assert find_hidden_group(root, "/cg", 2, [], 42) == ("/cg/b/sub", "")
    missing, why = find_hidden_group(root, "/cg", 1, [], 4242)
    assert missing is None and "PID 4242" in why
    assert find_hidden_group(root, "/cg", 1, [], None)[0] is None
    assert find_hidden_group(None, "/cg", 1, [], 42)[0] is None


def test_hidden_group_listed_twice_is_ambiguous(tmp_path: Path) -> None:
    root = _groups(tmp_path, {"cg/a": "42\n", "cg/b": "42\n"})
    found, why = find_hidden_group(root, "/cg", 1, [], 42)
    assert found is None and "2 groups" in why


def test_hidden_group_search_gives_up_on_a_huge_tree(tmp_path: Path) -> None:
    root = _groups(tmp_path, {f"cg/g{i}": "" for i in range(MAX_CANDIDATES + 1)})
    found, why = find_hidden_group(root, "/cg", 1, [], 42)
    assert found is None and str(MAX_CANDIDATES) in why


@pytest.mark.parametrize(
    ("text", "pids"), [("1\n42\n", {1, 42}), ("", set()), ("0\n-3\nx\n 7 \n", {7}), ("42\r\n", {42})]
)
def test_pid_list(text: str, pids: set[int]) -> None:
    assert parsers.parse_pid_list(text) == pids
