"""No one node moves its class (issue 36, item 2), on the rule's plain values (``learning.py``:
``capped``, ``bounded``, ``BOUNDS``): each node's weight is capped at the heaviest other node's,
and a class's or the fleet's figure (the size, the baseline, the size for a budget, the P95
forecast) is at most 1.25 times the figure without the one node whose absence lowers it most,
and 1.5 times without two (from 5 nodes). The attacks of the issue: one node at 10x, one 1 EiB
observation, one claiming 1,000,000 jobs; and a property over any honest class and any node."""

from __future__ import annotations

import math
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomguard.manager import learning
from oomguard.manager.learning import MIN_PER_JOB, Sample, bounded, capped, recommend

NOW = 1_800_000_000_000
MiB, GiB, EiB = 1 << 20, 1 << 30, 1 << 60


def sample(node: str, peak: int, *, ago_ms: int = 0, cls: str = "c1", **kw: Any) -> Sample:
    fields: dict[str, Any] = {
        "node": node,
        "node_class": cls,
        "received_ms": NOW - ago_ms,
        "declared_per_job": 1 * GiB,
        "peak_per_job": peak,
        "declared_baseline": 2 * GiB,
        "peak_baseline": 2 * GiB,
        "concurrency": 8,
        "outcome": "ok",
    }
    return Sample(**{**fields, **kw})


def honest(nodes: int = 5, runs: int = 8) -> list[Sample]:
    """A class whose jobs peak between 0.9 and 1.1 GiB, *runs* runs on each of *nodes* nodes."""
    return [
        sample(f"h{n}", int(GiB * (0.9 + 0.2 * ((n * runs + r) % 7) / 6)), ago_ms=60_000 * r)
        for n in range(nodes)
        for r in range(runs)
    ]


def moved(samples: list[Sample], attack: list[Sample], *, budget: int | None = None) -> dict[str, float]:
    """How much *attack* moves a new node's answer for the class, figure by figure (1.0: not at all)."""
    before = recommend(NOW, "new", "c1", samples, budget=budget)
    after = recommend(NOW, "new", "c1", [*samples, *attack], budget=budget)
    assert before.source == after.source == "class"
    out = {
        "per_job": (after.per_job_bytes or 0) / (before.per_job_bytes or 1),
        "baseline": (after.baseline_bytes or 0) / (before.baseline_bytes or 1),
    }
    if before.peak_p95_per_job_bytes and after.peak_p95_per_job_bytes:
        out["p95"] = after.peak_p95_per_job_bytes / before.peak_p95_per_job_bytes
    return out


def test_one_node_at_ten_times_moves_its_class_by_at_most_a_quarter() -> None:
    """The issue's measure: 50 ok observations at 10x the true peak from one node raised its class's
    size by +816-849 %. Now at most 25 %, for the size, the size for a budget and the forecast."""
    attack = [sample("evil", 10 * GiB, ago_ms=1000 * i) for i in range(50)]
    for budget in (None, 64 * GiB):
        for figure, factor in moved(honest(), attack, budget=budget).items():
            assert factor <= 1.25 + 1e-9, (budget, figure, factor)  # + a byte's rounding
    said = recommend(NOW, "new", "c1", [*honest(), *attack]).explanation
    assert any("without evil" in line and "at most 25 %" in line for line in said), said


def test_one_exbibyte_and_a_million_jobs_move_the_class_by_at_most_a_quarter() -> None:
    """A node without a report is not checked against its limit (the API refuses these from one
    with a report): one 1 EiB observation, one of 1,000,000 jobs (which weighs in the spread as
    n (x - m)^2), and both at once, on the size, the baseline and the P95 forecast."""
    attacks = {
        "1 EiB": [sample("evil", EiB)],
        "1 EiB baseline": [sample("evil", GiB, peak_baseline=EiB)],
        "a million jobs": [sample("evil", 2 * GiB, concurrency=1_000_000)],
        "both": [sample("evil", EiB, concurrency=1_000_000), sample("evil", EiB, ago_ms=5)],
    }
    for name, attack in attacks.items():
        for budget in (None, 64 * GiB):
            for figure, factor in moved(honest(), attack, budget=budget).items():
                assert factor <= 1.25 + 1e-9, (name, budget, figure, factor)


def test_two_nodes_of_five_move_it_by_at_most_a_half() -> None:
    attack = [sample(f"evil{k}", 10 * GiB, ago_ms=1000 * i) for k in range(2) for i in range(50)]
    for figure, factor in moved(honest(nodes=5), attack).items():
        assert factor <= 1.5 + 1e-9, (figure, factor)
    # Without the second bound (fewer than 5 nodes in all) two nodes that agree are two witnesses.
    few = moved(honest(nodes=1), attack)
    assert few["per_job"] > 1.5


def test_a_node_posting_many_weighs_no_more_than_the_busiest_other() -> None:
    pairs = [(sample("a", GiB), 1.0)] * 3 + [(sample("b", GiB), 1.0)] * 2 + [(sample("c", GiB), 0.5)] * 100
    weights: dict[str, float] = {}
    for s, w in capped(pairs):
        weights[s.node] = weights.get(s.node, 0.0) + w
    assert weights == pytest.approx({"a": 3.0, "b": 2.0, "c": 3.0})
    alone = [(sample("a", GiB), 1.0)] * 4
    assert capped(alone) == alone  # one node: nothing to weigh it against


def test_the_bound_is_said_and_a_class_that_agrees_is_not_held() -> None:
    agreeing = recommend(NOW, "new", "c1", honest())
    assert not any("is held at" in line for line in agreeing.explanation), agreeing.explanation
    pairs = [(s, 1.0) for s in honest(nodes=3)]
    assert bounded(lambda p: max(s.peak_per_job for s, _ in p), pairs) == max(s.peak_per_job for s in honest(3))


def test_a_first_kill_still_raises_its_class_at_once() -> None:
    """The bound is on what the samples say; the floor of an OOM kill is the lesson (item 1), not
    bounded so (the API checks its sizes against the node's own report)."""
    kill = sample("h0", 3 * GiB, outcome="oom-kill", declared_per_job=2 * GiB)
    r = recommend(NOW, "new", "c1", [*honest(), kill])
    assert r.per_job_bytes == r.floor_bytes == math.ceil(3 * GiB * 1.3)


peaks = st.integers(MIN_PER_JOB, 64 * GiB)


@given(
    st.lists(st.tuples(st.integers(0, 5), peaks, st.integers(1, 64)), min_size=3, max_size=30),
    st.lists(st.tuples(peaks, st.integers(1, 10**6), st.integers(0, 2**40)), min_size=1, max_size=60),
)
def test_any_one_node_moves_any_honest_class_up_by_at_most_a_quarter(
    runs: list[tuple[int, int, int]], attack: list[tuple[int, int, int]]
) -> None:
    """Whatever one node posts (ok runs of any peak, any job count, any baseline), a class of up to
    6 other nodes answers a new node at most 1.25 x what the others' samples say without it: the
    size, the baseline and the P95 forecast. "What they say" is their figure before its own bound
    (``BOUNDS`` off): a class whose own nodes disagree may be held lower by it, and one more node
    in the class changes which nodes that bound leaves out. (With a budget the answer is one of two
    rules, which one by the jobs' count; each is bounded so, the tests above try the issue's
    attacks on it.)"""
    mine = [sample(f"h{n}", peak, concurrency=jobs, ago_ms=i * 1000) for i, (n, peak, jobs) in enumerate(runs)]
    theirs = [
        sample("evil", peak, concurrency=jobs, peak_baseline=base, ago_ms=i)
        for i, (peak, jobs, base) in enumerate(attack)
    ]
    with patch.object(learning, "BOUNDS", ()):
        before = recommend(NOW, "new", "c1", mine)
    after = recommend(NOW, "new", "c1", [*mine, *theirs])
    pairs = [
        (before.per_job_bytes, after.per_job_bytes),
        (before.baseline_bytes, after.baseline_bytes),
        (before.peak_p95_per_job_bytes, after.peak_p95_per_job_bytes),
    ]
    for was, now in pairs:
        if was is not None and now is not None:
            assert now <= was * 1.25 + 1, (was, now, after.explanation)  # + a byte: both round up
