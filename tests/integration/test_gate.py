"""The gate refuses an explicit budget above the hard ceiling (the seed's outage: 503 GiB budgeted in
a 342 GiB container), in `check --require`, `plan --require-jobs` and `run`, unless the operator
says it is meant (`--allow-over-limit`, `OOMGUARD_ALLOW_OVER_LIMIT=1`). Without a gate flag it
stays a warning (`budget-exceeds-limit`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers.trees import make_tree

GiB = 1024**3
PY = sys.executable
CEILING = "the hard ceiling 2 GiB (cgroup-v2, /sys/fs/cgroup/memory.max)"
OVERRIDE = "--allow-over-limit (or OOMGUARD_ALLOW_OVER_LIMIT=1) if it is meant"


def oomguard(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")}
    full = {**base, "PYTHONPATH": str(REPO / "src"), **env}
    return subprocess.run([PY, "-m", "oomguard", *args], capture_output=True, text=True, env=full, timeout=60)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A container limited to 2 GiB whose environment sets OOMGUARD_BUDGET=20GiB (the outage)."""
    return make_tree(tmp_path, limit=str(2 * GiB), env="OOMGUARD_BUDGET=20GiB\0")


def test_check_require_refuses_the_outage_budget_from_the_environment(node: Path) -> None:
    proc = oomguard("check", "--root", str(node), "--require", "1B")
    assert proc.returncode == 3
    assert proc.stderr == (
        "oomguard: error: --require: the env budget 20 GiB, from OOMGUARD_BUDGET=20GiB, "
        f"is above {CEILING}: the kernel OOM-kills a worker that uses it at the ceiling; {OVERRIDE}\n"
    )
    # without --require, check reports and warns, and exits 0
    proc = oomguard("check", "--json", "--root", str(node))
    assert proc.returncode == 0
    assert "budget-exceeds-limit" in {w["code"] for w in json.loads(proc.stdout)["warnings"]}


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--allow-over-limit"], {}),
        ([], {"OOMGUARD_ALLOW_OVER_LIMIT": "1"}),
        ([], {"OOMGUARD_ALLOW_OVER_LIMIT": "yes"}),
    ],
)
def test_the_operator_can_say_it_is_meant(node: Path, args: list[str], env: dict[str, str]) -> None:
    proc = oomguard("check", "--root", str(node), "--require", "1B", *args, **env)
    assert proc.returncode == 0, proc.stderr
    assert "budget-exceeds-limit" in proc.stdout  # still said
    plan = oomguard("plan", "--root", str(node), "--per-job", "1GiB", "--require-jobs", "1", *args, **env)
    assert plan.returncode == 0, plan.stderr


def test_a_bad_override_value_is_one_line(node: Path) -> None:
    proc = oomguard("check", "--root", str(node), "--require", "1B", OOMGUARD_ALLOW_OVER_LIMIT="maybe")
    assert proc.returncode == 2
    assert proc.stderr == (
        "oomguard: error: OOMGUARD_ALLOW_OVER_LIMIT: expected 1 or 0 (yes/no, true/false, on/off), got 'maybe'\n"
    )
    assert oomguard("check", "--root", str(node), "--require", "1B", OOMGUARD_ALLOW_OVER_LIMIT="0").returncode == 3


def test_the_flag_budget_at_the_ceiling_passes_one_byte_above_fails(tmp_path: Path) -> None:
    tree = make_tree(tmp_path, limit=str(2 * GiB))
    at = oomguard("check", "--root", str(tree), "--require", "1B", "--budget", str(2 * GiB))
    assert at.returncode == 0, at.stderr
    above = oomguard("check", "--root", str(tree), "--require", "1B", "--budget", str(2 * GiB + 1))
    assert above.returncode == 3
    assert above.stderr.startswith(
        "oomguard: error: --require: the explicit budget 2 GiB (2147483649 bytes), "
        f"from --budget {2 * GiB + 1}, is above {CEILING}"
    ), above.stderr
    # 100% of the basis is the ceiling itself: never above it
    assert oomguard("check", "--root", str(tree), "--require", "1B", "--budget", "100%").returncode == 0


def test_plan_require_jobs_refuses_it_and_plain_plan_warns(node: Path) -> None:
    proc = oomguard("plan", "--root", str(node), "--per-job", "1GiB", "--require-jobs", "1")
    assert proc.returncode == 3
    assert proc.stderr.startswith(
        f"oomguard: error: --require-jobs: the env budget 20 GiB, from OOMGUARD_BUDGET=20GiB, is above {CEILING}"
    )
    assert proc.stdout.startswith("oomguard plan: 20 jobs")  # the plan is still shown, as the operator asked
    plain = oomguard("plan", "--root", str(node), "--per-job", "1GiB")
    assert plain.returncode == 0 and "budget-exceeds-limit" in plain.stdout


def test_an_auto_budget_never_trips_it(tmp_path: Path) -> None:
    proc = oomguard("check", "--root", str(make_tree(tmp_path, limit=str(2 * GiB))), "--require", "1B")
    assert proc.returncode == 0, proc.stderr


def test_run_starts_nothing_with_it_in_a_real_group(tmp_path: Path) -> None:
    from tests.helpers.realcgroup import limited_group

    marker, events = tmp_path / "started", tmp_path / "ev.jsonl"
    with limited_group(2 * GiB) as g:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")}
        env.update(PYTHONPATH=str(REPO / "src"), OOMGUARD_BUDGET="20GiB")
        run = [PY, "-m", "oomguard", "run", "--events", str(events), "--restart", "never"]
        proc = g.run(*run, "--", "touch", str(marker), env=env)
        assert proc.returncode == 3 and not marker.exists(), proc.stderr
        give_up = [json.loads(line) for line in events.read_text().splitlines()]
        assert [e["event"] for e in give_up] == ["give-up"]
        assert give_up[0]["message"].startswith("the env budget 20 GiB, from OOMGUARD_BUDGET=20GiB, is above ")
        assert give_up[0]["message"].endswith("if it is meant; not starting the worker")
        proc = g.run(*run, "--allow-over-limit", "--", "touch", str(marker), env=env)
        assert proc.returncode == 0 and marker.exists(), proc.stderr
        start = json.loads(events.read_text().splitlines()[1])
        assert start["event"] == "start" and start["warnings"] == ["budget-exceeds-limit"]
