"""deploy/worker/entrypoint.sh's gate: `check --require`, `plan --require-jobs` and (optionally)
`verify` before `run`, as the seed's fleet ran a benchmark before a node took work.

With a stub `oomguard` on PATH that records every call (and fails where told), then with the real
oomguard in a real memory cgroup, where the gate refuses a group too small for any budget.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from oomguard.cli import parse
from oomguard.commands.run import worker_argv
from tests.conftest import REPO
from tests.realcgroup import Group, limited_group, writable_parent

ENTRYPOINT = REPO / "deploy" / "worker" / "entrypoint.sh"
URL = "http://oomguard-manager.example:8080"
WORKER = ["my-worker", "--budget", "{budget}"]
MiB = 1024**2

# Appends "CMD ARG..." (one call per line, arguments joined by a unit separator) to $STUB_DIR/calls,
# then exits with $STUB_EXIT_<CMD> (0 when unset); the agent waits for TERM.
STUB = """#!/bin/sh
cmd=$1
( IFS=$(printf '\\037'); printf '%s\\n' "$*" ) >> "$STUB_DIR/calls"
if [ "$cmd" = agent ]; then
    trap 'exit 0' TERM
    while :; do sleep 0.02; done
fi
if [ "$cmd" = run ] && [ "${OOMGUARD_AGENT:-on}" != off ]; then  # let the agent say it started
    i=0; while ! grep -q '^agent' "$STUB_DIR/calls" && [ $i -lt 250 ]; do sleep 0.02; i=$((i+1)); done
fi
eval "code=\\${STUB_EXIT_$cmd:-0}"
exit "$code"
"""


def _stub(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "oomguard").write_text(STUB)
    (bin_dir / "oomguard").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_DIR": str(tmp_path), "HOME": str(tmp_path)}


def _entrypoint(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    full = {**_stub(tmp_path), "OOMGUARD_MANAGER": URL, "OOMGUARD_AGENT": "off", **env}
    proc = subprocess.run([str(ENTRYPOINT), *WORKER], env=full, capture_output=True, text=True, timeout=30)
    calls = tmp_path / "calls"
    lines = calls.read_text().splitlines() if calls.exists() else []
    return proc, [line.split("\x1f") for line in lines]


def test_the_default_gate_is_check_require_then_run(tmp_path: Path) -> None:
    proc, calls = _entrypoint(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert calls == [["check", "--require", "1B"], ["run", "--manager", URL, "--", *WORKER]]
    assert parse(calls[0]).require == "1B"  # a real flag of the real command


def test_plan_and_verify_run_with_the_shape_and_run_gets_it_too(tmp_path: Path) -> None:
    env = {
        "OOMGUARD_PLAN_ARGS": "--profile porep-c2-32g --margin 5%",
        "OOMGUARD_REQUIRE_JOBS": "2",
        "OOMGUARD_REQUIRE": "100GiB",
        "OOMGUARD_CHECK_ARGS": "--margin 5%",
        "OOMGUARD_VERIFY": "on",
        "OOMGUARD_VERIFY_ARGS": "--fraction 0.5",
        "OOMGUARD_RUN_ARGS": "--max-restarts 10",
    }
    proc, calls = _entrypoint(tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    shape = ["--profile", "porep-c2-32g", "--margin", "5%"]
    assert calls == [
        ["check", "--require", "100GiB", "--margin", "5%"],
        ["plan", "--require-jobs", "2", *shape],
        ["verify", *shape, "--fraction", "0.5"],
        ["run", "--manager", URL, "--max-restarts", "10", *shape, "--", *WORKER],
    ]
    for call in calls:  # every call parses with oomguard's own parser
        args = parse(call)
        if call[0] in ("plan", "verify", "run"):
            assert args.profile == "porep-c2-32g" and args.margin == "5%"
    assert worker_argv(parse(calls[-1])) == WORKER


@pytest.mark.parametrize(
    ("failing", "code", "env", "before"),
    [
        ("check", 3, {}, [["check", "--require", "1B"]]),
        (
            "plan",
            3,
            {"OOMGUARD_PLAN_ARGS": "--per-job 14GiB"},
            [["check", "--require", "1B"], ["plan", "--require-jobs", "1", "--per-job", "14GiB"]],
        ),
        ("verify", 4, {"OOMGUARD_VERIFY": "on"}, [["check", "--require", "1B"], ["verify"]]),
        ("check", 2, {"OOMGUARD_AGENT": "on"}, [["check", "--require", "1B"]]),  # no agent started either
    ],
)
def test_a_failed_gate_starts_nothing(
    tmp_path: Path, failing: str, code: int, env: dict[str, str], before: list[list[str]]
) -> None:
    proc, calls = _entrypoint(tmp_path, **env, **{f"STUB_EXIT_{failing}": str(code)})
    assert proc.returncode == code
    assert calls == before  # neither the agent nor run was started
    assert proc.stderr == (
        f"oomguard-entrypoint: gate: oomguard {failing} failed (exit {code}); not starting the worker "
        "(OOMGUARD_GATE=off skips the gate)\n"
    )


def test_the_gate_can_be_switched_off(tmp_path: Path) -> None:
    proc, calls = _entrypoint(tmp_path, OOMGUARD_GATE="off", STUB_EXIT_check="3", OOMGUARD_PLAN_ARGS="--per-job 1G")
    assert proc.returncode == 0
    assert calls == [["run", "--manager", URL, "--per-job", "1G", "--", *WORKER]]


def test_with_the_agent_the_gate_comes_first(tmp_path: Path) -> None:
    proc, calls = _entrypoint(tmp_path, OOMGUARD_AGENT="on")
    assert proc.returncode == 0, proc.stderr
    assert calls[0] == ["check", "--require", "1B"]
    assert sorted(c[0] for c in calls[1:]) == ["agent", "run"]


# -- the real oomguard in a real memory cgroup ------------------------------------------------

VERSION, PARENT = writable_parent()


@pytest.fixture
def group() -> Iterator[Group]:
    with limited_group() as g:
        yield g


def _real_oomguard(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "real"
    bin_dir.mkdir()
    (bin_dir / "oomguard").write_text(f'#!/bin/sh\nexec {sys.executable} -m oomguard "$@"\n')
    (bin_dir / "oomguard").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")}
    return {**env, "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(REPO / "src"), "OOMGUARD_MANAGER": URL}


def test_the_real_gate_refuses_a_group_too_small_for_any_budget(group: Group, tmp_path: Path) -> None:
    group.set_limit(256 * MiB)  # the auto budget's 256 MiB margin floor takes it all: budget 0
    marker = tmp_path / "started"
    proc = group.run(str(ENTRYPOINT), "touch", str(marker), env=_real_oomguard(tmp_path))
    assert proc.returncode == 3, proc.stderr
    assert not marker.exists()
    assert "budget-too-small" in proc.stdout  # check's report, in the container's log
    assert proc.stderr.splitlines() == [
        "oomguard: error: --require: budget 0 B is below the required 1 B",
        "oomguard-entrypoint: gate: oomguard check failed (exit 3); not starting the worker "
        "(OOMGUARD_GATE=off skips the gate)",
    ]


def test_the_real_gate_refuses_a_plan_that_fits_no_job(group: Group, tmp_path: Path) -> None:
    group.set_limit(1024 * MiB)  # budget 768 MiB: a 1 GiB job does not fit
    env = {**_real_oomguard(tmp_path), "OOMGUARD_PLAN_ARGS": "--per-job 1GiB"}
    proc = group.run(str(ENTRYPOINT), "true", env=env)
    assert proc.returncode == 3, proc.stderr
    assert "oomguard plan: 0 jobs, memory binds" in proc.stdout
    assert "gate: oomguard plan failed (exit 3)" in proc.stderr


def test_the_real_gate_refuses_an_explicit_budget_above_the_ceiling(group: Group, tmp_path: Path) -> None:
    """The seed's outage at 1/10 scale: OOMGUARD_BUDGET=20GiB in a 2 GiB group passes no step."""
    group.set_limit(2048 * MiB)
    marker = tmp_path / "started"
    env = {**_real_oomguard(tmp_path), "OOMGUARD_BUDGET": "20GiB", "OOMGUARD_PLAN_ARGS": "--per-job 256MiB"}
    proc = group.run(str(ENTRYPOINT), "touch", str(marker), env=env)
    assert proc.returncode == 3, proc.stderr
    assert not marker.exists()
    first = proc.stderr.splitlines()[0]
    assert first.startswith("oomguard: error: --require: the env budget 20 GiB, from OOMGUARD_BUDGET=20GiB, is above ")
    assert f"the hard ceiling 2 GiB (cgroup-v{group.version}, {group.dir}/memory." in first
    assert "gate: oomguard check failed (exit 3)" in proc.stderr
    # meant (swap-backed, overcommitted on purpose): check and plan pass; run would start the worker
    env["OOMGUARD_ALLOW_OVER_LIMIT"] = "1"
    env["OOMGUARD_GATE"] = "on"
    steps = [["check", "--require", "1B"], ["plan", "--require-jobs", "1", "--per-job", "256MiB"]]
    for step in steps:
        ok = group.run(sys.executable, "-m", "oomguard", *step, env=env)
        assert ok.returncode == 0, ok.stderr
        assert "budget-exceeds-limit" in ok.stdout
