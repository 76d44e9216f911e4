"""``run --profile --manager`` tells the manager what each run really used (issue 23): the
observation an exit event makes (``supervisor/observe.py``), its way through the spool after its
exit event, and a real ``run`` against a real manager."""

from __future__ import annotations

import json
import math
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oomguard.agent import EventForwarder
from oomguard.policy.plan import Shape
from oomguard.supervisor.observe import observation
from tests.conftest import run_oomguard
from tests.helpers.agent_fake import TOKEN, FakeManager, running_manager
from tests.helpers.manager import AGENT, VIEWER_H, ManagerProcess
from tests.helpers.wait import wait_until

MiB = 1 << 20
SHAPE = Shape(64 * MiB, 16 * MiB, profile="tiny")


def exit_event(**kw: Any) -> dict[str, Any]:
    fields = {"event": "exit", "reason": "clean", "peak_bytes": 144 * MiB, "concurrency": 4}
    return {**fields, "time": "2027-01-01T00:00:00Z", **kw}


def test_an_exit_makes_the_runs_observation() -> None:
    seen = observation(exit_event(), SHAPE)
    assert seen == {
        "profile": "tiny",
        "declared_per_job_bytes": 64 * MiB,
        "peak_per_job_bytes": 32 * MiB,  # (144 - 16) / 4
        "declared_baseline_bytes": 16 * MiB,
        "peak_baseline_bytes": None,  # not measured
        "concurrency": 4,
        "outcome": "ok",
        "time": "2027-01-01T00:00:00Z",
    }
    for reason, outcome in (("exit", "ok"), ("oom-kill", "oom-kill"), ("pressure-stop", "pressure-stop")):
        assert (observation(exit_event(reason=reason), SHAPE) or {})["outcome"] == outcome
    assert (observation(exit_event(peak_bytes=MiB), SHAPE) or {})["peak_per_job_bytes"] == 0  # below the baseline
    assert "node_class" not in seen  # none given: the manager's, from the node's label or report
    # An OOM-killed worker the reaper emptied before it exited: its peak unknown, taken at the
    # limit less what the group's other processes held, for the lesson not to be lost.
    killed = exit_event(reason="oom-kill", peak_bytes=None, effective_bytes=400 * MiB, outside_bytes=32 * MiB)
    assert (observation(killed, SHAPE) or {})["peak_per_job_bytes"] == (400 - 32 - 16) * MiB // 4
    assert (observation({**killed, "outside_bytes": None}, SHAPE) or {})["peak_per_job_bytes"] == (400 - 16) * MiB // 4
    assert (observation(exit_event(), SHAPE, "l4-small") or {})["node_class"] == "l4-small"


@pytest.mark.parametrize(
    ("event", "shape"),
    [
        (exit_event(reason="signal"), SHAPE),  # stopped from outside: no sample
        (exit_event(peak_bytes=None), SHAPE),  # no peak known
        (exit_event(reason="oom-kill", peak_bytes=None, effective_bytes=None), SHAPE),  # nor a limit
        (exit_event(concurrency=None), SHAPE),
        (exit_event(concurrency=0), SHAPE),
        (exit_event(time=None), SHAPE),
        (exit_event(event="start"), SHAPE),
        (exit_event(), Shape(64 * MiB)),  # --per-job without --profile: nothing to learn it for
        (exit_event(), None),
    ],
)
def test_no_observation_without_what_it_needs(event: dict[str, Any], shape: Shape | None) -> None:
    assert observation(event, shape) is None


@pytest.fixture
def manager() -> Iterator[FakeManager]:
    yield from running_manager()


def test_the_forwarder_sends_the_observation_after_its_exit_event(manager: FakeManager, tmp_path: Path) -> None:
    fwd = EventForwarder(manager.url, TOKEN, "gpu-1", str(tmp_path / "spool"), observe=lambda e: observation(e, SHAPE))
    fwd({"event": "start", "pid": 1, "concurrency": 4})
    fwd(exit_event(pid=1))
    fwd.close()
    posted = [(r["path"], r["body"]) for r in manager.requests if r["method"] == "POST"]
    assert [p for p, _ in posted] == ["/api/v1/events", "/api/v1/events", "/api/v1/observations"]
    body = posted[-1][1]
    assert body["node"] == "gpu-1" and body["observation"]["peak_per_job_bytes"] == 32 * MiB
    assert not list((tmp_path / "spool").glob("*.json"))  # all delivered


def advice(url: str, profile: str, node: str) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}/api/v1/profiles/{profile}/recommendation?node={node}", headers=VIEWER_H)
    with urllib.request.urlopen(req, timeout=10) as r:
        answer: dict[str, Any] = json.loads(r.read())
        return answer


@pytest.mark.slow
def test_a_real_run_of_a_profile_teaches_a_real_manager(tmp_path: Path) -> None:
    """Three real runs of a worker that holds 96 MiB for a second (long enough for its peak to be
    sampled, and its high-water mark well above the supervisor's own: a worker gone before that
    has no known peak, and sends no observation; CI's loaded run once saw 47 MB of 48 MiB)."""
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps({"tiny": {"per_job": "64MiB", "baseline": "16MiB"}}))
    worker = "import time; b = bytearray(96 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1)"
    server = ManagerProcess(f"sqlite:///{tmp_path / 'fleet.db'}").start()
    try:
        for _ in range(3):
            proc = run_oomguard(
                "run", "--budget", "1GiB", "--restart", "never", "--profiles", str(profiles), "--profile", "tiny",
                "--manager", server.url, "--token", AGENT, "--node", "worker-8", "--spool", str(tmp_path / "spool"),
                "--events", str(tmp_path / "events.jsonl"), "--", sys.executable, "-c", worker,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
        events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        exits = [e for e in events if e["event"] == "exit"]
        peaks = [e["peak_bytes"] for e in exits]
        assert all(p is not None and p > 96 * MiB for p in peaks), peaks

        def arrived() -> dict[str, Any]:
            now = advice(server.url, "tiny", "worker-8")
            return now if now["samples"] >= 3 else {}

        answer = wait_until(arrived, interval=0.1, what="the three runs' observations")
        assert answer["source"] == "node" and answer["samples"] == 3, answer
        assert answer["declared_per_job_bytes"] == 64 * MiB and answer["declared_baseline_bytes"] == 16 * MiB
        assert answer["baseline_bytes"] == 16 * MiB  # not measured: the declared one
        assert any("baseline not measured" in line for line in answer["explanation"])
        per_job = [(p - 16 * MiB) // exits[0]["concurrency"] for p in peaks]  # 15 jobs in 1 GiB
        assert answer["per_job_bytes"] == max(MiB, math.ceil(max(per_job) * 1.1))  # P98 of 3: the largest
    finally:
        server.stop()
