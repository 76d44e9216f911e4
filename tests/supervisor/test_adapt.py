"""What an end teaches the next start (supervisor/adapt.py; issue 38, item 7): an OOM kill in the
worker's graceful stop for the guard teaches the grace, never the auto margin; a margin step never
leaves a budget that cannot work. On numbers, then the whole supervisor over a fake tree (the
worker plays the kernel: it raises the group's oom_kill counter and SIGKILLs itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomguard.policy.budget import default_margin
from oomguard.supervisor.adapt import GRACE, Adaptation, budget_left, lesson
from tests.conftest import REPO
from tests.helpers.supervise import OOM_WORKER, V2_EVENTS, cgroup_tree, supervise_in_tree

pytestmark = pytest.mark.usefixtures("clean_env")

MiB = 1024**2
GiB = 1024**3
PY = sys.executable


def auto(basis: int, extra: int = 0) -> Any:
    """A report's auto budget as ``run`` computes it before a start: the default margin + *extra*."""
    margin = default_margin(basis) + extra
    return {"budget": {"source": "auto", "basis_bytes": basis, "safety_margin_bytes": margin, "bytes": basis - margin}}


# -- which lesson an end teaches -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "guard_stopped", "taught"),
    [
        ("oom-kill", True, GRACE),  # killed in its graceful stop: the shutdown needs more room
        ("oom-kill", False, "oom-kill"),  # killed while it worked: ask for less
        ("pressure-stop", True, "pressure-stop"),  # stopped and finished: ask for less
        ("signal", True, None),  # SIGKILL at --stop-timeout without an OOM kill: nothing to learn
        ("exit", False, None),
        ("clean", False, None),
    ],
)
def test_the_lesson_of_an_end(reason: str, guard_stopped: bool, taught: str | None) -> None:
    assert lesson(reason, guard_stopped=guard_stopped) == taught


# -- the margin never takes the whole budget ------------------------------------------------------


def test_a_512_mib_group_halves_its_budget_after_an_oom_kill_never_to_0() -> None:
    """The issue's case: 512 MiB, auto budget 256 MiB; the 256 MiB step would leave 0 (run exited 3)."""
    a, under = Adaptation("margin"), (512 * MiB, None, None)
    assert a.after_oom(auto(512 * MiB), None, under) == (
        "after an OOM kill: safety margin raised by 128 MiB (now +128 MiB): half of the 256 MiB budget left, "
        "since a step of 256 MiB would leave no budget that works"
    )
    assert budget_left(512 * MiB, default_margin(512 * MiB) + a.extra_margin) == 128 * MiB
    a.after_oom(auto(512 * MiB, a.extra_margin), None, under)
    assert budget_left(512 * MiB, default_margin(512 * MiB) + a.extra_margin) == 64 * MiB


def test_at_the_last_mib_the_step_is_refused_and_the_budget_kept() -> None:
    a = Adaptation("margin")
    a.extra_margin = 255 * MiB  # a 512 MiB group's budget down to 1 MiB
    assert a.after_oom(auto(512 * MiB, a.extra_margin), None, (512 * MiB, None, None), "pressure-stop") == (
        "after a pressure stop: the safety margin stays +255 MiB: a step of 25.6 MiB would leave no budget that "
        "works; the last workable budget 1 MiB is kept"
    )
    assert a.extra_margin == 255 * MiB


def test_a_step_that_leaves_a_working_budget_is_taken_whole() -> None:
    a = Adaptation("margin")
    assert a.after_oom(auto(8 * GiB), None, (8 * GiB, None, None)) == (
        "after an OOM kill: safety margin raised by 409.6 MiB (now +409.6 MiB)"
    )


def test_a_plan_that_would_fit_no_job_caps_the_step_too() -> None:
    """--on-oom margin with plan flags: a budget below the plan's baseline + one job (here 100 MiB)
    would be refused at the start (admit.py), so the step stops short of it."""
    a, under = Adaptation("margin"), (GiB, None, 3)
    fits = lambda budget: budget >= 100 * MiB  # noqa: E731
    budgets, said = [], []
    for _ in range(4):
        said.append(a.after_oom(auto(GiB, a.extra_margin), 3, under, workable=fits))
        budgets.append(budget_left(GiB, default_margin(GiB) + a.extra_margin))
    assert budgets == [512 * MiB, 256 * MiB, 128 * MiB, 128 * MiB]  # from 768 MiB: whole, whole, half, kept
    assert said[2].endswith("half of the 256 MiB budget left, since a step of 256 MiB would leave no budget that works")
    assert said[3] == (
        "after an OOM kill: the safety margin stays +640 MiB: a step of 256 MiB would leave no budget that works; "
        "the last workable budget 128 MiB is kept"
    )


@given(
    basis=st.integers(257 * MiB, 64 * GiB),
    reasons=st.lists(st.sampled_from(["oom-kill", "pressure-stop"]), max_size=40),
    floor_share=st.floats(0.0, 1.0),
)
def test_no_sequence_of_lessons_leaves_a_budget_that_cannot_work(
    basis: int, reasons: list[str], floor_share: float
) -> None:
    """Whatever the group and however many OOM kills and pressure stops: the budget the next start
    gets never falls below what works (above 0, and at least a plan's need when one is given), and
    never rises."""
    start = budget_left(basis, default_margin(basis))
    need = max(MiB, int(start * floor_share))  # the plan's baseline + one job, at most the first budget

    def fits(budget: int) -> bool:
        return budget >= need

    a = Adaptation("margin")
    before = start
    for reason in reasons:
        a.after_oom(auto(basis, a.extra_margin), None, (basis, None, None), reason, workable=fits)
        now = budget_left(basis, default_margin(basis) + a.extra_margin)
        assert need <= now <= before, (reason, now, before)
        before = now


# -- the whole supervisor over a fake tree --------------------------------------------------------

# The supervisor with --guard over the tree argv[1]; events to argv[2]; options as JSON in argv[3].
SUPERVISE = """
import json, sys
from oomguard.policy.plan import Shape
from oomguard.sources.cgroupfs import CgroupFS
from oomguard.sources.root import DirRoot
from oomguard.supervisor.config import GuardSettings
from oomguard.supervisor.events import EventLog
from oomguard.supervisor.restart import RestartPolicy
from oomguard.supervisor.supervise import RunConfig, Supervisor

tree, events, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
config = RunConfig(
    opts["command"], shape=Shape(**opts["shape"]) if opts.get("shape") else None,
    policy=RestartPolicy(backoff_initial=0.01, max_restarts=3), guard=GuardSettings(), stop_timeout=5.0,
)
sys.exit(Supervisor(config, EventLog(events), root=DirRoot(tree), cgroupfs=CgroupFS(tree)).run())
"""
# Its first start grows past the stop line (argv[3] bytes in memory.current) and waits for the
# guard's SIGTERM; then the kernel, played here, kills it in its shutdown: the memory uncharged,
# oom_kill + 1, SIGKILL. Later starts exit 0 at once.
KILLED_IN_ITS_STOP = """
import os, re, signal, sys
group, state, usage = sys.argv[1], sys.argv[2], sys.argv[3]
first = not os.path.exists(state)
open(state, 'w').write('started')
if not first:
    sys.exit(0)
def killed(*a):
    open(group + '/memory.current', 'w').write(str(1 << 20))
    text = open(group + '/memory.events').read()
    n = int(re.search(r'^oom_kill (\\d+)$', text, re.M).group(1))
    open(group + '/memory.events', 'w').write(re.sub(r'^oom_kill \\d+$', 'oom_kill %d' % (n + 1), text, flags=re.M))
    os.kill(os.getpid(), signal.SIGKILL)
signal.signal(signal.SIGTERM, killed)
open(group + '/memory.current', 'w').write(usage)
while True:
    signal.pause()
"""


def guarded(tree: Path, **opts: Any) -> tuple[int, list[dict[str, Any]]]:
    events, state = tree.parent / "events.jsonl", tree.parent / "state"
    command = [PY, "-c", KILLED_IN_ITS_STOP, str(tree / "sys/fs/cgroup"), str(state), str(970 * MiB)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([PY, "-c", SUPERVISE, str(tree), str(events), json.dumps({"command": command, **opts})],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, [json.loads(line) for line in events.read_text().splitlines()]


@pytest.mark.parametrize("shape", [None, {"per_job": 256 * MiB}])
def test_an_oom_kill_in_the_guard_s_stop_grows_the_grace_not_the_margin(
    tmp_path: Path, shape: dict[str, int] | None
) -> None:
    """1 GiB: auto budget 768 MiB, stop line 960 MiB. The first start is stopped at 970 MiB and killed
    in its shutdown: the next start keeps the budget (and the plan) and a learned grace instead."""
    tree = cgroup_tree(tmp_path / "tree", 2, GiB, extra={"sys/fs/cgroup/memory.stat": "inactive_file 0\n"})
    rc, ev = guarded(tree, shape=shape)
    assert rc == 0 and [e["event"] for e in ev] == ["start", "exit", "restart", "start", "exit"], ev
    first, restart, again = ev[1], ev[2], ev[4]
    assert (first["reason"], first["stop_finished"], first["stop_working_set_bytes"]) == ("oom-kill", False, 970 * MiB)
    assert first["grown_after_stop_bytes"] == 0  # the kernel, played here, killed it before it grew
    grace = 64 * MiB  # grace.py: a stop the kernel ended teaches at least double its growth and one guard margin
    assert restart["message"] == (
        "after an OOM kill in the worker's graceful stop (it grew 0 B after the guard's SIGTERM): the next stop "
        "keeps 64 MiB of grace (learned from the stops so far); the budget and the plan are kept"
    )
    assert [(e["budget_bytes"], e["concurrency"]) for e in (ev[0], ev[3])] == [
        (768 * MiB, 3 if shape else None),
    ] * 2  # the margin (and the plan) as before: no step-down
    assert (again["reason"], again["grace_source"], again["grace_bytes"]) == ("clean", "learned", grace), again


def test_oom_kills_in_a_512_mib_group_halve_the_budget_and_never_give_up(tmp_path: Path) -> None:
    """Without the guard, the issue's group: 256 MiB, then 128 MiB, then 64 MiB; never a budget of 0 (exit 3)."""
    tree = cgroup_tree(tmp_path / "tree", 2, 512 * MiB)
    rc, ev, err, _ = supervise_in_tree(tree, command=[PY, "-c", OOM_WORKER, str(tree / V2_EVENTS), "2"], max_restarts=5)
    assert rc == 0 and "give-up" not in [e["event"] for e in ev], err
    assert [e["budget_bytes"] for e in ev if e["event"] == "start"] == [256 * MiB, 128 * MiB, 64 * MiB]
    assert [e["message"] for e in ev if e["event"] == "restart"] == [
        "after an OOM kill: safety margin raised by 128 MiB (now +128 MiB): half of the 256 MiB budget left, since "
        "a step of 256 MiB would leave no budget that works",
        "after an OOM kill: safety margin raised by 64 MiB (now +192 MiB): half of the 128 MiB budget left, since "
        "a step of 256 MiB would leave no budget that works",
    ]
