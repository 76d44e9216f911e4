"""``--learned`` (issue 23, item 3): ``plan`` and ``run`` take a profile's size from what the fleet
manager learned. The rule on plain values (``policy/learned.py``), then real ``plan`` and ``run``
processes against a real manager (SQLite): the answer used and kept on disk, the kept answer when
the manager is down, the declared size with neither, raise-only, the ceiling, the start event and
the observation of the size the jobs ran at."""

from __future__ import annotations

import json
import math
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oomguard
from oomguard.manager.learning import MARGIN
from oomguard.policy.learned import Answer, apply, parse_answer
from oomguard.policy.plan import Shape
from tests.conftest import run_oomguard
from tests.helpers.agent_fake import unused_port_url
from tests.helpers.fuzz import examples
from tests.helpers.manager import AGENT, AGENT_H, VIEWER_H, ManagerProcess, db_url_of
from tests.helpers.wait import wait_until

MiB = 1 << 20
GiB = 1 << 30
SHAPE = Shape(64 * MiB, 16 * MiB, profile="tiny")


def answer(**kw: Any) -> Answer:
    fields: dict[str, Any] = {
        "per_job_bytes": 100 * MiB,
        "baseline_bytes": 16 * MiB,
        "source": "class",
        "samples": 7,
        "confidence": 0.58,
        "updated": "2027-01-01T00:00:00Z",
        "node_class": "cpu/ram:32GiB",
    }
    return Answer(**{**fields, **kw})


# -- the rule ------------------------------------------------------------------------------------


def test_a_learned_size_above_the_declared_is_used_and_said() -> None:
    shape, d = apply(SHAPE, answer(), origin="manager", fetched="2027-01-02T00:00:00Z", ceiling=GiB)
    assert (shape.per_job, shape.baseline, shape.profile) == (100 * MiB, 16 * MiB, "tiny")
    assert d["used"] == "learned" and d["origin"] == "manager" and d["source"] == "class"
    assert (d["per_job_bytes"], d["declared_per_job_bytes"], d["learned_per_job_bytes"]) == (
        100 * MiB,
        64 * MiB,
        100 * MiB,
    )
    assert d["why"] == "learned 100 MiB per job (7 sample(s), class cpu/ram:32GiB), declared 64 MiB"


def test_raise_only_unless_the_operator_lets_it_lower() -> None:
    low = answer(per_job_bytes=10 * MiB, baseline_bytes=8 * MiB)
    shape, d = apply(SHAPE, low, origin="manager", ceiling=GiB)
    assert shape is SHAPE and d["used"] == "declared" and d["learned_per_job_bytes"] == 10 * MiB
    assert "below the declared 64 MiB" in d["why"] and "--learned-may-lower" in d["why"]
    shape, d = apply(SHAPE, low, origin="manager", ceiling=GiB, may_lower=True)
    assert (shape.per_job, shape.baseline, d["used"]) == (10 * MiB, 8 * MiB, "learned")


def test_a_floor_is_taken_from_the_first_kill_and_never_dropped() -> None:
    """Issue 36, item 1: the class's floor before 3 samples (``source: floor``) is used; an older
    manager's ``declared`` answer above the declared size (the same floor, labelled so) is used too,
    raise-only even with --learned-may-lower; a ``declared`` answer at or below it is not."""
    floor = answer(per_job_bytes=96 * MiB, source="floor", samples=0)
    shape, d = apply(SHAPE, floor, origin="manager", ceiling=GiB)
    assert (shape.per_job, d["used"], d["source"]) == (96 * MiB, "learned", "floor")
    assert d["why"] == (
        "learned 96 MiB per job (0 sample(s), the floor an OOM kill or pressure stop in class cpu/ram:32GiB set), "
        "declared 64 MiB"
    )
    old = answer(per_job_bytes=96 * MiB, baseline_bytes=8 * MiB, source="declared", samples=0)
    for may_lower in (False, True):
        shape, d = apply(SHAPE, old, origin="manager", ceiling=GiB, may_lower=may_lower)
        assert (shape.per_job, shape.baseline, d["used"]) == (96 * MiB, 16 * MiB, "learned"), may_lower
    for low in (answer(per_job_bytes=64 * MiB, source="declared"), answer(per_job_bytes=8 * MiB, source="declared")):
        shape, d = apply(SHAPE, low, origin="manager", ceiling=GiB, may_lower=True)
        assert shape is SHAPE and d["used"] == "declared" and "learned nothing" in d["why"]


def test_the_ceiling_bounds_a_learned_size_and_nothing_learned_keeps_the_declared() -> None:
    shape, d = apply(SHAPE, answer(per_job_bytes=2**45), origin="cache", fetched="2027-01-01T00:00:00Z", ceiling=GiB)
    assert shape.per_job == GiB and d["used"] == "learned" and "above this node's ceiling" in d["why"]
    assert d["why"].startswith("the answer kept from 2027-01-01T00:00:00Z: ")
    shape, d = apply(SHAPE, answer(per_job_bytes=None, source="declared", samples=0), origin="manager")
    assert shape is SHAPE and d["used"] == "declared" and "learned nothing of tiny yet" in d["why"]
    shape, d = apply(SHAPE, None, origin="none", unreached="connection refused")
    assert shape is SHAPE and d["origin"] == "none" and d["source"] is None
    assert (
        d["why"]
        == "the manager gave no answer (connection refused); no earlier answer kept: the declared 64 MiB per job"
    )


def test_an_answer_that_does_not_fit_is_said_never_raised() -> None:
    assert isinstance(
        parse_answer({"per_job_bytes": 1, "baseline_bytes": None, "source": "fleet", "samples": 3}), Answer
    )
    for bad, words in [
        ([], "not a JSON object"),
        ({"source": "fleet", "per_job_bytes": None}, "without per_job_bytes"),
        ({"source": "fleet", "per_job_bytes": -1}, "out of range"),
        ({"source": "fleet", "per_job_bytes": True}, "not a whole number"),
        ({"source": "moon", "per_job_bytes": 1}, "not one of"),
        ({"source": "fleet", "per_job_bytes": 1, "samples": -2}, "not a count"),
        ({"source": "fleet", "per_job_bytes": 1, "confidence": "high"}, "not a number"),
    ]:
        got = parse_answer(bad)
        assert isinstance(got, str) and words in got, (bad, got)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=6),
    max_leaves=20,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        k: JSON | st.integers(-1, 2**64) | st.sampled_from(["node", "class", "fleet", "declared"])
        for k in ("per_job_bytes", "baseline_bytes", "source", "samples", "confidence", "updated", "node_class")
    },
)


@settings(max_examples=examples(200), deadline=None)
@given(data=JSON | FIELDS)
def test_any_json_is_an_answer_or_a_reason_and_an_answer_applies(data: Any) -> None:
    got = parse_answer(data)
    assert isinstance(got, (Answer, str))
    if isinstance(got, Answer):
        shape, d = apply(SHAPE, got, origin="manager", ceiling=GiB)
        assert 0 < shape.per_job <= max(GiB, SHAPE.per_job) and d["why"]
        assert shape.per_job >= SHAPE.per_job or got.source == "declared" or shape is SHAPE


# -- real plan and run against a real manager --------------------------------------------------


def observe(
    url: str, node: str, peak: int, *, declared: int = 64 * MiB, outcome: str = "ok", node_class: str | None = None
) -> None:
    obs = {
        **({"node_class": node_class} if node_class else {}),
        "profile": "tiny",
        "declared_per_job_bytes": declared,
        "peak_per_job_bytes": peak,
        "declared_baseline_bytes": 16 * MiB,
        "peak_baseline_bytes": None,
        "concurrency": 2,
        "outcome": outcome,
        "time": "2027-01-15T08:00:00Z",
    }
    body = json.dumps({"node": node, "id": uuid.uuid4().hex, "observation": obs}).encode()
    req = urllib.request.Request(
        f"{url}/api/v1/observations", data=body, headers={**AGENT_H, "Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def advice(url: str, node: str) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}/api/v1/profiles/tiny/recommendation?node={node}", headers=VIEWER_H)
    with urllib.request.urlopen(req, timeout=10) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"tiny": {"per_job": "64MiB", "baseline": "16MiB"}}))
    return path


def plan(url: str, profiles: Path, spool: Path, node: str, *more: str) -> tuple[dict[str, Any], str]:
    proc = run_oomguard(
        "plan", "--json", "--budget", "1GiB", "--profiles", str(profiles), "--profile", "tiny", "--learned",
        "--manager", url, "--token", AGENT, "--node", node, "--spool", str(spool), *more,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_plan_takes_the_learned_size_keeps_it_and_plans_with_it_offline(
    db: str, profiles: Path, tmp_path: Path
) -> None:
    server = ManagerProcess(db_url_of(db, tmp_path, "learned_")).start()
    spool = tmp_path / "spool"
    try:
        for _ in range(3):  # enough for a node's own answer (manager/learning.py: MIN_SAMPLES)
            observe(server.url, "w1", 100 * MiB)
            observe(server.url, "low1", 10 * MiB)
        learned = math.ceil(100 * MiB * (1 + MARGIN))
        out, _ = plan(server.url, profiles, spool, "w1")
        d = out["learned"]
        assert (d["used"], d["origin"], d["source"], d["per_job_bytes"]) == ("learned", "manager", "node", learned)
        assert out["concurrency"] == (GiB - 16 * MiB) // learned  # planned at the learned size
        assert out["shape"]["per_job_bytes"] == learned
        kept = json.loads((spool / "learned" / "tiny.json").read_text())
        assert kept["answer"]["per_job_bytes"] == learned and kept["fetched"] == d["fetched"]
        # A node that never ran the profile, of no class the manager knows: the fleet's size.
        assert plan(server.url, profiles, tmp_path / "spool-new", "new-node")[0]["learned"]["source"] == "fleet"
        # The operator's class of node (--node-class): a node new to the manager starts from its class.
        for node in ("c1", "c2", "c3"):
            observe(server.url, node, 200 * MiB, node_class="lab")
        classed, _ = plan(server.url, profiles, tmp_path / "spool-class", "fresh", "--node-class", "lab")
        assert (classed["learned"]["source"], classed["learned"]["samples"]) == ("class", 3)
        # 4 jobs of a 1 GiB budget: a small run, whose budget keeps the one margin (no 10 % more).
        assert classed["shape"]["per_job_bytes"] == 200 * MiB
        # Raise-only: the jobs of low1 used less than declared; the operator may let it lower.
        low, _ = plan(server.url, profiles, tmp_path / "spool-low", "low1")
        assert low["learned"]["used"] == "declared" and low["shape"]["per_job_bytes"] == 64 * MiB
        lowered, _ = plan(server.url, profiles, tmp_path / "spool-low", "low1", "--learned-may-lower")
        assert lowered["shape"]["per_job_bytes"] == math.ceil(10 * MiB * (1 + MARGIN))
        text = run_oomguard(
            "plan", "--budget", "1GiB", "--profiles", str(profiles), "--profile", "tiny", "--learned",
            "--manager", server.url, "--token", AGENT, "--node", "w1", "--spool", str(spool),
        )  # fmt: skip
        assert f"learned    learned {learned / MiB:.3g} MiB per job (3 sample(s), node)" in text.stdout, text.stdout
        kept = json.loads((spool / "learned" / "tiny.json").read_text())  # the budget went with the question
        assert kept["answer"]["budget_bytes"] == 1 << 30, kept
        # The API a worker sizing its own MemoryBudget reservations calls: the same answer.
        api_shape, api = oomguard.learned_shape(
            SHAPE, manager=server.url, token=AGENT, node="w1", spool=str(tmp_path / "spool-api")
        )
        assert api_shape.per_job == learned and api["origin"] == "manager" and api["source"] == "node"
        with pytest.raises(ValueError, match="needs a shape with a profile"):
            oomguard.learned_shape(Shape(MiB), manager=server.url)
    finally:
        server.stop()
    offline, _ = plan(server.url, profiles, spool, "w1")  # the manager is gone: the answer kept
    d = offline["learned"]
    assert (d["origin"], d["per_job_bytes"], d["used"]) == ("cache", learned, "learned")
    assert d["why"].startswith("the manager gave no answer (connection refused); the answer kept from ")
    never, _ = plan(unused_port_url(), profiles, tmp_path / "spool-empty", "w1")  # nothing kept: declared
    assert never["learned"]["origin"] == "none" and never["shape"]["per_job_bytes"] == 64 * MiB


def test_learned_needs_a_profile_and_a_manager_and_says_so_in_one_line(profiles: Path) -> None:
    for args, words in [
        (["--per-job", "1GiB", "--learned", "--manager", "http://127.0.0.1:9"], "--learned needs --profile NAME"),
        (["--profiles", str(profiles), "--profile", "tiny", "--learned"], "--learned needs --manager URL"),
        (
            ["--profiles", str(profiles), "--profile", "tiny", "--learned-may-lower"],
            "--learned-may-lower needs --learned",
        ),
        (["--profile", "porep-c2-32g", "--learned", "--manager", "ftp://x"], "--manager: the URL must be"),
    ]:
        proc = run_oomguard("plan", *args)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_run_starts_at_the_learned_size_and_observes_that_size(db: str, profiles: Path, tmp_path: Path) -> None:
    server = ManagerProcess(db_url_of(db, tmp_path, "learned_")).start()
    events, out = tmp_path / "events.jsonl", tmp_path / "per_job"
    worker = f"echo $OOMGUARD_PER_JOB_BYTES > {out}; exec {sys.executable} -c 'import time; time.sleep(0.5)'"
    try:
        for _ in range(3):
            observe(server.url, "r1", 100 * MiB)
        learned = math.ceil(100 * MiB * (1 + MARGIN))
        proc = run_oomguard(
            "run", "--budget", "1GiB", "--restart", "never", "--profiles", str(profiles), "--profile", "tiny",
            "--learned", "--manager", server.url, "--token", AGENT, "--node", "r1", "--spool", str(tmp_path / "spool"),
            "--events", str(events), "--node-class", "lab2", "--", "sh", "-c", worker,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert int(out.read_text()) == learned  # the worker was given the learned size
        start = next(json.loads(line) for line in events.read_text().splitlines() if '"start"' in line)
        assert start["learned"]["used"] == "learned" and start["learned"]["per_job_bytes"] == learned
        assert start["concurrency"] == (GiB - 16 * MiB) // learned
        assert (
            f"per job {learned / MiB:.3g} MiB (learned {learned / MiB:.3g} MiB per job (3 sample(s), node)"
            in proc.stderr
        )

        def arrived() -> dict[str, Any]:  # the run's own observation arrives
            now = advice(server.url, "r1")
            return now if now["samples"] >= 4 else {}

        seen = wait_until(arrived, interval=0.1, what="the run's own observation (a 4th sample)")
        assert seen["samples"] == 4 and seen["declared_per_job_bytes"] == learned  # the size the jobs ran at
        assert seen["node_class"] == "lab2"  # --node-class: the node_class label of run's envelopes
    finally:
        server.stop()


# -- MemoryBudget's observations -----------------------------------------------------------------


class Box:
    """A working set the test sets; the watch's sampler reads it."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


def test_a_watched_budget_observes_what_its_jobs_really_used() -> None:
    """Declared 100 MiB a job; each really raises the working set by 125 MiB: the overshoot the
    watch learns (two samples in a row) makes the observation's per-job peak."""
    box = Box(50 * MiB)  # the worker's baseline: what it holds with nothing reserved
    watch = oomguard.Watch(box, 2 * GiB, margin_bytes=0, interval=0.01, warmup_bytes=0)
    with oomguard.MemoryBudget(2 * GiB, watch=watch) as budget:
        assert budget.observation("tiny", 100 * MiB) is None  # nothing learned yet: nothing to say
        jobs = [budget.reserve(100 * MiB) for _ in range(3)]
        box.value = 50 * MiB + 3 * 125 * MiB
        wait_until(lambda: budget.overshoot == 1.25, interval=0.002, what="the overshoot learned")
        for r in jobs:
            r.release()
        seen = budget.observation("tiny", 100 * MiB, 40 * MiB)
    assert seen is not None and seen["time"].endswith("Z")
    assert {k: v for k, v in seen.items() if k != "time"} == {
        "profile": "tiny",
        "declared_per_job_bytes": 100 * MiB,
        "peak_per_job_bytes": 125 * MiB,
        "declared_baseline_bytes": 40 * MiB,
        "peak_baseline_bytes": 50 * MiB,
        "concurrency": 3,
        "outcome": "ok",
    }
    assert oomguard.MemoryBudget(GiB).observation("tiny", MiB) is None  # no watch: nothing seen
    with pytest.raises(ValueError, match="per_job must be an int above 0"):
        oomguard.MemoryBudget(GiB).observation("tiny", 0)


@pytest.mark.slow
def test_send_observation_spools_and_delivers_and_the_manager_learns_from_it(tmp_path: Path) -> None:
    server = ManagerProcess(f"sqlite:///{tmp_path / 'fleet.db'}").start()
    obs = {
        "profile": "tiny",
        "declared_per_job_bytes": 64 * MiB,
        "peak_per_job_bytes": 80 * MiB,
        "declared_baseline_bytes": 16 * MiB,
        "peak_baseline_bytes": 20 * MiB,
        "concurrency": 3,
        "outcome": "ok",
        "time": "2027-01-15T08:00:00Z",
    }
    spool = str(tmp_path / "spool")
    try:
        for _ in range(3):
            fate = oomguard.send_observation(obs, manager=server.url, token=AGENT, node="mb1", spool=spool)
            assert fate == "delivered"
        seen = advice(server.url, "mb1")
        assert (seen["source"], seen["samples"]) == ("node", 3)
        assert seen["per_job_bytes"] == math.ceil(80 * MiB * (1 + MARGIN))
        assert seen["baseline_bytes"] == math.ceil(20 * MiB * (1 + MARGIN))  # measured, by the watch
        bad = oomguard.send_observation(
            {**obs, "concurrency": 0}, manager=server.url, token=AGENT, node="mb1", spool=spool
        )
        assert bad == "rejected"  # the manager's 422: kept in rejected/, never retried
    finally:
        server.stop()
    later = oomguard.send_observation(obs, manager=server.url, token=AGENT, node="mb1", spool=spool)
    assert later == "spooled"  # the manager is gone: it waits in the spool for the agent
