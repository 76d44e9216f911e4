"""``oomguard run --guard`` on cgroup v2 (supervisor/guard.py, docs/guard.md).

- In a 384 MiB group, a worker that keeps growing is OOM-killed without ``--guard``; with it, it
  is stopped (SIGTERM) at the stop line, 384 - 64 MiB, and the group's ``oom_kill`` stays 0.
- With ``--isolate``, at the budget the guard sets ``memory.high`` of the worker's own group to
  the budget: the worker reads it there, and the group's ``memory.events`` ``high`` counter
  shows the kernel throttling it (cgroup-v2.rst, "memory.events": "high: The number of times
  processes of the cgroup are throttled and routed to perform direct memory reclaim because the
  high memory boundary was exceeded").
- A worker that cannot shed load crawls under memory.high (its allocations sleep, counted as
  memory stall in PSI) and is stopped once the group's full stall time grows by 10 s.
- The kernel's wake-up on v2 (supervisor/alarm.py): ``memory.events`` polled for POLLPRI wakes
  the guard when the group goes over ``memory.high`` (cgroup-v2.rst, "memory.events": "A value
  change in this file generates a file modified event"), and only on a new change once it was
  read again (fs/kernfs/file.c, ``kernfs_generic_poll``); a worker over its ``memory.high`` under
  ``run --guard --isolate`` wakes the guard, and the exit event says how often.
- ``--grace-bytes``: a worker whose shutdown after SIGTERM adds 30 % is OOM-killed when stopped
  at the default line, and finishes when the grace moves the line down (20 runs of 20).
- While the worker stops, with ``--isolate``, ``memory.high`` is lifted from the budget to half a
  guard margin under the group's limit, so the graceful stop is not throttled past ``--stop-timeout``.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import LiveRoot
from oomguard.supervisor.alarm import Alarm
from tests.helpers.workers import GRACEFUL
from tests.integration.vm.guest.cg import PYTHON, Group, MiB, oomguard_env, read_events

GroupFactory = Callable[..., Group]

# Grows by 4 MiB every 50 ms until SIGTERM (written to argv[1], then exit 0). With argv[2] "high":
# once its own group's memory.high is no longer "max", it touches 1 MiB more, prints memory.high and
# the group's memory.events "high" count, and exits 0 ("over": the same, 0.5 s later, so that the
# guard has polled what the kernel said); with "crawl" it goes on growing under it.
GROWER = """
import signal, sys, time
marker, mode = sys.argv[1], sys.argv[2]
grp = '/sys/fs/cgroup' + open('/proc/self/cgroup').read().split('::')[1].strip()
def term(*a):
    open(marker, 'a').write('TERM\\n'); sys.exit(0)
signal.signal(signal.SIGTERM, term)
def high():
    try: return open(grp + '/memory.high').read().strip()
    except OSError: return 'max'
def touch(n):
    c = bytearray(n); c[::4096] = b'x' * len(range(0, n, 4096)); return c
chunks = []
while mode not in ('high', 'over') or high() == 'max':
    chunks.append(touch(4 << 20))
    time.sleep(0.05)
chunks.append(touch(1 << 20))
time.sleep(0.5 if mode == 'over' else 0)
events = dict(line.split() for line in open(grp + '/memory.events').read().splitlines())
print(high(), events['high'], flush=True)
"""


def _run(events: Path, tmp: Path, mode: str, *args: str, group: Group | None = None):  # type: ignore[no-untyped-def]
    cmd = [PYTHON, "-m", "oomguard", "run", "--restart", "never", "--events", str(events), *args]
    cmd += ["--", PYTHON, "-c", GROWER, str(tmp / "marker"), mode]
    if group is not None:
        proc = group.run(*cmd)
    else:  # the supervisor in the root group, where this test process runs (--isolate from the root)
        import subprocess

        proc = subprocess.run(cmd, env=oomguard_env(), capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, read_events(events)


def test_guard_stops_before_the_kernel_on_v2(group: GroupFactory, events: Path, tmp_path: Path) -> None:
    g = group(384 * MiB)
    proc, evs = _run(events, tmp_path, "grow", group=g)
    assert proc.returncode == 137 and evs[-1]["reason"] == "oom-kill", proc.stderr
    assert g.keyed("memory.events")["oom_kill"] == 1
    events.unlink()
    proc, evs = _run(events, tmp_path, "grow", "--guard", group=g)
    end = evs[-1]
    assert (end["reason"], end["oom_kills"], end["limited_by"]) == ("pressure-stop", 0, "cgroup-v2"), proc.stderr
    assert g.keyed("memory.events")["oom_kill"] == 1  # not one more
    assert (tmp_path / "marker").read_text() == "TERM\n"
    assert end["guard_margin_bytes"] == 64 * MiB
    assert 320 * MiB <= end["working_set_peak_bytes"] < 384 * MiB


def test_guard_sets_memory_high_on_the_isolated_group(events: Path, tmp_path: Path) -> None:
    proc, evs = _run(events, tmp_path, "high", "--isolate", "--guard", "--budget", "128MiB")
    assert proc.returncode == 0, proc.stderr
    high, throttled = proc.stdout.split()
    assert int(high) == 128 * MiB  # the budget, on the worker's own group
    assert int(throttled) > 0  # the kernel throttled it there
    assert "oomguard run: guard: memory.high of /sys/fs/cgroup/oomguard-run-" in proc.stderr
    assert evs[-1]["reason"] == "clean" and "memory.high events +" in evs[-1]["message"]


@pytest.mark.skipif(not os.path.exists("/proc/pressure/memory"), reason="PSI is off in this kernel (psi=0)")
def test_guard_stops_a_worker_stalled_under_memory_high(events: Path, tmp_path: Path) -> None:
    proc, evs = _run(events, tmp_path, "crawl", "--isolate", "--guard", "--budget", "128MiB")
    end = evs[-1]
    assert end["reason"] == "pressure-stop", proc.stderr
    assert "stalled 10s on memory under memory.high 128 MiB" in end["message"]
    assert end["oom_kills"] == 0 and (tmp_path / "marker").read_text() == "TERM\n"


# Touches 1 MiB at a time until its group's memory.current is over memory.high by 1 MiB, prints
# "held" and idles; each line on stdin: 1 MiB more (over memory.high again), "held".
HOLD = """
import sys
grp = '/sys/fs/cgroup' + open('/proc/self/cgroup').read().split('::')[1].strip()
high = int(open(grp + '/memory.high').read())
def touch(n):
    c = bytearray(n); c[::4096] = b'x' * len(range(0, n, 4096)); return c
chunks = []
while int(open(grp + '/memory.current').read()) <= high + (1 << 20):
    chunks.append(touch(1 << 20))
print('held', flush=True)
for line in sys.stdin:
    chunks.append(touch(1 << 20))
    print('held', flush=True)
"""


def test_memory_events_wakes_the_alarm_once_per_change(group: GroupFactory) -> None:
    g = group(256 * MiB)
    g.write("memory.high", 64 * MiB)
    alarm = Alarm(LiveRoot(), CgroupFS(), str(g.path), 2)
    alarm.arm(192 * MiB, 64 * MiB, 0)
    assert alarm.failure is None and alarm.fd is not None and alarm.pop_notes() == []
    poller = select.poll()
    poller.register(alarm.fd, alarm.events)
    assert poller.poll(0) == []  # read at the opening: nothing new yet
    hog = g.popen(PYTHON, "-c", HOLD, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert hog.stdin is not None and hog.stdout is not None
    try:
        assert hog.stdout.readline() == "held\n"  # over memory.high, then idle
        assert poller.poll(5000), "memory.events did not wake the alarm"
        high = g.keyed("memory.events")["high"]
        assert high > 0
        time.sleep(0.1)  # kernfs delivers a change at most every 10 ms: all of them now
        alarm.drain(alarm.fd)
        assert alarm.wakeups == 1
        assert poller.poll(300) == []  # read again: nothing new, no wake-up
        hog.stdin.write("more\n")
        hog.stdin.flush()
        assert hog.stdout.readline() == "held\n"  # over memory.high again
        assert poller.poll(5000), "no wake-up on the next change"
        assert g.keyed("memory.events")["high"] > high
        alarm.drain(alarm.fd)
        assert alarm.wakeups == 2
    finally:
        hog.kill()
        hog.wait()
        alarm.close()


def test_the_kernel_wakes_the_guard_over_memory_high(events: Path, tmp_path: Path) -> None:
    proc, evs = _run(events, tmp_path, "over", "--isolate", "--guard", "--budget", "128MiB")
    assert proc.returncode == 0, proc.stderr
    high, throttled = proc.stdout.split()
    assert int(high) == 128 * MiB and int(throttled) > 0
    end = evs[-1]
    woke = re.search(r"woken by the kernel (\d+) time\(s\)$", end["message"])
    assert end["reason"] == "clean" and woke, end["message"]
    assert 1 <= int(woke[1]) <= int(throttled)  # once per change at most: each wake-up read what changed


def test_grace_bytes_lets_a_graceful_stop_finish_on_v2(group: GroupFactory, events: Path, tmp_path: Path) -> None:
    """Issue 24, item 1, on v2: in a 384 MiB group stopped at 320 MiB (the default 64 MiB margin),
    a shutdown that adds 30 % meets memory.max and the kernel kills the worker; with
    --grace-bytes 128MiB the stop comes at 192 MiB and the worker finishes, 20 runs of 20."""
    g = group(384 * MiB)
    grew = tmp_path / "grew"

    def once(*args: str) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
        events.unlink(missing_ok=True)
        grew.unlink(missing_ok=True)
        cmd = [PYTHON, "-m", "oomguard", "run", "--restart", "never", "--events", str(events), "--guard"]
        cmd += ["--stop-timeout", "20s", *args, "--", PYTHON, "-c", GRACEFUL, str(grew)]
        proc = g.run(*cmd)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc, read_events(events)[-1]

    proc, end = once()
    assert (end["reason"], end["stop_finished"]) == ("oom-kill", False), proc.stderr
    kills = g.keyed("memory.events")["oom_kill"]
    for _ in range(20):
        proc, end = once("--grace-bytes", "128MiB")
        assert (end["reason"], end["oom_kills"], end["stop_finished"]) == ("pressure-stop", 0, True), proc.stderr
        assert end["grace_bytes"] == 128 * MiB and 192 * MiB <= end["stop_working_set_bytes"] < 256 * MiB, end
        assert 0.5 * int(grew.read_text()) * MiB <= end["grown_after_stop_bytes"], (grew.read_text(), end)
    assert g.keyed("memory.events")["oom_kill"] == kills  # not one more in the 20 runs


# GRACEFUL, then the worker's own group's memory.high as its shutdown ended, written to argv[2].
GRACEFUL_SAYS_HIGH = (
    GRACEFUL
    + "grp = '/sys/fs/cgroup' + open('/proc/self/cgroup').read().split('::')[1].strip()\n"
    + "open(sys.argv[2], 'w').write(open(grp + '/memory.high').read())\n"
)


@pytest.mark.skipif(not os.path.exists("/proc/pressure/memory"), reason="PSI is off in this kernel (psi=0)")
def test_memory_high_is_lifted_under_the_ceiling_while_the_worker_stops(events: Path, tmp_path: Path) -> None:
    """Issue 24, item 1, v2 with --isolate: at the 128 MiB budget the guard sets memory.high there;
    the worker crawls under it until the stall stop. Left at the budget, memory.high would throttle
    the graceful stop that follows (30 % more) past --stop-timeout; the guard lifts it to just under
    the isolated group's 256 MiB limit, half a guard margin (32 MiB) below, and the stop finishes."""
    grew, high = tmp_path / "grew", tmp_path / "high"
    cmd = [PYTHON, "-m", "oomguard", "run", "--restart", "never", "--events", str(events), "--isolate", "--guard"]
    cmd += ["--budget", "128MiB", "--stop-timeout", "10s", "--", PYTHON, "-c", GRACEFUL_SAYS_HIGH, str(grew), str(high)]
    proc = subprocess.run(cmd, env=oomguard_env(), capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    end = read_events(events)[-1]
    assert (end["reason"], end["oom_kills"], end["stop_finished"]) == ("pressure-stop", 0, True), proc.stderr
    assert "stalled 10s on memory under memory.high 128 MiB" in end["message"]
    assert end["grace_high_bytes"] == 224 * MiB and int(high.read_text()) == 224 * MiB, (end, high.read_text())
    assert int(grew.read_text()) > 0 and "set to 224 MiB while the worker stops" in proc.stderr
