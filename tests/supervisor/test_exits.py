"""How children end: the one exit classifier, verify's outcomes, the child protocol, and both read
through a fake tree (a DirRoot whose oom_kill counter the worker itself moves, as the kernel would).

``cgroup_tree`` and ``supervise_in_tree`` are shared with test_run.py and test_boundaries.py.
"""

from __future__ import annotations

import io
import json
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomguard.errors import EXIT_CODES, EXIT_VERIFY_FAILED
from oomguard.policy.budget import probe
from oomguard.sources.root import DirRoot
from oomguard.supervisor.exits import NO_COUNTER, Evidence, Verdict, classify, evidence, exit_fields, shell_status
from oomguard.supervisor.members import Members, gone, outsiders, parse_stat_ids
from oomguard.verify._alloc import EXIT_ALLOC_FAILED
from oomguard.verify.launch import child_argv, start_child
from oomguard.verify.progress import Progress, collect
from oomguard.verify.runner import outcome, verify
from tests.conftest import run_oomguard
from tests.helpers.supervise import OOM_WORKER, V1_OOM_CONTROL, V2_EVENTS, cgroup_tree, supervise_in_tree

pytestmark = pytest.mark.usefixtures("clean_env")

MiB = 1024**2
GiB = 1024**3
PY = sys.executable
# -- the classifier, on its own --------------------------------------------------------------

UNPLACED = (
    "an OOM kill happened in the group during the run (oom_kill +{k}); "
    "cannot tell whether it was {who} ({why}; --isolate tells exactly)"
)
GONE1 = "1 other process(es) of the group ended meanwhile"
UNREAD = "the group's processes could not be read"
DESC = "the worker then ended with {end}"  # the OOM killer at the limit is the exit event's (events.py)
ZERO = "exited 0, but the group's oom_kill counter rose by {k} during the run"


@pytest.mark.parametrize(
    ("rc", "before", "after", "others_gone", "verdict"),
    [
        (0, 0, 0, 0, ("clean", None, None)),
        (0, 0, 5, 0, ("clean", "descendant", ZERO.format(k=5))),  # clean stays clean; the rise is said
        (0, 0, 1, 1, ("clean", "group", ZERO.format(k=1))),
        (3, 0, 0, 0, ("exit", None, None)),
        (-9, 0, 1, 0, ("oom-kill", "worker", None)),
        (-9, 4, 7, 2, ("oom-kill", "worker", None)),  # 3 kills, 2 outsiders gone: one was in the tree
        (-9, 1, 1, 0, ("signal", None, None)),  # SIGKILL, counter unchanged: an operator's kill -9
        (-9, 2, 1, 0, ("signal", None, None)),  # a counter that went down (group re-created) is no OOM kill
        # kill -9 while another process of the group was OOM-killed: not blamed on the OOM killer
        (-9, 0, 1, 1, ("signal", "group", UNPLACED.format(k=1, who="this process", why=GONE1))),
        (-9, 0, 1, None, ("signal", "group", UNPLACED.format(k=1, who="this process", why=UNREAD))),
        # a wrapper whose child was OOM-killed: a shell's "128 + 9", a plain failure, another signal
        (137, 0, 1, 0, ("oom-kill", "descendant", DESC.format(k=1, end="code 137"))),
        (1, 0, 1, 0, ("oom-kill", "descendant", DESC.format(k=1, end="code 1"))),
        (-15, 0, 1, 0, ("oom-kill", "descendant", DESC.format(k=1, end="signal 15"))),
        (1, 0, 1, 1, ("exit", "group", UNPLACED.format(k=1, who="one of its descendants", why=GONE1))),
        (-9, None, None, 0, ("signal", None, NO_COUNTER)),
        (-9, 0, None, 0, ("signal", None, NO_COUNTER)),
        (-9, None, 1, 0, ("signal", None, NO_COUNTER)),
        (-15, None, None, 0, ("signal", None, None)),  # no counter, but not a SIGKILL: nothing to tell apart
        (1, None, None, 0, ("exit", None, None)),
    ],
)
def test_classify(rc: int, before: int | None, after: int | None, others_gone: int | None, verdict: Verdict) -> None:
    assert classify(rc, evidence(before, after, others_gone)) == verdict


@pytest.mark.parametrize(
    ("rc", "e", "reason"),
    [
        (1, Evidence(1, 0), "exit"),  # a child without descendants did not lose one to the OOM killer
        (-15, Evidence(1, 0), "signal"),
        (0, Evidence(3, 0), "clean"),
        (-9, Evidence(1, 0), "oom-kill"),
        (-9, Evidence(1, 1), "signal"),
    ],
)
def test_classify_a_child_without_descendants(rc: int, e: Evidence, reason: str) -> None:
    verdict = classify(rc, e, descendants=False)
    assert verdict.reason == reason and (verdict.victim in (None, "worker", "group"))


@pytest.mark.parametrize(
    ("rc", "fields", "status"),
    [(0, (0, None), 0), (5, (5, None), 5), (-9, (None, 9), 137), (-15, (None, 15), 143)],
)
def test_exit_fields_and_shell_status(rc: int, fields: tuple[int | None, int | None], status: int) -> None:
    assert exit_fields(rc) == {"exit_code": fields[0], "signal": fields[1]}
    assert shell_status(rc) == status


@pytest.mark.parametrize(
    ("rc", "before", "after", "gone", "want"),
    [
        (0, 0, 0, 0, "ok"),
        (1, 0, 0, 0, "exit"),
        (1, 0, 1, 0, "exit"),  # another child's OOM kill is not this one's
        (EXIT_ALLOC_FAILED, 0, 0, 0, "allocation-failed"),
        (-9, 0, 1, 0, "oom-kill"),
        (-9, 0, 1, 1, "signal"),  # an outsider of the group may have been the victim
        (-9, 0, 0, 0, "signal"),
        (-9, None, None, 0, "signal"),
        (-15, 0, 1, 0, "signal"),
    ],
)
def test_verify_outcomes_come_from_the_same_classifier(rc: int, before: int, after: int, gone: int, want: str) -> None:
    assert outcome(rc, evidence(before, after, gone)) == want


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


# -- who else is in the group ----------------------------------------------------------------

STAT = "{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0"


def test_parse_stat_ids() -> None:
    assert parse_stat_ids(STAT.format(pid=7, comm="a b) (c", ppid=3, start=5187)) == (3, 5187)
    assert parse_stat_ids("7 (sh) S 3 7 7") is None  # too short
    assert parse_stat_ids("") is None and parse_stat_ids("garbage") is None


@given(st.text())
def test_parse_stat_ids_never_raises(text: str) -> None:
    got = parse_stat_ids(text)
    assert got is None or (isinstance(got[0], int) and isinstance(got[1], int))


def _proc(tree: Path, pid: int, ppid: int, start: int = 100) -> None:
    (tree / f"proc/{pid}").mkdir(parents=True, exist_ok=True)
    (tree / f"proc/{pid}/stat").write_text(STAT.format(pid=pid, comm="p", ppid=ppid, start=start))


def test_outsiders_through_a_fake_tree(tmp_path: Path) -> None:
    tree = cgroup_tree(tmp_path / "tree", 2)
    root, cg = DirRoot(str(tree)), "/sys/fs/cgroup"
    _proc(tree, 100, 1)  # me, the supervisor
    _proc(tree, 101, 100)  # my worker
    _proc(tree, 102, 101)  # its child
    _proc(tree, 200, 1)  # an agent beside me
    _proc(tree, 300, 1)  # in a group below (v2: hierarchical counter)
    (tree / "sys/fs/cgroup/cgroup.procs").write_text("100\n101\n200\n0\n999\n")  # 0: another PID namespace
    (tree / "sys/fs/cgroup/sub").mkdir()
    (tree / "sys/fs/cgroup/sub/cgroup.procs").write_text("102\n300\n")
    before = outsiders(root, cg, 2, 100)
    assert before == Members(frozenset({(200, 100), (300, 100)}), 1)  # 999 has no /proc entry: gone already
    assert outsiders(root, cg, 1, 100) == Members(frozenset({(200, 100)}), 1)  # v1: the group's own processes
    _proc(tree, 200, 1, start=555)  # the agent died and its PID was reused
    (tree / "sys/fs/cgroup/cgroup.procs").write_text("100\n200\n")
    after = outsiders(root, cg, 2, 100)
    assert gone(before, after) == 2  # the old 200, and the unnamed one; 300 is still there
    assert gone(before, None) is None and gone(None, after) is None
    assert outsiders(root, "/sys/fs/cgroup/nope", 2, 100) is None  # unreadable: unknown, not empty
    assert outsiders(root, None, 2, 100) is None and outsiders(root, cg, None, 100) is None


# -- verify's progress -----------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# A child speaking the _alloc protocol: progress lines, then its final line (or garbage, or nothing).
TALKER = "import json, sys, time\nfor line in sys.argv[1:]:\n    print(line, flush=True); time.sleep(0.05)\n"


def test_progress_on_a_terminal_is_a_line_per_child_redrawn() -> None:
    term = Terminal()
    p = Progress(term, [4 * GiB, 2 * GiB], [11, 22])
    p.update(0, GiB, 0.5)
    p._last = 0.0  # the next update may redraw at once
    p.update(1, 2 * GiB, 1.0)
    p.finish(1.2)
    out = term.getvalue()
    first, second, last = out.split("\x1b[2F")  # back up over the two lines before each redraw
    assert first == (
        "oomguard verify: child 11: 1 GiB of 4 GiB (25%), 2.15 GB/s\x1b[K\n"
        "oomguard verify: child 22: 0 B of 2 GiB (0%), -\x1b[K\n"
    )
    assert second.splitlines()[1] == "oomguard verify: child 22: 2 GiB of 2 GiB (100%), 2.15 GB/s\x1b[K"
    assert last == second


def test_progress_elsewhere_is_one_summary_line() -> None:
    log = io.StringIO()
    p = Progress(log, [4 * GiB, 2 * GiB], [11, 22])
    p.touched(0, 4 * GiB, 2.0)
    p.touched(1, 2 * GiB, 1.0)
    assert log.getvalue() == ""
    p.finish(2.34)
    assert log.getvalue() == "oomguard verify: 2 children touched 6 GiB of 6 GiB in 2.3s (3.22 GB/s)\n"
    # A child killed half way: its progress is not "touched" (the result's touched_bytes says the same).
    log = io.StringIO()
    p = Progress(log, [4 * GiB, 2 * GiB], [11, 22])
    p.touched(0, 4 * GiB, 2.0)
    p.update(1, GiB, 1.0)
    p.finish(2.34)
    assert log.getvalue() == "oomguard verify: 1 of 2 children touched 4 GiB of 6 GiB in 2.3s (2.15 GB/s)\n"
    Progress(None, [1], [1]).finish(1.0)  # nowhere to say it: nothing, no error


def test_collect_reads_every_child_at_once() -> None:
    lines = [
        [
            '{"progress": 1024, "seconds": 0.5}',
            '{"progress": 2048, "seconds": 1.0}',
            '{"touched": 4096, "seconds": 2.0}',
        ],
        ["not json"],
        [],
        ['{"error": "MemoryError: boom"}'],
    ]
    procs = [subprocess.Popen([PY, "-c", TALKER, *ls], stdout=subprocess.PIPE, text=True) for ls in lines]
    term = Terminal()
    meter = Progress(term, [4096, 1, 1, 1], [p.pid for p in procs])
    finals = collect(procs, meter)
    for p in procs:
        p.wait(10)
    assert finals == [{"touched": 4096, "seconds": 2.0}, {}, {}, {"error": "MemoryError: boom"}]
    assert meter.done[0] == 4096 and meter.seconds[0] == 2.0
    assert f"child {procs[0].pid}: 1 KiB of 4 KiB (25%), " in term.getvalue()  # a progress line was shown


def test_verify_shows_progress_on_the_stream_it_is_given(tmp_path: Path) -> None:
    root = DirRoot(str(cgroup_tree(tmp_path / "tree", 2, 64 * MiB)))
    log = io.StringIO()
    result = verify(probe(root=root, budget="4MiB"), None, hold=0, root=root, progress=log)
    assert result["delivered"] is True
    n = len(result["children"])
    assert log.getvalue().startswith(f"oomguard verify: {n} children touched 4 MiB of 4 MiB in ")


# -- verify through a fake tree -------------------------------------------------------------------


def test_verify_reads_counter_and_usage_through_its_root(tmp_path: Path) -> None:
    tree = cgroup_tree(tmp_path / "tree", 2, 64 * MiB, extra={"sys/fs/cgroup/memory.current": "12345\n"})
    root = DirRoot(str(tree))
    report = probe(root=root, budget="8MiB")
    events = tree / V2_EVENTS

    class Told(io.StringIO):
        """verify's progress stream: its first line comes once every child has touched its share,
        after the counter's first read and before the hold (verify/runner.py)."""

        said = threading.Event()

        def write(self, text: str) -> int:
            self.said.set()
            return super().write(text)

    progress = Told()

    def oom_kill_meanwhile() -> None:  # the counter moves while the children hold their memory
        assert progress.said.wait(60), "verify's children never reported"
        events.write_text("oom 2\noom_kill 2\n")

    bump = threading.Thread(target=oom_kill_meanwhile)
    bump.start()
    result = verify(report, None, fraction=0.5, hold=1.0, root=root, progress=progress)
    bump.join()
    assert result["oom_counter"] == "/sys/fs/cgroup/memory.events"
    assert result["oom_kills"] == 2  # 0 before, 2 after: read from the tree, not from this machine
    assert result["cgroup_usage_bytes"] == 12345
    assert result["children_vmhwm_sum_bytes"] is None  # the tree has no /proc/PID/status of the children
    assert (result["group_peak_bytes"], result["group_peak_source"]) == (12345, "usage-sampled")  # no memory.peak
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
    assert rc == 137 and (ev[1]["reason"], ev[1]["signal"], ev[1]["oom_victim"]) == ("signal", 9, None)
    assert ev[1]["message"].startswith("peak ") and ev[1]["oom_kills"] == 0
    bare = cgroup_tree(tmp_path / "bare", 2, counter=False)
    rc, ev, err, _ = supervise_in_tree(bare, command=kill, budget="1GiB", restart="never")
    assert rc == 137 and ev[1]["reason"] == "signal" and ev[1]["message"].endswith("; " + NO_COUNTER)
    assert ev[1]["oom_kills"] is None and NO_COUNTER in err


# A wrapper (a shell) whose child plays the OOM killer on itself: the shell exits 3.
def _wrapper(counter: Path) -> list[str]:
    child = f"{PY} -c {shlex.quote(OOM_WORKER)} {counter} 1"
    return ["sh", "-c", f"{child}; exit 3"]


@pytest.mark.parametrize(("version", "counter"), [(2, V2_EVENTS), (1, V1_OOM_CONTROL)])
def test_run_a_descendants_oom_kill_is_an_oom_kill(tmp_path: Path, version: int, counter: str) -> None:
    tree = cgroup_tree(tmp_path / "tree", version)
    rc, ev, err, _ = supervise_in_tree(tree, command=_wrapper(tree / counter), budget="1GiB", restart="never")
    assert rc == 3
    end = ev[1]
    assert (end["reason"], end["oom_victim"], end["exit_code"], end["signal"], end["oom_kills"]) == (
        "oom-kill",
        "descendant",
        3,
        None,
        1,
    )
    assert end["message"].endswith(
        f"; a descendant of the worker was killed by the kernel's OOM killer at the 2 GiB limit (cgroup-v{version}, "
        "oom_kill +1); the worker then ended with code 3"
    )
    assert "oomguard run: exit, pid " in err and ", oom-kill of a descendant, after " in err


# A worker that plays an operator's kill -9 while another process of the group is OOM-killed: it
# raises the counter, removes the outsider from cgroup.procs (the kernel would: it died), and
# SIGKILLs itself.
KILL9_WHILE_OUTSIDER_DIES = OOM_WORKER.replace(
    "os.kill(os.getpid(), signal.SIGKILL)\n",
    "open(sys.argv[3], 'w').write('')\nos.kill(os.getpid(), signal.SIGKILL)\n",
)


def _outsider(tree: Path, procs: str, pid: int = 4242) -> None:
    """A process of the group outside the supervisor's tree: its PID in cgroup.procs, its stat in /proc."""
    (tree / procs).write_text(f"{pid}\n")
    (tree / f"proc/{pid}").mkdir(parents=True)
    stat = f"{pid} (agent) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 5187 0 0"
    (tree / f"proc/{pid}/stat").write_text(stat)


def test_run_a_kill_9_is_not_blamed_on_an_outsiders_oom_kill(tmp_path: Path) -> None:
    tree = cgroup_tree(tmp_path / "tree", 2)
    procs = tree / "sys/fs/cgroup/cgroup.procs"
    _outsider(tree, "sys/fs/cgroup/cgroup.procs")
    worker = [PY, "-c", KILL9_WHILE_OUTSIDER_DIES, str(tree / V2_EVENTS), "1", str(procs)]
    rc, ev, _, _ = supervise_in_tree(tree, command=worker, budget="1GiB", restart="never")
    assert rc == 137
    end = ev[1]
    assert (end["reason"], end["signal"], end["oom_victim"], end["oom_kills"]) == ("signal", 9, "group", 1)
    assert end["message"].endswith(
        "an OOM kill happened in the group during the run (oom_kill +1); cannot tell whether it was this "
        "process (1 other process(es) of the group ended meanwhile; --isolate tells exactly)"
    )
    # The outsider lives on: the kill fell inside the supervisor's tree, so it is the worker's.
    tree2 = cgroup_tree(tmp_path / "tree2", 2)
    _outsider(tree2, "sys/fs/cgroup/cgroup.procs")
    worker = [PY, "-c", OOM_WORKER, str(tree2 / V2_EVENTS), "1"]
    rc, ev, _, _ = supervise_in_tree(tree2, command=worker, budget="1GiB", restart="never")
    assert rc == 137 and (ev[1]["reason"], ev[1]["oom_victim"]) == ("oom-kill", "worker")
