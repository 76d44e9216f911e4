"""How children end: the one exit classifier, verify's outcomes, the child protocol, and both read
through a fake tree (a DirRoot whose oom_kill counter the worker itself moves, as the kernel would).

``cgroup_tree`` and ``supervise_in_tree`` are shared with test_run.py and test_boundaries.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from oomguard.errors import EXIT_CODES, EXIT_VERIFY_FAILED
from oomguard.policy.budget import probe
from oomguard.sources.root import DirRoot
from oomguard.supervisor.exits import NO_COUNTER, classify, exit_fields, shell_status
from oomguard.verify._alloc import EXIT_ALLOC_FAILED
from oomguard.verify.launch import child_argv, start_child
from oomguard.verify.runner import outcome, verify
from tests.conftest import REPO, run_oomguard

pytestmark = pytest.mark.usefixtures("clean_env")

MiB = 1024**2
GiB = 1024**3
PY = sys.executable
V2_EVENTS = "sys/fs/cgroup/memory.events"
V1_OOM_CONTROL = "sys/fs/cgroup/memory/memory.oom_control"


def cgroup_tree(tmp: Path, version: int = 2, limit: int = 2 * GiB, *, counter: bool = True, **extra: str) -> Path:
    """A minimal tree with one memory cgroup at the mount root, limit *limit*, oom_kill 0."""
    mem_total_kb = 2 * max(limit, GiB) // 1024
    files = {
        "proc/meminfo": f"MemTotal:       {mem_total_kb} kB\nMemAvailable:   {mem_total_kb // 2} kB\n",
        "proc/self/environ": "",
        "proc/self/status": "Name:\tpython3\nCapEff:\t0000000000000000\n",
    }
    if version == 2:
        files |= {
            "proc/self/cgroup": "0::/\n",
            "proc/self/mountinfo": "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
            "sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
            "sys/fs/cgroup/memory.max": f"{limit}\n",
            "sys/fs/cgroup/memory.current": "1048576\n",
        }
        if counter:
            files[V2_EVENTS] = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"
    else:
        files |= {
            "proc/self/cgroup": "4:memory:/\n",
            "proc/self/mountinfo": "35 25 0:30 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n",
            "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{limit}\n",
            "sys/fs/cgroup/memory/memory.usage_in_bytes": "1048576\n",
        }
        if counter:
            files[V1_OOM_CONTROL] = "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"
    for name, text in {**files, **extra}.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    return tmp


# The supervisor runs in its own process (it installs signal handlers, reaps every child and may
# become a subreaper: none of that belongs in the test runner), reading the fake tree.
SUPERVISE = """
import ctypes, errno, json, sys
from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import DirRoot
from oomguard.supervisor.events import EventLog
from oomguard.supervisor.restart import RestartPolicy
from oomguard.supervisor.supervise import RunConfig, Supervisor

class DenyingLibc:  # prctl fails with EPERM, as under a seccomp filter
    def prctl(self, *args):
        ctypes.set_errno(errno.EPERM)
        return -1

tree, events, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
policy = RestartPolicy(opts.get("restart", "on-failure"), backoff_initial=0.01, max_restarts=opts.get("max_restarts"))
config = RunConfig(opts["command"], budget=opts.get("budget"), policy=policy, isolate=opts.get("isolate", False))
libc = DenyingLibc() if opts.get("deny_prctl") else None
sup = Supervisor(config, EventLog(events), root=DirRoot(tree), cgroupfs=CgroupFS(tree), libc=libc)
sys.exit(sup.run())
"""

# A worker that plays the OOM killer: it raises the oom_kill counter in COUNTER and SIGKILLs
# itself, until the counter reaches UPTO; then it exits 0.
OOM_WORKER = (
    "import os, re, signal, sys\n"
    "path, upto = sys.argv[1], int(sys.argv[2])\n"
    "text = open(path).read()\n"
    "n = int(re.search(r'^oom_kill (\\d+)$', text, re.M).group(1))\n"
    "if n >= upto: sys.exit(0)\n"
    "open(path, 'w').write(re.sub(r'^oom_kill \\d+$', f'oom_kill {n + 1}', text, flags=re.M))\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n"
)


def supervise_in_tree(tree: Path, **opts: Any) -> tuple[int, list[dict[str, Any]], str, int]:
    """Run a Supervisor over *tree*: (exit status, events, stderr, the supervisor's pid)."""
    events = tree.parent / f"{tree.name}-events.jsonl"
    events.unlink(missing_ok=True)  # one run's events only
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [PY, "-c", SUPERVISE, str(tree), str(events), json.dumps(opts)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    lines = events.read_text().splitlines() if events.exists() else []
    return proc.returncode, [json.loads(line) for line in lines], err, proc.pid


# -- the classifier, on its own --------------------------------------------------------------


@pytest.mark.parametrize(
    ("rc", "before", "after", "reason", "note"),
    [
        (0, 0, 0, "clean", None),
        (0, 0, 5, "clean", None),  # a clean exit stays clean, whatever the counter did
        (3, 0, 0, "exit", None),
        (137, 0, 1, "exit", None),  # a shell's "128 + 9" is an exit status, not a signal
        (-9, 0, 1, "oom-kill", None),
        (-9, 4, 7, "oom-kill", None),
        (-9, 1, 1, "signal", None),  # SIGKILL, counter unchanged: an operator's kill -9
        (-9, 2, 1, "signal", None),  # a counter that went down (group re-created) is no OOM kill
        (-15, 0, 1, "signal", None),  # only SIGKILL can be the OOM killer
        (-6, 0, 1, "signal", None),
        (-9, None, None, "signal", NO_COUNTER),
        (-9, 0, None, "signal", NO_COUNTER),
        (-9, None, 1, "signal", NO_COUNTER),
        (-15, None, None, "signal", None),  # no counter, but not a SIGKILL: nothing to tell apart
        (1, None, None, "exit", None),
    ],
)
def test_classify(rc: int, before: int | None, after: int | None, reason: str, note: str | None) -> None:
    assert classify(rc, before, after) == (reason, note)


@pytest.mark.parametrize(
    ("rc", "fields", "status"),
    [(0, (0, None), 0), (5, (5, None), 5), (-9, (None, 9), 137), (-15, (None, 15), 143)],
)
def test_exit_fields_and_shell_status(rc: int, fields: tuple[int | None, int | None], status: int) -> None:
    assert exit_fields(rc) == {"exit_code": fields[0], "signal": fields[1]}
    assert shell_status(rc) == status


@pytest.mark.parametrize(
    ("rc", "before", "after", "want"),
    [
        (0, 0, 0, "ok"),
        (1, 0, 0, "exit"),
        (EXIT_ALLOC_FAILED, 0, 0, "allocation-failed"),
        (-9, 0, 1, "oom-kill"),
        (-9, 0, 0, "signal"),
        (-9, None, None, "signal"),
        (-15, 0, 1, "signal"),
    ],
)
def test_verify_outcomes_come_from_the_same_classifier(rc: int, before: int, after: int, want: str) -> None:
    assert outcome(rc, before, after) == want


# -- the child protocol ----------------------------------------------------------------------


def test_the_alloc_failure_code_is_no_cli_exit_code() -> None:
    assert EXIT_ALLOC_FAILED not in {code for code, _ in EXIT_CODES}
    assert EXIT_ALLOC_FAILED not in (1, 2, 126, 127) and EXIT_ALLOC_FAILED < 128  # no shell or signal meaning


def test_launcher_speaks_the_alloc_protocol() -> None:
    with pytest.raises(ValueError, match="no such oomguard child"):
        child_argv("_nope")
    ok = start_child("_alloc", str(4 * MiB), stdin=subprocess.PIPE)
    assert ok.stdout is not None and ok.stdin is not None
    assert json.loads(ok.stdout.readline())["touched"] == 4 * MiB
    ok.stdin.close()  # the child holds its memory until its stdin closes
    assert ok.wait(30) == 0
    failed = start_child("_alloc", str(1 << 60))  # an exbibyte: no address space holds it
    out, _ = failed.communicate(timeout=30)
    assert "error" in json.loads(out) and failed.returncode == EXIT_ALLOC_FAILED


def test_a_failed_allocation_exits_verify_4_not_the_childs_code() -> None:
    """The child's EXIT_ALLOC_FAILED stays inside verify: the user sees EXIT_VERIFY_FAILED."""
    proc = run_oomguard("verify", "--budget", str(1 << 62), "--hold", "0.1", "--json")
    assert proc.returncode == EXIT_VERIFY_FAILED, proc.stderr
    result = json.loads(proc.stdout)
    assert result["delivered"] is False
    assert {c["outcome"] for c in result["children"]} == {"allocation-failed"}
    assert {c["exit_code"] for c in result["children"]} == {EXIT_ALLOC_FAILED}


# -- verify through a fake tree -------------------------------------------------------------------


def test_verify_reads_counter_and_usage_through_its_root(tmp_path: Path) -> None:
    tree = cgroup_tree(tmp_path / "tree", 2, 64 * MiB, **{"sys/fs/cgroup/memory.current": "12345\n"})
    root = DirRoot(str(tree))
    report = probe(root=root, budget="8MiB")
    events = tree / V2_EVENTS

    def oom_kill_meanwhile() -> None:  # the counter moves while the children hold their memory
        time.sleep(0.3)
        events.write_text("oom 2\noom_kill 2\n")

    bump = threading.Thread(target=oom_kill_meanwhile)
    bump.start()
    result = verify(report, None, fraction=0.5, hold=1.0, root=root)
    bump.join()
    assert result["oom_counter"] == "/sys/fs/cgroup/memory.events"
    assert result["oom_kills"] == 2  # 0 before, 2 after: read from the tree, not from this machine
    assert result["cgroup_usage_bytes"] == 12345
    assert result["peak_rss_bytes"] is None  # the tree has no /proc/PID/status of the children
    assert result["target_bytes"] == 4 * MiB and result["delivered"] is True  # no child was SIGKILLed


def test_verify_without_a_counter_says_unknown(tmp_path: Path) -> None:
    root = DirRoot(str(cgroup_tree(tmp_path / "tree", 1, 64 * MiB, counter=False)))
    result = verify(probe(root=root, budget="2MiB"), None, hold=0, root=root)
    assert (result["oom_counter"], result["oom_kills"]) == (None, None)
    assert result["cgroup_usage_bytes"] == 1048576  # v1 memory.usage_in_bytes


# -- the supervisor through a fake tree -------------------------------------------------------


@pytest.mark.parametrize(("version", "counter"), [(2, V2_EVENTS), (1, V1_OOM_CONTROL)])
def test_run_tells_an_oom_kill_by_the_trees_counter(tmp_path: Path, version: int, counter: str) -> None:
    tree = cgroup_tree(tmp_path / "tree", version)
    command = [PY, "-c", OOM_WORKER, str(tree / counter), "1"]
    rc, ev, _, _ = supervise_in_tree(tree, command=command, budget="1GiB")
    assert rc == 0
    exits = [(e["reason"], e["signal"], e["exit_code"]) for e in ev if e["event"] == "exit"]
    assert exits == [("oom-kill", 9, None), ("clean", None, 0)]
    assert [e["event"] for e in ev] == ["start", "exit", "restart", "start", "exit"]


def test_run_a_sigkill_without_the_counter_moving_is_a_signal(tmp_path: Path) -> None:
    tree = cgroup_tree(tmp_path / "tree", 2)
    kill = [PY, "-c", f"import os; os.kill(os.getpid(), {int(signal.SIGKILL)})"]
    rc, ev, _, _ = supervise_in_tree(tree, command=kill, budget="1GiB", restart="never")
    assert rc == 137 and (ev[1]["reason"], ev[1]["signal"], ev[1]["message"]) == ("signal", 9, None)
    bare = cgroup_tree(tmp_path / "bare", 2, counter=False)
    rc, ev, err, _ = supervise_in_tree(bare, command=kill, budget="1GiB", restart="never")
    assert rc == 137 and (ev[1]["reason"], ev[1]["message"]) == ("signal", NO_COUNTER)
    assert NO_COUNTER in err
