"""The seed story with CuZK itself, at 1/64 scale, in a real memory cgroup: ``run --cuzk``.

The outage: a 503 GiB host, a 342 GiB container, CuZK's ``total_budget = "auto"`` reads MemTotal
(498 GiB after its 5 GiB margin) and fills it with partitions: the kernel OOM-kills it on every
large node. Here the host is this machine (MemTotal 23.5 GiB), the container a v1 (or, in the VM,
v2) group limited to 342 GiB / 64 = 5.34 GiB, and the prover the stand-in
``tests/fakes/cuzk/cuzk_daemon.py``, which reads its config and reserves memory as CuZK does
(the source lines are in its docstring), scaled by 64: SRS 704 MiB, PCE 416 MiB, 224 MiB a partition.

- CuZK's own "auto" is OOM-killed in the first batch;
- ``oomguard run --cuzk`` writes total_budget = the safe budget, and the same prover runs 20 of 20
  batches;
- partitions that really need 1.3x their estimate are OOM-killed, and each restart rewrites the
  config with one partition less (the step-down), until the run fits;
- the public daemon's command line takes no ``--budget``: it is dropped, with one line saying so.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tests.helpers.realcgroup import Group, limited_group, writable_parent

MiB = 1024 * 1024
GiB = 1024 * MiB
LIMIT = 342 * GiB // 64  # 5472 MiB
BUDGET = (LIMIT - LIMIT // 10) // MiB * MiB  # the auto budget: 10 % margin, whole MiB
SRS, PCE, PARTITION = 44 * GiB // 64, 26 * GiB // 64, 14 * GiB // 64
STANDIN = REPO / "tests" / "fakes" / "cuzk" / "cuzk_daemon.py"
TEMPLATE = """# the operator's CuZK config (cuzk.example.toml's [memory] at 1/64 scale)
[daemon]
listen = "127.0.0.1:9820"

[memory]
# "auto" = MemTotal - safety_margin
total_budget = "auto"
safety_margin = "80MiB"
eviction_min_idle = "5m"

[gpus]
devices = []
"""

VERSION, PARENT = writable_parent()
if VERSION is None:
    print(f"\nSKIP CuZK seed story: {PARENT}", file=sys.stderr)
pytestmark = [pytest.mark.skipif(VERSION is None, reason=f"real cgroups unavailable: {PARENT}"), pytest.mark.slow]


@pytest.fixture
def group() -> Iterator[Group]:
    with limited_group(LIMIT, no_swap=True) as g:
        yield g


@pytest.fixture
def daemon(tmp_path: Path) -> Path:
    """An executable named cuzk-daemon (its --help is what ``run --cuzk`` asks) and the template beside it."""
    exe = tmp_path / "cuzk-daemon"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    exe.chmod(0o755)
    (tmp_path / "cuzk.toml").write_text(TEMPLATE)
    return exe


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OOMGUARD_", "CUZK_"))}
    return env | {"PYTHONPATH": str(REPO / "src"), **extra}


def _totals(stdout: str) -> list[int]:
    return [int(x.split()[2]) for x in stdout.splitlines() if x.startswith("cuzk-standin: total_budget")]


def _events(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cuzk_auto_is_oom_killed_in_the_container(group: Group, daemon: Path) -> None:
    proc = group.run(str(daemon), "--config", str(daemon.parent / "cuzk.toml"), env=_env(CUZK_STANDIN_BATCHES="20"))
    [total] = _totals(proc.stdout)
    assert total > 4 * LIMIT  # MemTotal - 80 MiB: the host's RAM, not the group's
    assert proc.returncode == -9, (proc.returncode, proc.stderr)  # SIGKILL: exit 137
    assert "batch 1 of 20 done" not in proc.stdout
    assert group.oom_kills() >= 1


def test_run_cuzk_runs_20_of_20_batches(group: Group, daemon: Path, tmp_path: Path) -> None:
    events, out = tmp_path / "events.jsonl", tmp_path / "written.toml"
    proc = group.run(
        sys.executable, "-m", "oomguard", "run", "--restart", "never", "--events", str(events),
        "--cuzk", str(tmp_path / "cuzk.toml"), "--cuzk-out", str(out), "--", str(daemon),
        env=_env(CUZK_STANDIN_BATCHES="20"), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _totals(proc.stdout) == [BUDGET]  # CuZK read exactly oomguard's budget
    assert "batch 20 of 20 done" in proc.stdout and "done" in proc.stdout.splitlines()
    assert group.oom_kills() == 0
    end = _events(events)[-1]
    assert (end["event"], end["reason"], end["budget_bytes"]) == ("exit", "clean", BUDGET)
    written = out.read_text()
    assert f'total_budget = "{BUDGET}"' in written
    # the operator's other settings and comments, as written
    assert 'safety_margin = "80MiB"' in written and '# "auto" = MemTotal - safety_margin' in written
    assert (tmp_path / "cuzk.toml").read_text() == TEMPLATE  # the template is never written
    assert f"--cuzk: total_budget = {BUDGET}" in proc.stderr


def test_a_step_down_rewrites_the_config_before_each_restart(group: Group, daemon: Path, tmp_path: Path) -> None:
    """Partitions that use 1.3x CuZK's estimate: OOM-killed at 16 and 15, run at 14. Each start's config
    says the budget less one partition per step down, and CuZK plans its partitions from it."""
    profiles = tmp_path / "profiles.json"
    shape = {"per_job": PARTITION, "baseline": SRS + PCE, "max_jobs": 18}
    profiles.write_text(json.dumps({"cuzk-64": shape}))
    events = tmp_path / "events.jsonl"
    proc = group.run(
        sys.executable, "-m", "oomguard", "run", "--profiles", str(profiles), "--profile", "cuzk-64",
        "--backoff-initial", "0.1s", "--max-restarts", "4", "--events", str(events),
        "--cuzk", str(tmp_path / "cuzk.toml"), "--", str(daemon),
        env=_env(CUZK_STANDIN_FACTOR="1.3"), timeout=600,
    )  # fmt: skip
    starts = [e for e in _events(events) if e["event"] == "start"]
    planned = (BUDGET - SRS - PCE) // PARTITION  # 16
    assert proc.returncode == 0, proc.stderr
    # what each start wrote, and what CuZK read from it: the budget less one partition a step
    want = [BUDGET - k * PARTITION for k in range(len(starts))]
    assert _totals(proc.stdout) == want
    assert [s["concurrency"] for s in starts] == [planned - k for k in range(len(starts))]
    assert len(starts) >= 2  # at least one OOM kill stepped it down
    ends = [e for e in _events(events) if e["event"] == "exit"]
    assert [e["reason"] for e in ends] == ["oom-kill"] * (len(ends) - 1) + ["clean"]
    written = (tmp_path / "cuzk.oomguard.toml").read_text()
    assert f'total_budget = "{want[-1]}"' in written


def test_the_public_daemon_refuses_budget_and_run_drops_it(group: Group, daemon: Path, tmp_path: Path) -> None:
    refused = group.run(str(daemon), "--budget", "1000", env=_env())
    assert refused.returncode == 2 and "unexpected argument '--budget'" in refused.stderr
    proc = group.run(
        sys.executable, "-m", "oomguard", "run", "--restart", "never", "--cuzk", str(tmp_path / "cuzk.toml"),
        "--", str(daemon), "--budget", "{total_budget_bytes}", env=_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _totals(proc.stdout) == [BUDGET]
    said = [x for x in proc.stderr.splitlines() if "has no --budget flag" in x]
    assert len(said) == 1 and "its --help does not list it" in said[0], proc.stderr
