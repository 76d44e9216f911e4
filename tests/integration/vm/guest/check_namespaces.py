"""cgroup namespaces on a real kernel (cgroup_namespaces(7)).

Paths in /proc/self/cgroup and the mount roots in mountinfo are both relative to the reader's
namespace root. Docker's default (cgroupns=private, cgroup2 mounted again inside) shows ``0::/``
and a mount root of ``/``; a process that unshared or entered a namespace without a fresh mount
sees the old mount's root as ``/..``, and its own group as ``/`` or ``/..`` or ``/../sibling``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.helpers.wait import wait_until
from tests.integration.vm.guest.cg import PYTHON, Group, MiB, oomguard_env, parse_report, warning_codes

GroupFactory = Callable[..., Group]
SHOW = "cat /proc/self/cgroup >&2; grep ' - cgroup2 ' /proc/self/mountinfo | cut -d' ' -f4,5 >&2"


def _check(group: Group, *wrapper: str) -> tuple[dict[str, Any], list[str]]:
    """Run *wrapper* ending in ``sh -c '<show>; exec python -m oomguard check --json'`` in *group*.

    Returns the report and the lines the wrapper printed: /proc/self/cgroup, then "root mountpoint".
    """
    proc = group.run(*wrapper, "sh", "-c", f'{SHOW}; exec "{PYTHON}" -m oomguard check --json')
    report = parse_report(proc)
    assert proc.returncode == 0, proc.stderr
    return report, proc.stderr.splitlines()


def test_docker_like_private_namespace(group: GroupFactory) -> None:
    g = group(300 * MiB)
    remount = "umount /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup"
    proc = g.run(
        "unshare", "-C", "-m", "--propagation", "private",
        "sh", "-c", f'{remount} && {SHOW} && exec "{PYTHON}" -m oomguard check --json',
    )  # fmt: skip
    report = parse_report(proc)
    assert proc.stderr.splitlines()[:2] == ["0::/", "/ /sys/fs/cgroup"]
    mem = report["memory"]
    assert mem["effective_bytes"] == 300 * MiB
    assert mem["limited_by"] == "cgroup-v2"
    assert mem["limit_file"] == "/sys/fs/cgroup/memory.max"
    cg = mem["cgroup"]
    assert (cg["path"], cg["mount_root"], cg["dir"]) == ("/", "/", "/sys/fs/cgroup")
    assert cg["ancestors_visible"] is False  # the namespace root is all it can see
    assert cg["levels"] == [{"dir": "/sys/fs/cgroup", "max_bytes": 300 * MiB, "high_bytes": None}]
    # what is above the namespace root cannot be seen, and is said so although the group has a limit
    assert warning_codes(report) == ["limit-may-be-hidden"]
    # the private cgroup namespace is evidence of a container of its own (the guest's root is the
    # host's, whose /.dockerenv names the runtime docker first)
    container = report["container"]
    assert container["in_container"] is True
    assert any(e.startswith("namespace: /proc/self/ns/cgroup is cgroup:[") for e in container["evidence"])


def test_namespace_without_remount_sees_the_mount_root_as_dotdot(group: GroupFactory) -> None:
    """``unshare -C`` alone: the group is the namespace root, the old mount's root is its parent."""
    g = group(300 * MiB)
    report, shown = _check(g, "unshare", "-C")
    assert shown[:2] == ["0::/", "/.. /sys/fs/cgroup"]
    cg = report["memory"]["cgroup"]
    assert (cg["path"], cg["mount_root"], cg["mount"]) == ("/", "/..", "/sys/fs/cgroup")


def test_namespace_without_remount_no_false_outside_warning(group: GroupFactory) -> None:
    report, _ = _check(group(300 * MiB), "unshare", "-C")
    assert "outside-mount-root" not in warning_codes(report)


def test_namespace_without_remount_finds_the_limit(group: GroupFactory) -> None:
    """Neither file names the group: it is the child of the mount point whose cgroup.procs lists us."""
    g = group(300 * MiB)
    group(200 * MiB)  # a sibling, so that there is a choice to make
    report, _ = _check(g, "unshare", "-C")
    assert report["memory"]["effective_bytes"] == 300 * MiB
    assert report["memory"]["limit_file"] == f"{g.path}/memory.max"
    assert report["memory"]["cgroup"]["dir"] == str(g.path)
    assert warning_codes(report) == []


def test_pid_namespace_without_remount_reports_the_limit_unknown(group: GroupFactory) -> None:
    """``unshare -C -p -f`` without mounting /proc again: /proc/self/status gives the outer PID, while
    cgroup.procs lists the inner one, so no group can be chosen: unknown, never MemTotal."""
    report, _ = _check(group(300 * MiB), "unshare", "-C", "-p", "-f")
    mem = report["memory"]
    assert (mem["effective_bytes"], mem["limited_by"], mem["available_bytes"]) == (None, None, None)
    assert (mem["cgroup"]["path"], mem["cgroup"]["mount_root"], mem["cgroup"]["dir"]) == ("/", "/..", None)
    assert "cgroup-not-found" in warning_codes(report)
    assert report["budget"]["bytes"] is None


@pytest.fixture
def ns_holder(group: GroupFactory) -> Iterator[tuple[Group, int]]:
    """A process in its own cgroup namespace rooted at a 300 MiB group, for ``nsenter -C``."""
    g = group(300 * MiB)
    holder = g.popen("unshare", "-C", "sleep", "120", stdout=subprocess.DEVNULL)
    try:
        # unshare execs sleep in the same process: wait until its namespace differs from ours.
        own = lambda: os.readlink(f"/proc/{holder.pid}/ns/cgroup") != os.readlink("/proc/self/ns/cgroup")  # noqa: E731
        wait_until(own, what="the holder's own cgroup namespace")
        yield g, holder.pid
    finally:
        holder.kill()
        holder.wait()


def _nsenter_check(pid: int, where: Group | None) -> tuple[dict[str, Any], list[str]]:
    cmd = ["nsenter", "-C", "-t", str(pid), "sh", "-c", f'{SHOW}; exec "{PYTHON}" -m oomguard check --json']
    if where is None:  # from the root group, where this test process runs
        proc = subprocess.run(cmd, env=oomguard_env(), capture_output=True, text=True, timeout=120)
    else:
        proc = where.run(*cmd)
    report = parse_report(proc)
    assert proc.returncode == 0, proc.stderr
    return report, proc.stderr.splitlines()


def test_nsenter_from_the_root_group_path_equals_mount_root(ns_holder: tuple[Group, int]) -> None:
    """The process stays in the root group: it sees its group as ``/..``, the same as the mount root."""
    _, pid = ns_holder
    report, shown = _nsenter_check(pid, None)
    assert shown[:2] == ["0::/..", "/.. /sys/fs/cgroup"]
    mem = report["memory"]
    assert mem["limited_by"] == "meminfo"  # the root group has no limit: right
    assert mem["cgroup"]["dir"] == "/sys/fs/cgroup"
    assert mem["cgroup"]["path"] == "/.."


def test_nsenter_from_the_root_group_no_false_outside_warning(ns_holder: tuple[Group, int]) -> None:
    report, _ = _nsenter_check(ns_holder[1], None)
    assert "outside-mount-root" not in warning_codes(report)


def test_nsenter_from_a_sibling_group_finds_its_limit(ns_holder: tuple[Group, int], group: GroupFactory) -> None:
    sibling = group(200 * MiB)
    report, shown = _nsenter_check(ns_holder[1], sibling)
    assert shown[:2] == [f"0::/..{sibling.rel}", "/.. /sys/fs/cgroup"]
    mem = report["memory"]
    assert mem["effective_bytes"] == 200 * MiB
    assert mem["limit_file"] == f"{sibling.path}/memory.max"
    assert "outside-mount-root" not in warning_codes(report)
