"""deploy/worker/entrypoint.sh's gate: `check --require`, `plan --require-jobs` and (optionally)
`verify` before `run`, as the seed's fleet ran a benchmark before a node took work; and how it
tells the manager (issue 21): a refused node's one-shot report and gate event, a passed gate's
event with the agent's first report, the plan flags given to the agent.

With a stub `oomguard` on PATH that records every call (and fails where told), then with the real
oomguard in a real memory cgroup, where the gate refuses a group too small for any budget, in
front of a small HTTP server that records what it is sent and of the real manager.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oomguard.cli import parse
from oomguard.commands.run import worker_argv
from tests.conftest import REPO
from tests.helpers.agent_fake import FakeManager, drop_proxy_variables, running_manager, unused_port_url
from tests.helpers.realcgroup import Group, limited_group, writable_parent

ENTRYPOINT = REPO / "deploy" / "worker" / "entrypoint.sh"
URL = "http://oomguard-manager.example:8080"
WORKER = ["my-worker", "--budget", "{budget}"]
MiB = 1024**2
LAST = "not starting the worker (OOMGUARD_GATE=off skips the gate)"

# Appends "CMD ARG..." (one call per line, arguments joined by a unit separator) to $STUB_DIR/calls,
# writes $STUB_ERR_<CMD> to stderr, then exits with $STUB_EXIT_<CMD> (0 when unset); `agent --once`
# exits with $STUB_EXIT_once, the agent without it waits for TERM.
STUB = """#!/bin/sh
cmd=$1
( IFS=$(printf '\\037'); printf '%s\\n' "$*" ) >> "$STUB_DIR/calls"
eval "err=\\${STUB_ERR_$cmd:-}"
[ -z "$err" ] || printf '%s\\n' "$err" >&2
if [ "$cmd" = agent ]; then
    case " $* " in *" --once "*) exit "${STUB_EXIT_once:-0}" ;; esac
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


def _once(*gate: str, plan: tuple[str, ...] = ()) -> list[str]:
    """The one-shot agent's call: the plan flags, then the bound and the gate flags."""
    return ["agent", "--manager", URL, *plan, "--once", "--max-time", "10s", "--gate", *gate]


def _passed(step: str, message: str, plan: tuple[str, ...] = ()) -> list[str]:
    return _once(step, "--gate-exit", "0", "--gate-message", f"passed: {message}", plan=plan)


def test_the_default_gate_is_check_require_then_run(tmp_path: Path) -> None:
    proc, calls = _entrypoint(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert calls == [
        ["check", "--require", "1B"],
        _passed("check", "check --require 1B"),  # no agent to send it with its first report: a one-shot one
        ["run", "--manager", URL, "--", *WORKER],
    ]
    assert parse(calls[0]).require == "1B"  # a real flag of the real command
    agent = parse(calls[1])
    assert (agent.once, agent.max_time, agent.gate, agent.gate_exit) == (True, "10s", "check", "0")


def test_cuzk_config_goes_to_run(tmp_path: Path) -> None:
    """OOMGUARD_CUZK_CONFIG: `run --cuzk FILE` (and --cuzk-out), parsed by the real parser; not before."""
    env = {"OOMGUARD_CUZK_CONFIG": "/data/zk/cuzk.toml", "OOMGUARD_CUZK_OUT": "/run/cuzk/cuzk.toml"}
    proc, calls = _entrypoint(tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    cuzk = ["--cuzk", "/data/zk/cuzk.toml", "--cuzk-out", "/run/cuzk/cuzk.toml"]
    assert calls[-1] == ["run", "--manager", URL, *cuzk, "--", *WORKER]
    args = parse(calls[-1])
    assert (args.cuzk, args.cuzk_out, worker_argv(args)) == ("/data/zk/cuzk.toml", "/run/cuzk/cuzk.toml", WORKER)
    (tmp_path / "default").mkdir()
    proc, calls = _entrypoint(tmp_path / "default", OOMGUARD_CUZK_CONFIG="/data/zk/cuzk.toml")
    assert calls[-1] == ["run", "--manager", URL, "--cuzk", "/data/zk/cuzk.toml", "--", *WORKER]


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
    shape = ("--profile", "porep-c2-32g", "--margin", "5%")
    assert calls == [
        ["check", "--require", "100GiB", "--margin", "5%"],
        ["plan", "--require-jobs", "2", *shape],
        ["verify", *shape, "--fraction", "0.5"],
        _passed("verify", "check --require 100GiB, plan --require-jobs 2, verify", plan=shape),
        ["run", "--manager", URL, "--max-restarts", "10", *shape, "--", *WORKER],
    ]
    for call in calls:  # every call parses with oomguard's own parser
        args = parse(call)
        if call[0] in ("plan", "verify", "run", "agent"):
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
        ("check", 2, {"OOMGUARD_AGENT": "on"}, [["check", "--require", "1B"]]),  # no agent loop started either
    ],
)
def test_a_failed_gate_is_reported_and_starts_nothing(
    tmp_path: Path, failing: str, code: int, env: dict[str, str], before: list[list[str]]
) -> None:
    said = f"oomguard: error: the {failing} step's own words"
    proc, calls = _entrypoint(tmp_path, **env, **{f"STUB_EXIT_{failing}": str(code), f"STUB_ERR_{failing}": said})
    assert proc.returncode == code
    plan = tuple(env.get("OOMGUARD_PLAN_ARGS", "").split())
    # the one-shot report and gate event, then nothing: neither the agent's loop nor run
    assert calls == [*before, _once(failing, "--gate-exit", str(code), "--gate-message", said, plan=plan)]
    assert proc.stderr == (
        f"{said}\noomguard-entrypoint: gate: oomguard {failing} failed (exit {code}), reported to the manager; {LAST}\n"
    )


@pytest.mark.parametrize(
    ("once", "said"),
    [("75", "the report waits in the spool"), ("65", "not reported (oomguard agent exit 65)")],
)
def test_the_last_line_says_what_became_of_the_report(tmp_path: Path, once: str, said: str) -> None:
    proc, _ = _entrypoint(tmp_path, STUB_EXIT_check="3", STUB_EXIT_once=once)
    assert proc.returncode == 3  # the step's status, whatever became of the report
    assert proc.stderr == f"oomguard-entrypoint: gate: oomguard check failed (exit 3), {said}; {LAST}\n"


def test_plan_flags_the_agent_refuses_are_left_out_of_a_second_try(tmp_path: Path) -> None:
    """A bad flag in OOMGUARD_PLAN_ARGS fails the plan step (2) and the agent given it (2): the node
    is still reported, without the plan."""
    proc, calls = _entrypoint(tmp_path, OOMGUARD_PLAN_ARGS="--per-job lots", STUB_EXIT_plan="2", STUB_EXIT_once="2")
    assert proc.returncode == 2
    gate = ("plan", "--gate-exit", "2", "--gate-message", "")
    assert calls[2:] == [_once(*gate, plan=("--per-job", "lots")), _once(*gate)]


def test_the_gate_can_be_switched_off(tmp_path: Path) -> None:
    proc, calls = _entrypoint(tmp_path, OOMGUARD_GATE="off", STUB_EXIT_check="3", OOMGUARD_PLAN_ARGS="--per-job 1G")
    assert proc.returncode == 0
    assert calls == [["run", "--manager", URL, "--per-job", "1G", "--", *WORKER]]  # and no gate event


def test_with_the_agent_the_gate_comes_first_and_its_first_report_says_passed(tmp_path: Path) -> None:
    env = {"OOMGUARD_AGENT": "on", "OOMGUARD_PLAN_ARGS": "--per-job 1G", "OOMGUARD_AGENT_ARGS": "--interval 1m"}
    proc, calls = _entrypoint(tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    assert calls[:2] == [["check", "--require", "1B"], ["plan", "--require-jobs", "1", "--per-job", "1G"]]
    by_command = {c[0]: c for c in calls[2:]}
    assert sorted(by_command) == ["agent", "run"]
    assert by_command["agent"] == [
        *("agent", "--manager", URL, "--interval", "1m", "--per-job", "1G"),  # the plan: its reports carry it
        *("--gate", "plan", "--gate-exit", "0", "--gate-message", "passed: check --require 1B, plan --require-jobs 1"),
    ]
    agent = parse(by_command["agent"])
    assert agent.per_job == "1G" and not agent.once and agent.gate == "plan"


def test_with_the_gate_off_the_agent_sends_no_gate_event(tmp_path: Path) -> None:
    proc, calls = _entrypoint(tmp_path, OOMGUARD_AGENT="on", OOMGUARD_GATE="off")
    assert proc.returncode == 0, proc.stderr
    assert sorted(calls) == [["agent", "--manager", URL], ["run", "--manager", URL, "--", *WORKER]]


# -- the real oomguard in a real memory cgroup ------------------------------------------------

VERSION, PARENT = writable_parent()


@pytest.fixture
def group() -> Iterator[Group]:
    with limited_group() as g:
        yield g


def _real_oomguard(tmp_path: Path, manager: str = URL, **extra: str) -> dict[str, str]:
    """The environment of a container running the real oomguard: nothing of the caller's that
    oomguard reads (OOMGUARD_*, the label variables, proxies), its own spool and home."""
    from oomguard.agent.labels import ENV_LABELS

    bin_dir = tmp_path / "real"
    bin_dir.mkdir()
    (bin_dir / "oomguard").write_text(f'#!/bin/sh\nexec {sys.executable} -m oomguard "$@"\n')
    (bin_dir / "oomguard").chmod(0o755)
    drop = {*ENV_LABELS, *drop_proxy_variables(dict(os.environ))}
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_") and k not in drop}
    return {
        **env,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PYTHONPATH": str(REPO / "src"),
        "HOME": str(tmp_path),
        "OOMGUARD_SPOOL": str(tmp_path / "spool"),
        "OOMGUARD_MANAGER": manager,
        **extra,
    }


def _spooled(tmp_path: Path, where: str = "") -> list[dict[str, Any]]:
    import json

    folder = tmp_path / "spool" / where
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


REFUSED_CHECK = {
    "event": "gate",
    "step": "check",
    "passed": False,
    "exit_code": 3,
    "message": "--require: budget 0 B is below the required 1 B",
}


def test_the_real_gate_refuses_a_group_too_small_for_any_budget(group: Group, tmp_path: Path) -> None:
    group.set_limit(256 * MiB)  # the auto budget's 256 MiB margin floor takes it all: budget 0
    marker = tmp_path / "started"
    proc = group.run(str(ENTRYPOINT), "touch", str(marker), env=_real_oomguard(tmp_path))
    assert proc.returncode == 3, proc.stderr
    assert not marker.exists()
    assert "budget-too-small" in proc.stdout  # check's report, in the container's log
    lines = proc.stderr.splitlines()
    assert lines[0] == "oomguard: error: --require: budget 0 B is below the required 1 B"
    assert (
        lines[-1] == f"oomguard-entrypoint: gate: oomguard check failed (exit 3), the report waits in the spool; {LAST}"
    )
    # no manager to be reached: the report and the gate event wait in the spool, in that order
    report, event = _spooled(tmp_path)
    assert "budget-too-small" in {w["code"] for w in report["report"]["warnings"]}
    assert event["node"] == report["node"] and {**event["event"], "time": None} == {**REFUSED_CHECK, "time": None}


def test_the_real_gate_refuses_a_plan_that_fits_no_job(group: Group, tmp_path: Path) -> None:
    group.set_limit(1024 * MiB)  # budget 768 MiB: a 1 GiB job does not fit
    env = _real_oomguard(tmp_path, OOMGUARD_PLAN_ARGS="--per-job 1GiB")
    proc = group.run(str(ENTRYPOINT), "true", env=env)
    assert proc.returncode == 3, proc.stderr
    assert "oomguard plan: 0 jobs, memory binds" in proc.stdout
    assert "gate: oomguard plan failed (exit 3), the report waits in the spool;" in proc.stderr
    report, event = _spooled(tmp_path)
    assert report["report"]["plan"]["concurrency"] == 0  # the one-shot report carries the plan
    assert event["event"]["message"] == "--require-jobs: 0 jobs fit, 1 required (budget 768 MiB / 1 GiB per job)"


# -- in front of a small HTTP server that records what it is sent --------------------------------

LABELS_ENV = {
    "OOMGUARD_NODE": "gpu-07",
    "OOMGUARD_LABELS": "zone=eu-1,rack=r7",
    "CONTAINER_ID": "12345",  # vast.ai's
    "VAST_CONTAINERLABEL": "C.12345",
    "K8S_NODE_NAME": "k8s-node-3",  # deploy/k8s/worker.yaml's, from spec.nodeName
}
LABELS = {
    "zone": "eu-1",
    "rack": "r7",
    "container_id": "12345",
    "vast_containerlabel": "C.12345",
    "k8s_node_name": "k8s-node-3",
}


@pytest.fixture
def recorder() -> Iterator[FakeManager]:
    yield from running_manager()


def _bodies(server: FakeManager) -> list[dict[str, Any]]:
    """What *server* stored, in order: each id once (the agent and run share the spool, so both
    may send one item; the manager stores it once)."""
    return [server.stored[i] for i in server.order]


def test_a_refused_node_sends_its_report_and_gate_event(group: Group, recorder: FakeManager, tmp_path: Path) -> None:
    group.set_limit(256 * MiB)
    env = _real_oomguard(tmp_path, recorder.url, OOMGUARD_PLAN_ARGS="--per-job 64MiB", **LABELS_ENV)
    proc = group.run(str(ENTRYPOINT), "true", env=env)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"oomguard-entrypoint: gate: oomguard check failed (exit 3), reported to the manager; {LAST}"
    )
    report, event = _bodies(recorder)
    assert [r["path"] for r in recorder.requests] == ["/api/v1/reports", "/api/v1/events"]
    assert report["node"] == event["node"] == "gpu-07"
    assert report["labels"] == event["labels"] == LABELS
    assert report["report"]["budget"]["bytes"] == 0
    assert report["report"]["plan"]["concurrency"] == 0  # the plan, from OOMGUARD_PLAN_ARGS
    assert set(event) == {"node", "id", "event", "labels"}
    assert event["event"]["time"].endswith("Z")
    assert {**event["event"], "time": None} == {**REFUSED_CHECK, "time": None}
    assert _spooled(tmp_path) == []


def test_a_refused_plan_sends_the_plan_steps_numbers(group: Group, recorder: FakeManager, tmp_path: Path) -> None:
    group.set_limit(1024 * MiB)
    env = _real_oomguard(tmp_path, recorder.url, OOMGUARD_PLAN_ARGS="--per-job 1GiB")
    proc = group.run(str(ENTRYPOINT), "true", env=env)
    assert proc.returncode == 3, proc.stderr
    report, event = _bodies(recorder)
    assert "labels" not in report and "labels" not in event  # none set: none sent
    assert event["event"]["step"] == "plan" and event["event"]["exit_code"] == 3
    assert event["event"]["message"] == "--require-jobs: 0 jobs fit, 1 required (budget 768 MiB / 1 GiB per job)"
    assert report["report"]["plan"]["concurrency"] == 0


def test_a_passed_gate_without_the_agent_is_sent_once_before_run(
    group: Group, recorder: FakeManager, tmp_path: Path
) -> None:
    group.set_limit(1024 * MiB)
    env = _real_oomguard(
        tmp_path, recorder.url, OOMGUARD_AGENT="off", OOMGUARD_PLAN_ARGS="--per-job 64MiB", **LABELS_ENV
    )
    proc = group.run(str(ENTRYPOINT), "true", env=env)
    assert proc.returncode == 0, proc.stderr
    bodies = _bodies(recorder)
    assert "report" in bodies[0] and bodies[0]["report"]["plan"]["concurrency"] > 0
    assert {**bodies[1]["event"], "time": None} == {
        "event": "gate",
        "time": None,
        "step": "plan",
        "passed": True,
        "exit_code": 0,
        "message": "passed: check --require 1B, plan --require-jobs 1",
    }
    assert [b["event"]["event"] for b in bodies[2:]][:1] == ["start"]  # then run's events
    assert all(b["labels"] == LABELS and b["node"] == "gpu-07" for b in bodies)


class _SaysWhenGated(FakeManager):
    """Touches *flag* once it has stored a gate event."""

    def __init__(self, flag: Path) -> None:
        super().__init__()
        self.flag = flag

    def _answer_for(self, body: dict[str, Any]) -> tuple[int, bool]:
        answer = super()._answer_for(body)
        if body.get("event", {}).get("event") == "gate":
            self.flag.touch()
        return answer


def test_a_passed_gate_follows_the_agents_first_report(group: Group, tmp_path: Path) -> None:
    flag = tmp_path / "gated"
    server = _SaysWhenGated(flag)
    server.start()
    try:
        group.set_limit(1024 * MiB)
        env = _real_oomguard(tmp_path, server.url, OOMGUARD_PLAN_ARGS="--per-job 64MiB")
        wait = f'i=0; while [ ! -e "{flag}" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done'
        proc = group.run(str(ENTRYPOINT), "sh", "-c", wait, env=env)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    assert flag.exists(), proc.stderr
    reports = [b for b in _bodies(server) if "report" in b]
    gates = [b["event"] for b in _bodies(server) if b.get("event", {}).get("event") == "gate"]
    assert reports[0]["report"]["plan"]["concurrency"] > 0  # the agent has the plan flags now
    assert [(g["step"], g["passed"]) for g in gates] == [("plan", True)]
    first_report = next(i for i, b in enumerate(_bodies(server)) if "report" in b)
    first_gate = next(i for i, b in enumerate(_bodies(server)) if b.get("event", {}).get("event") == "gate")
    assert first_report < first_gate


def test_a_refused_gate_with_the_manager_down_exits_at_once(group: Group, tmp_path: Path) -> None:
    group.set_limit(256 * MiB)
    proc = group.run(str(ENTRYPOINT), "true", env=_real_oomguard(tmp_path, unused_port_url()))
    assert proc.returncode == 3, proc.stderr
    assert "the report waits in the spool" in proc.stderr
    assert [("report" in b, b.get("event", {}).get("event")) for b in _spooled(tmp_path)] == [
        (True, None),
        (False, "gate"),
    ]


# -- in front of the real manager --------------------------------------------------------------


@pytest.fixture
def real_manager(tmp_path: Path) -> Iterator[Any]:
    pytest.importorskip("fastapi")
    from tests.helpers.manager import ManagerProcess

    server = ManagerProcess(f"sqlite:///{tmp_path / 'fleet.db'}").start()
    yield server
    server.stop()


def _node(server: Any, name: str) -> dict[str, Any]:
    import json
    import urllib.request

    from tests.helpers.manager import VIEWER_H

    req = urllib.request.Request(f"{server.url}/api/v1/nodes/{name}", headers=VIEWER_H)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _nothing_refused(tmp_path: Path, what: str) -> None:
    """The manager took everything: nothing in rejected/ (the manager side of issue 21; without it
    the manager answers 422 to what it does not know, and the agent keeps that there)."""
    import json

    refused = [json.loads(why.read_text()) for why in sorted((tmp_path / "spool" / "rejected").glob("*.why"))]
    assert not refused, f"the manager refused {what}: {[r['why'] for r in refused]}"


@pytest.mark.slow
def test_a_refused_node_is_seen_by_the_real_manager(group: Group, real_manager: Any, tmp_path: Path) -> None:
    from tests.helpers.manager import AGENT

    group.set_limit(256 * MiB)
    node = f"refused-{uuid.uuid4().hex[:8]}"
    env = _real_oomguard(
        tmp_path, real_manager.url, OOMGUARD_NODE=node, OOMGUARD_AGENT_TOKEN=AGENT, OOMGUARD_PLAN_ARGS="--per-job 64MiB"
    )
    proc = group.run(str(ENTRYPOINT), "true", env=env)
    assert proc.returncode == 3, proc.stderr
    detail = _node(real_manager, node)  # the node is there: its one-shot report was stored
    assert "budget-too-small" in json_text(detail)
    _nothing_refused(tmp_path, "the gate event")
    gates = [e for e in detail["events"] if e.get("event") == "gate"]
    assert [{k: g.get(k) for k in REFUSED_CHECK} for g in gates] == [REFUSED_CHECK]
    assert gates[0]["time"].endswith("Z")
    assert "reported to the manager" in proc.stderr


@pytest.mark.slow
def test_labels_reach_the_real_manager(group: Group, real_manager: Any, tmp_path: Path) -> None:
    from tests.helpers.manager import AGENT

    group.set_limit(256 * MiB)
    env = _real_oomguard(tmp_path, real_manager.url, OOMGUARD_AGENT_TOKEN=AGENT, **LABELS_ENV)
    proc = group.run(str(ENTRYPOINT), "true", env=env)
    assert proc.returncode == 3, proc.stderr
    _nothing_refused(tmp_path, "the labels")
    text = json_text(_node(real_manager, "gpu-07"))
    assert all(f'"{k}": "{v}"' in text for k, v in LABELS.items()), text


def json_text(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True)


def test_the_real_gate_refuses_an_explicit_budget_above_the_ceiling(group: Group, tmp_path: Path) -> None:
    """The seed's outage at 1/10 scale: OOMGUARD_BUDGET=20GiB in a 2 GiB group passes no step."""
    group.set_limit(2048 * MiB)
    marker = tmp_path / "started"
    env = _real_oomguard(tmp_path, OOMGUARD_BUDGET="20GiB", OOMGUARD_PLAN_ARGS="--per-job 256MiB")
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
