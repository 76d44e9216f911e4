"""The fleet learns (issue 23): what a profile's jobs really use, and the size to plan them at.

An observation is one run of a profiled worker on one node: per job, the size it was declared at
and the peak it was seen to reach; the baseline, likewise; the concurrency; the outcome (``ok``,
``oom-kill``, ``pressure-stop``). This module is the rule, on plain values (no database): the
store (``store/learned.py``) gathers the samples and the API serves the answer.

The rule, for one scope (the node itself, its class of node, or the whole fleet):

- **Samples**: the scope's observations of the profile received in the last ``WINDOW_MS`` (14
  days), the newest ``MAX_SAMPLES``; each weighs ``2 ** (-age / HALF_LIFE_MS)``, a 48-hour
  half-life: Google Autopilot's moving window (EuroSys 2020, "Autopilot: workload autoscaling at
  Google", section 3.2.1: exponentially decaying histogram, half-life 48 h).
- **Per job**: the weighted ``PERCENTILE`` (98th) of the observed per-job peaks, plus ``MARGIN``
  (10 %): Autopilot's P98 with a 10-15 % safety margin for jobs that cannot tolerate an OOM kill.
  A peak seen in a run that was killed is counted too: it is at most what the job needed.
- **Baseline**: the same rule over the observed baselines (those measured: ``run --profile``
  sends none, and the newest run's declared baseline stands in).
- **Floor**: an OOM kill or a pressure stop of the profile in the node's class raises that class's
  per-job floor at once to ``OOM_BUMP`` (1.3) times the larger of the size it ran at and the peak
  seen, for as long as it is in the window. A recommendation is never below its class's floor
  (with a budget, but where it is released or held at the room, below), so the same kill does
  not happen twice for the same reason: a job up to 30 % over its size fits
  after one kill. Only a failure the node's own supervisor showed (its exit event of the same
  reason and time: ``Sample.confirmed``, ``store/claims.py``, issue 37) raises a floor; an
  unconfirmed one is a sample, which one node moves its class by at most ``BOUNDS`` allows.
  (The Kubernetes VPA bumps by x1.2 or +100 MiB, whichever is more, on top of its percentile:
  a job 25 % over is killed twice before it fits;
  vertical-pod-autoscaler/pkg/recommender/model/container.go, ``RecordOOM``.)
- **At least** ``MIN_PER_JOB`` (1 MiB): a run whose jobs rose nothing above the baseline still
  gets a size a plan can divide by (the VPA's floor is 250 MB, ``podMinMemoryMb``).
- **For a budget** (``recommend(budget=...)``, the API's ``budget_bytes``): the size that fits the
  most jobs whose summed peaks keep ``RUN_Z`` (4) of the sum's standard deviations free
  (``per_run_size``), from the node's or its class's runs that ended well (``SPREAD_MIN``, 10).
  For runs of ``SPREAD_MIN_JOBS`` (8) jobs or more it is taken in place of the percentile rule's:
  smaller for many jobs, larger where the runs are wide. Below 8 it only guards: taken where it
  is larger (the sum of a few jobs needs more room than the percentile rule leaves), never where
  smaller, as a sum of a few heavy-tailed peaks is far from normal. Where it is the smaller, the
  class's floor is released once ``SPREAD_MIN`` runs have ended well since the failure that set
  it: the spread then measures the jobs. ``bench/fleet.py`` over three seeds: from 8 jobs a run,
  about the same OOM kills as the percentile rule alone and 3.3-4.4 points less slack (on the
  Alibaba jobs, 13 kills against its 24, none after their pair's first against 4); taken smaller
  from 2 jobs, 2 more kills after their pair's first in one seed; as a guard below 8 jobs, 5-6
  fewer OOM kills in each seed (23, 18 and 28 against 28, 24 and 34), for the same slack (within
  0.4 points) and 0.0-0.3 % fewer jobs per node-hour (BENCHMARKS.md, session 16).
- **One margin** (with a budget, issue 36): for a run of fewer than ``SPREAD_MIN_JOBS`` jobs the
  percentile rule's size keeps ``BUDGET_MARGIN`` (0) instead of ``MARGIN``: the budget a run
  sends already sits a margin under its limit. bench/fleet.py, seeds 23, 1, 2: runs of 2-7 jobs
  at 24.3-25.5 % slack against a VPA-like sizer's 25.5-27.9 %, 0 OOM kills after their pair's first.
- **Held at the room** (with a budget): a size above the budget's room (the budget less the
  baseline) is held at the room, one job a run, where the jobs fit it: the class's own samples
  (however few; with none, those the size came from) have their weighted P98 per-job peak within
  the room, and their failed runs of one job (one job larger than a room; a failed run of several
  says only that their sum was) weigh at most 2 %. Such a size comes from a margin or a floor over
  jobs that fit: the 10 % margin over the P98, a floor a tail job set (a run of one job killed
  raises it to 1.3 x the room), or the fleet's size from other classes' runs. Refusing every run
  for it would stop the 98 % that fit for the whole window, and a class that never runs never
  learns its own (``bench/fleet.py --seed 2``: 191 runs of one pair; ``--trace alibaba``: 357).
  Where more than 2 % of them failed so, or their P98 is above the room, the size stands and
  the node cannot run the profile.
- **Which scope**: the node's own samples when it has ``MIN_SAMPLES`` (3) or more; else its class's;
  else the fleet's; else the size declared (``source: declared``): a new node of a known class
  starts from what its class has learned, never from nothing. Where no scope has enough but a
  failure in the class raised the declared size to its floor, the answer is that floor, labelled
  ``source: floor`` (issue 36): the first kill's lesson is taken by the next node of the class,
  which ``--learned`` leaves only a ``declared`` answer for.
- **No one node moves its class** (issue 36): in a class's or the fleet's samples each node's
  summed weight is capped at the heaviest other node's (``capped``), and each figure of the scope
  (the size, the baseline, the size for a budget, the P95 forecast) is at most 1.25 times the
  same figure without the node whose absence lowers it most, 1.5 times without two from 5 nodes
  (``bounded``, ``BOUNDS``): one node raises its class by at most 25 % over what the others'
  samples say, whatever it posts. A floor is not bounded so: one kill is the lesson.
- **Confidence**: ``n / (n + CONFIDENCE_K)`` with ``n`` the samples' summed weights (``K`` = 5):
  0 with none, 0.5 for five fresh samples, lower as they age.
- **One job's P95 peak, a forecast** (``job_p95``): the gamma law's P95 of mean m and spread d
  (``gamma_p95``) from the first scope with
  ``SPREAD_MIN`` runs that ended well, m and d one job's mean and spread as ``run_moments`` reads
  them from the runs' means (d as seen: a forecast, not a bound). No margin, no floor: what one
  job reaches, for the operator and a new node's first guess, not a size to plan at.

Bias (what the estimator gets wrong, and which way): the rule takes each observation's per-job
peak as sent. The estimator ``bench/fleet.py`` simulates, and ``run --profile`` sends, is the
group's peak rise over the baseline divided by the concurrency: the mean of the jobs' peaks, not
the largest. That mean is what decides a kill when the peaks coincide; when they do not, it reads
each job's own peak low, and a percentile of it sits below the percentile of single jobs
(bench/fleet.py's cold-start line measures by how much). The forecast of one job's P95 reads the
jobs' spread back out of the means' (d^2 = the mean of n (x - m)^2), so it does not shrink with
n. Its own biases: a gamma law's tail where the jobs' own is another (high where a rare far tail
inflates d: about +3 % on lognormal jobs with 1 % at 2x; low for a tail heavier than a gamma's);
correlated jobs in a run (high: their means vary more than d / sqrt(n)); the runs that failed,
left out with the largest sums (low).

Node class: the node's own (``store/claims.py``, issue 37: never the observation's word for
another): its ``node_class`` label (an operator's), else derived from its latest report: the GPU
model and the host's RAM to the nearest power of two GiB
(``gpu:NVIDIA-H100-80GB-HBM3/ram:512GiB``, ``cpu/ram:64GiB``), the kind of node the job runs on.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oomguard._types import FAILURES, RecommendationSource
from oomguard.units import MAX_SIZE

HOUR_MS = 3_600_000
HALF_LIFE_MS = 48 * HOUR_MS
WINDOW_MS = 14 * 24 * HOUR_MS  # a sample 14 days old weighs 2 ** -7: under 1 %
MAX_SAMPLES = 2000  # per scope, the newest
PERCENTILE = 0.98
MARGIN = 0.10
# With a budget (a run's size, ``recommend(budget=...)``) the percentile rule keeps no margin of its
# own: the budget a run sends already sits a margin under its limit (the auto budget: 10 % of the
# limit, at least 256 MiB, at most 10 GiB: policy/budget.py), and a second one here left small
# runs more slack than a VPA-like sizer's (issue 36, item 3: one margin, said once).
BUDGET_MARGIN = 0.0
OOM_BUMP = 1.3
MIN_SAMPLES = 3
MIN_PER_JOB = 1 << 20  # a learned size is never below 1 MiB (a job that rose 0 bytes still needs some)
CONFIDENCE_K = 5.0
# The size for a budget (``recommend(budget=...)``): the run's jobs' peaks add up, so the room a
# run needs over the sum of its means grows as sqrt(n), not as n (below).
RUN_Z = 4.0  # standard deviations of a run's sum kept free: about 3 in 100,000 runs over, if normal
SPREAD_CONFIDENCE_Z = 1.645  # the spread used is its one-sided 95 % upper bound (chi-square)
SPREAD_MIN = 10  # samples of the node's or its class's before the spread is trusted
SPREAD_MIN_JOBS = 8  # fewer jobs a run: the size for a budget only guards the percentile rule's (few: not normal)
# The standard normal's 95th percentile (NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.1,
# "Cumulative Distribution Function of the Standard Normal Distribution": 0.95 at z = 1.645).
P95_Z = 1.6449
# No one node moves its class (issue 36, item 2): in a class's or the fleet's samples each node's
# summed weight is capped at the heaviest other node's, and a figure (the size, the baseline, the
# size for a budget, the P95 forecast) is at most BOUNDS' factor times the same figure without the
# k nodes whose absence lowers it most (greedily, one by one), where the scope has at least
# that many nodes: one node moves it by at most 25 % (any count of nodes from 2), two by at most
# 50 % (from 5 nodes). A floor from a failure is not bounded so (one kill is the lesson, item 1);
# the manager checks its sizes against the node's own report instead.
BOUNDS: tuple[tuple[int, int, float], ...] = ((1, 2, 1.25), (2, 5, 1.50))  # (k nodes out, nodes at least, factor)
CANDIDATES = 12  # the nodes tried for each leave-out: those with the largest peaks
Source = RecommendationSource  # the scope an answer came from: oomguard._types, recommendation.schema.json
_NOT_IN_CLASS = re.compile(r"[^A-Za-z0-9._+-]+")


@dataclass(frozen=True)
class Sample:
    """One observation, as the rule reads it (sizes in bytes, times epoch ms on the manager's clock)."""

    node: str
    node_class: str
    received_ms: int
    declared_per_job: int
    peak_per_job: int
    declared_baseline: int
    peak_baseline: int | None  # None: not measured
    concurrency: int
    outcome: str  # one of oomguard._types.OUTCOMES
    # A failure the node's own supervisor's exit event shows (store/claims.py); only such a one
    # raises a floor. An unconfirmed one is a sample like any other, bounded as they are.
    confirmed: bool = True


def derive_class(gpus: Any, host_total_bytes: int | None) -> str:
    """The class of a node without an operator's label: its GPU model (the most common name among
    its GPUs; ``cpu`` without one) and its host RAM to the nearest power of two GiB (``ram:unknown``
    unknown)."""
    names = [g.get("name") for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []
    named = [n for n in names if isinstance(n, str) and n.strip()]
    model = "cpu"
    if named:
        top = Counter(named).most_common(1)[0][0]
        model = "gpu:" + (_NOT_IN_CLASS.sub("-", top.strip()).strip("-")[:40] or "unknown")
    ram = "ram:unknown"
    if isinstance(host_total_bytes, int) and host_total_bytes > 0:
        ram = f"ram:{2 ** max(0, round(math.log2(host_total_bytes / 2**30)))}GiB"
    return f"{model}/{ram}"


def weight(age_ms: int) -> float:
    """A sample's weight at *age_ms* (a sample from the future, by a skewed clock, weighs 1)."""
    return float(2.0 ** (-max(0, age_ms) / HALF_LIFE_MS))


def weighted_percentile(values: Sequence[tuple[int, float]], q: float) -> int | None:
    """The smallest value whose cumulative weight reaches *q* of the total: (value, weight) pairs;
    None for none (or only weightless ones)."""
    total = sum(w for _, w in values if w > 0)
    if total <= 0:
        return None
    running = 0.0
    ordered = sorted((v, w) for v, w in values if w > 0)
    for value, w in ordered:
        running += w
        if running >= q * total * (1 - 1e-12):
            return value
    return ordered[-1][0]


Weighted = list[tuple[Sample, float]]


def weighed(now_ms: int, samples: Sequence[Sample], *, per_node_cap: bool) -> Weighted:
    """(sample, weight) pairs, each its age's weight; with *per_node_cap* (a class's or the
    fleet's samples) ``capped``."""
    pairs = [(s, weight(now_ms - s.received_ms)) for s in samples]
    return capped(pairs) if per_node_cap else pairs


def capped(pairs: Weighted) -> Weighted:
    """*pairs* with each node's summed weight at most the heaviest other node's, its samples
    scaled alike: one node posting many observations weighs no more than the busiest other."""
    sums: dict[str, float] = {}
    for s, w in pairs:
        sums[s.node] = sums.get(s.node, 0.0) + w
    if len(sums) < 2:
        return pairs
    top = sorted(sums.values(), reverse=True)
    scale = {node: min(1.0, top[1] / total) if total == top[0] and total > 0 else 1.0 for node, total in sums.items()}
    return [(s, w * scale[s.node]) for s, w in pairs]


def bounded(
    figure: Any,
    pairs: Weighted,
    said: list[str] | None = None,
    what: str = "the size",
    rank: Any = lambda s: s.peak_per_job,
) -> Any:
    """*figure* (a function of (sample, weight) pairs giving an int, or a tuple whose first item is
    the int) over *pairs* (their ages' weights, ``capped`` here), bounded in how far one node, or
    two, can move it (``BOUNDS``): at most the factor times the figure without the nodes whose
    absence lowers it most (tried among the ``CANDIDATES`` nodes of largest *rank*: the per-job
    peak), each figure over the others' samples ``capped`` anew, so that the figure without a node
    is the one its class would have had without it. Said in *said* where a bound holds it."""
    full = figure(capped(pairs))
    value = full[0] if isinstance(full, tuple) else full
    nodes = {s.node for s, _ in pairs}
    if len(nodes) < 2:
        return full
    if value is None:  # none fits with them all: as if infinitely large, so bounded by the rest's
        value = MAX_SIZE
    rest, out = list(pairs), []
    held: tuple[int, Any] | None = None
    for k, at_least, factor in BOUNDS:
        if len(nodes) < at_least:
            break
        peaks: dict[str, int] = {}
        for s, _ in rest:
            peaks[s.node] = max(peaks.get(s.node, 0), rank(s) or 0)
        best: tuple[int, str, Any] | None = None
        for node in sorted(peaks, key=lambda n: peaks[n], reverse=True)[:CANDIDATES]:
            without = figure(capped([(s, w) for s, w in rest if s.node != node]))
            v = without[0] if isinstance(without, tuple) else without
            if v is not None and (best is None or v < best[0]):
                best = (v, node, without)
        if best is None:
            break
        out.append(best[1])
        rest = [(s, w) for s, w in rest if s.node != best[1]]
        cap = min(MAX_SIZE, math.ceil(best[0] * factor))
        if cap < value and (held is None or cap < held[0]):
            held = (cap, best[2])
            if said is not None:
                said.append(
                    f"{what} {value} bytes is held at {cap} bytes: {factor:g} x its {best[0]} bytes without "
                    f"{', '.join(out)} ({'one node moves' if k == 1 else f'{k} nodes move'} it by at most "
                    f"{round((factor - 1) * 100)} %)"
                )
    if held is None:
        return full
    cap, without = held  # a tuple's other items are those of the figure without the nodes
    return (cap, *without[1:]) if isinstance(without, tuple) else cap


def floor_of(samples: Sequence[Sample]) -> tuple[int, Sample | None]:
    """(The per-job floor the confirmed failures among *samples* raise, 0 for none; the failure
    that set it)."""
    best, why = 0, None
    for s in samples:
        if s.outcome in FAILURES and s.confirmed:
            raised = min(MAX_SIZE, math.ceil(max(s.declared_per_job, s.peak_per_job) * OOM_BUMP))
            if raised > best:
                best, why = raised, s
    return best, why


@dataclass(frozen=True)
class Recommendation:
    per_job_bytes: int | None
    baseline_bytes: int | None
    source: Source
    samples: int
    confidence: float
    updated_ms: int | None  # the newest sample's receive time
    declared_per_job_bytes: int | None
    declared_baseline_bytes: int | None
    floor_bytes: int
    explanation: list[str]
    peak_p95_per_job_bytes: int | None = None  # one job's peak, its 95th percentile estimated
    peak_p95_source: Source | None = None  # the scope that estimate came from
    peak_p95_explanation: str = ""  # how it was estimated, or why it is not

    def as_json(self, iso: Any) -> dict[str, Any]:
        return {
            "per_job_bytes": self.per_job_bytes,
            "baseline_bytes": self.baseline_bytes,
            "source": self.source,
            "samples": self.samples,
            "confidence": self.confidence,
            "updated": None if self.updated_ms is None else iso(self.updated_ms),
            "declared_per_job_bytes": self.declared_per_job_bytes,
            "declared_baseline_bytes": self.declared_baseline_bytes,
            "floor_bytes": self.floor_bytes,
            "peak_p95_per_job_bytes": self.peak_p95_per_job_bytes,
            "peak_p95_source": self.peak_p95_source,
            "peak_p95_explanation": self.peak_p95_explanation,
            "explanation": self.explanation,
        }


def spread_bound(samples: float) -> float:
    """How much larger than a standard deviation read from *samples* (an effective count: Kish's,
    (sum of weights)^2 / sum of squared weights) the true one may be, at one-sided 95 %:
    sqrt(k / chi2_0.05(k)) with k = samples - 1 degrees of freedom, the chi-square quantile by the
    Wilson-Hilferty approximation, k (1 - 2/(9k) - z sqrt(2/(9k)))^3 with z = 1.645 (NIST/SEMATECH
    e-Handbook of Statistical Methods, 7.2.3.1, "Chi-square test for the standard deviation").
    About 1.46 at 15 samples, 1.25 at 36, 1.13 at 100."""
    k = max(1.0, samples - 1)
    root = 1 - 2 / (9 * k) - SPREAD_CONFIDENCE_Z * math.sqrt(2 / (9 * k))
    if root <= 0:
        return 10.0  # too few samples for the approximation: far wider
    return min(10.0, math.sqrt(k / (k * root**3)))


def run_moments(weighted: Sequence[tuple[Sample, float]]) -> tuple[float, float, float, int] | None:
    """(m, d, effective count, runs): one job's mean peak and standard deviation, read from the
    runs that ended well among *weighted* (sample, weight) pairs; None with fewer than
    ``SPREAD_MIN`` of them.

    Each such sample is one run's mean per-job peak over its ``concurrency`` jobs (a failed run's
    peak is only a lower bound of its mean, and is left out). With the jobs' peaks independent,
    of mean m and standard deviation d, a run of n jobs has a mean of m that varies by
    d / sqrt(n): so m is the samples' weighted mean and d^2 the weighted mean of n (x - m)^2.
    The effective count is Kish's, (sum of weights)^2 / sum of squared weights."""
    usable = [(s, w) for s, w in weighted if s.outcome == "ok" and s.concurrency > 0 and w > 0]
    total = sum(w for _, w in usable)
    if len(usable) < SPREAD_MIN or total <= 0:
        return None
    mean = sum(s.peak_per_job * w for s, w in usable) / total
    if mean <= 0:
        return None
    seen = math.sqrt(sum(s.concurrency * (s.peak_per_job - mean) ** 2 * w for s, w in usable) / total)
    return mean, seen, total**2 / sum(w * w for _, w in usable), len(usable)


def per_run_size(weighted: Sequence[tuple[Sample, float]], room: int) -> tuple[int, int, float, float] | None:
    """The per-job size that fills *room* (the budget less the baseline) with the most jobs whose
    summed peaks stay under it by ``RUN_Z`` standard deviations: (size, jobs, mean, spread), or
    None when the samples are too few or the run too small for it.

    A run of n jobs sums to n m with a standard deviation of d sqrt(n) (``run_moments``); d is
    taken at its upper bound (``spread_bound``): a spread read low from a few runs, and runs whose
    sums passed the room being left out as failures, would both shrink the room kept. The most
    jobs n with n m + RUN_Z d sqrt(n) <= room is the square of the positive root of
    m s^2 + RUN_Z d s - room; the size is just over room / (n + 1), so ``room // size`` is n. Where
    the jobs' peaks are correlated (one input shared by every job of a run) the sum varies more
    than this, and the rule's kills tell it (the floor still holds). Below ``SPREAD_MIN_JOBS`` a
    sum of a few heavy-tailed peaks is far from normal, and the caller takes this size only where
    it asks more than the percentile rule. None where not one job fits.
    """
    moments = run_moments(weighted)
    if moments is None or room <= 0:
        return None
    mean, seen, effective, _ = moments
    spread = seen * spread_bound(effective)
    root = (-RUN_Z * spread + math.sqrt((RUN_Z * spread) ** 2 + 4 * mean * room)) / (2 * mean)
    jobs = math.floor(root * root)
    if jobs < 1:
        return None
    return room // (jobs + 1) + 1, jobs, mean, spread


def job_p95(weighted: Sequence[tuple[Sample, float]]) -> tuple[int, float, float, int] | None:
    """One job's peak, its 95th percentile estimated (``run_moments``): (``gamma_p95(m, d)``, m,
    d, runs), or None with too few runs that ended well. The percentile of the gamma law of the
    jobs' own mean and spread, which runs of many jobs hide from a percentile of their means: a
    forecast of what one job of the scope reaches, not a size to plan at (that keeps its margin
    and floor)."""
    moments = run_moments(weighted)
    if moments is None:
        return None
    mean, seen, _, runs = moments
    return min(MAX_SIZE, math.ceil(gamma_p95(mean, seen))), mean, seen, runs


def gamma_p95(mean: float, spread: float) -> float:
    """The 95th percentile of the gamma law of *mean* and standard deviation *spread* (shape
    k = (mean / spread)^2), by Wilson and Hilferty's cube root: mean (1 - 1/(9k) + z / (3 sqrt(k)))^3
    with z = ``P95_Z`` (E. B. Wilson, M. M. Hilferty, "The distribution of chi-square", PNAS 17,
    1931; NIST/SEMATECH e-Handbook 7.2.3.1 uses it for chi-square, a gamma). Memory peaks are
    positive and skewed to the right: the normal's m + 1.645 d read a gamma's or a Weibull's P95
    9-12 % low, this within 1-2 % on average (issue 36, from 200-400 runs of 1-16 jobs), and
    +3 % on a lognormal with a 1 % tail at twice the size. Under 1 % off the exact gamma from
    k = 1 (exponential: -0.9 %); it tends to the normal's as k grows. No spread: the mean."""
    if spread <= 0 or mean <= 0:
        return max(0.0, mean)
    k = (mean / spread) ** 2
    root = 1 - 1 / (9 * k) + P95_Z / (3 * math.sqrt(k))
    return float(mean * max(0.0, root) ** 3)


def _grown(value: int | None, margin: float = MARGIN) -> int | None:
    return None if value is None else min(MAX_SIZE, math.ceil(value * (1 + margin)))


def _job_size(pairs: Weighted, margin: float = MARGIN) -> int | None:
    """The percentile rule's per-job size over *pairs*: the weighted P98 of the peaks + *margin*."""
    return _grown(weighted_percentile([(s.peak_per_job, w) for s, w in pairs], PERCENTILE), margin)


def _plain_size(pairs: Weighted) -> int | None:
    """The percentile rule's per-job size with ``BUDGET_MARGIN``: for a small run's budget."""
    return _job_size(pairs, BUDGET_MARGIN)


def _baseline_size(pairs: Weighted) -> int | None:
    """The same over the baselines measured; None without one."""
    return _grown(
        weighted_percentile([(s.peak_baseline, w) for s, w in pairs if s.peak_baseline is not None], PERCENTILE)
    )


def recommend(
    now_ms: int,
    node: str | None,
    node_class: str | None,
    samples: Sequence[Sample],
    iso: Any = str,
    *,
    budget: int | None = None,
    memo: dict[str, Any] | None = None,
) -> Recommendation:
    """The recommendation for *node* of class *node_class* (either may be None: unknown) from every
    sample of the profile in the window (*samples*: any order; the rule above). *iso* words a time.
    With *budget* (the node's budget for the profile's run), the per-job size is ``per_run_size``'s
    over the node's or its class's samples where they know the spread, in place of the percentile
    rule's. *memo*: a dict shared by calls with the same *now_ms* and *samples* (a page's classes,
    /metrics' pairs of one profile), which keeps the fleet scope's figures, the same for every
    class: computed once, not once a class (issue 37, item 2)."""
    live = _kept(memo, "live", [], lambda: _live(now_ms, samples))
    scopes: list[tuple[Source, str, list[Sample]]] = [
        ("node", f"node {node}", [s for s in live if node is not None and s.node == node][:MAX_SAMPLES]),
        ("class", f"class {node_class}", [s for s in live if node_class is not None and s.node_class == node_class]),
        ("fleet", "the fleet", live),
    ]
    in_class = scopes[1][2] if node_class is not None else scopes[0][2]
    floor, why = floor_of(in_class)
    doubted = sum(1 for s in in_class if s.outcome in FAILURES and not s.confirmed)
    declared_job = live[0].declared_per_job if live else None  # the newest run's
    declared_base = live[0].declared_baseline if live else None
    said: list[str] = []
    if doubted:
        said.append(
            f"{doubted} failed run(s) not confirmed by an exit event of their node's supervisor: samples, not a floor"
        )
    source: Source = "declared"
    job, base, n_eff, used = declared_job, declared_base, 0.0, []
    for scope, name, found in scopes:
        if len(found) < MIN_SAMPLES:
            said.append(f"{name}: {len(found)} sample(s) in the last 14 days, fewer than {MIN_SAMPLES}")
            continue
        used = found[:MAX_SAMPLES]
        kept = memo if scope == "fleet" else None
        raw = _kept(kept, "raw", [], lambda u=used: weighed(now_ms, u, per_node_cap=False))
        weighted = raw if scope == "node" else _kept(kept, "capped", [], lambda r=raw: capped(r))
        n_eff = sum(w for _, w in weighted)
        if scope == "node":  # its own samples: no other node to bound it by
            job, measured_base = _job_size(raw), _baseline_size(raw)
        else:
            job = _kept(kept, "job", said, lambda r=raw: bounded(_job_size, r, said, "the per-job size"))
            measured_base = _kept(
                kept,
                "baseline",
                said,
                lambda r=raw: bounded(_baseline_size, r, said, "the baseline", rank=lambda x: x.peak_baseline),
            )
        job = max(MIN_PER_JOB, job or 0)
        measured = _kept(kept, "measured", [], lambda p=weighted: any(s.peak_baseline is not None for s, _ in p))
        base = measured_base if measured else declared_base
        said.append(
            f"{name}: the weighted P{round(PERCENTILE * 100)} of {len(used)} sample(s) (half-life 48 h) "
            f"+ {round(MARGIN * 100)} %: per job {job} bytes, "
            + (f"baseline {base} bytes" if measured else f"baseline not measured: the declared {base} bytes")
        )
        if budget is not None and base is not None and 0 < (budget - base) // job < SPREAD_MIN_JOBS:
            # A small run (fewer than SPREAD_MIN_JOBS jobs): its budget keeps the one margin.
            plain = (
                _job_size(raw, BUDGET_MARGIN)
                if scope == "node"
                else _kept(memo if scope == "fleet" else None, "plain", said, lambda r=raw: bounded(_plain_size, r))
            )
            if plain is not None and plain < job:
                job = max(MIN_PER_JOB, plain)
                said.append(
                    f"a run of fewer than {SPREAD_MIN_JOBS} jobs: the P{round(PERCENTILE * 100)} + "
                    f"{round(BUDGET_MARGIN * 100)} %, {job} bytes: the budget already keeps its margin under the limit"
                )
        source = scope
        break
    else:
        said.append("no scope has enough samples: the size declared" + ("" if live else " (none observed)"))
    if budget is not None and job is not None and base is not None and source in ("node", "class"):
        sized = _for_budget(now_ms, scopes, budget - base, job, said)
        # Only a size below the percentile rule's releases the floor: where the runs are so wide
        # that their sum needs more, a floor one of them set stays.
        if sized is not None and sized < job and why is not None and floor > sized:
            since = sum(1 for s in in_class if s.outcome == "ok" and s.received_ms > why.received_ms)
            if since >= SPREAD_MIN:  # the floor has done its work: the runs since measure the jobs
                said.append(
                    f"the floor {floor} bytes ({why.outcome} on {why.node} at {iso(why.received_ms)}) is "
                    f"released: {since} runs ended well since, at least {SPREAD_MIN}"
                )
                floor = 0
        job = sized if sized is not None else job
    if job is not None and floor > job:
        said.append(_floor_words(floor, why, iso))
        job = floor
        if source == "declared":  # a lesson from the first kill: never left as "declared" (issue 36)
            source = "floor"
    if budget is not None and job is not None and base is not None:
        names = {"node": f"node {node}", "class": f"class {node_class}", "fleet": "the fleet"}
        mine = f"class {node_class}" if node_class is not None else f"node {node}"
        scope_name = names.get(source, "")
        job = _held_at_room(now_ms, (in_class, mine), (used, scope_name), room=budget - base, job=job, said=said)
    p95, p95_source, p95_words = _forecast(now_ms, scopes, memo)
    return Recommendation(
        per_job_bytes=job,
        baseline_bytes=base,
        source=source,
        samples=len(used),
        confidence=round(n_eff / (n_eff + CONFIDENCE_K), 3),
        updated_ms=max((s.received_ms for s in (used or live)), default=None),
        declared_per_job_bytes=declared_job,
        declared_baseline_bytes=declared_base,
        floor_bytes=floor,
        explanation=said,
        peak_p95_per_job_bytes=p95,
        peak_p95_source=p95_source,
        peak_p95_explanation=p95_words,
    )


def _live(now_ms: int, samples: Sequence[Sample]) -> list[Sample]:
    """*samples* in the window, the newest first."""
    return sorted(
        (s for s in samples if now_ms - s.received_ms <= WINDOW_MS), key=lambda s: s.received_ms, reverse=True
    )


def _kept(memo: dict[str, Any] | None, key: str, said: list[str], compute: Any) -> Any:
    """*compute*() and the lines it added to *said*, kept in *memo* under *key* (None: no memo),
    or what *memo* kept: the lines are said again."""
    if memo is not None and key in memo:
        value, lines = memo[key]
        said.extend(lines)
        return value
    start = len(said)
    value = compute()
    if memo is not None:
        memo[key] = (value, said[start:])
    return value


def _forecast(
    now_ms: int, scopes: Sequence[tuple[Source, str, list[Sample]]], memo: dict[str, Any] | None = None
) -> tuple[int | None, Source | None, str]:
    """One job's P95 peak (``job_p95``) from the first scope, the node's, its class's or the
    fleet's, with ``SPREAD_MIN`` runs that ended well, its scope and how; (None, None, why) where
    none has. *memo*: ``recommend``'s."""
    for scope, name, found in scopes:
        kept = memo if scope == "fleet" else None
        pairs = _kept(kept, "raw", [], lambda f=found: weighed(now_ms, f[:MAX_SAMPLES], per_node_cap=False))
        estimate = job_p95(pairs) if scope == "node" else _kept(kept, "p95", [], lambda p=pairs: bounded(job_p95, p))
        if estimate is None:
            continue
        p95, mean, spread, runs = estimate
        words = (
            f"from {name}'s {runs} runs that ended well: mean per-job peak {round(mean)} bytes and one job's "
            f"spread {round(spread)} (a run of n jobs varies by it / sqrt(n)); the P95 of the gamma law of that "
            "mean and spread, "
            "a forecast, not the size planned at"
        )
        return p95, scope, words
    return None, None, f"no scope has {SPREAD_MIN} runs that ended well to estimate it from"


def _for_budget(
    now_ms: int, scopes: Sequence[tuple[Source, str, list[Sample]]], room: int, job: int, said: list[str]
) -> int | None:
    """The per-run size (``per_run_size``) from the node's samples, else its class's, above or
    below the percentile rule's *job* (below it only from ``SPREAD_MIN_JOBS`` jobs a run); None
    when neither scope knows the spread, or the size for fewer jobs would be the smaller."""
    for scope, name, found in scopes:
        if scope == "fleet":
            break
        pairs = weighed(now_ms, found[:MAX_SAMPLES], per_node_cap=False)
        if scope == "node":
            sized = per_run_size(pairs, room)
        else:
            sized = bounded(lambda p: per_run_size(p, room), pairs, said, "the size for the room")
        if sized is None:
            continue
        size, jobs, mean, spread = sized
        jobs = room // size  # per_run_size's size fits its jobs exactly; a bound's size fits more
        words = (
            f"for {room} bytes of room: {name}'s mean per-job peak {round(mean)} bytes, spread {round(spread)}, "
            f"{jobs} job{'' if jobs == 1 else 's'} with {RUN_Z:g} spreads x sqrt({jobs}) free: {size} bytes a job"
        )
        if size >= job:  # wide runs: the sum needs more room than the percentile rule leaves
            said.append(words + f", above the percentile rule's {job} bytes: the larger is taken")
        elif jobs < SPREAD_MIN_JOBS:  # a sum of a few heavy-tailed peaks is far from normal: it only guards
            said.append(
                words + f"; fewer than {SPREAD_MIN_JOBS} jobs a run, where it is taken only above the percentile "
                f"rule's: {job} bytes stands"
            )
            return None
        else:
            said.append(words)
        return max(MIN_PER_JOB, size)
    said.append(f"for {room} bytes of room: no scope with {SPREAD_MIN} samples for the spread; the percentile rule's")
    return None


def _held_at_room(
    now_ms: int,
    in_class: tuple[Sequence[Sample], str],
    used: tuple[Sequence[Sample], str],
    *,
    room: int,
    job: int,
    said: list[str],
) -> int:
    """*job*, or the whole *room* (one job a run) where *job* is above the room but the evidence
    says the jobs fit it: the class's own samples (*in_class*: the samples and their scope's name,
    however few), or with none the samples the size came from (*used*), have their weighted P98
    per-job peak within the room, and their failed runs of one job (one job larger than a room)
    weigh at most the 2 % the percentile leaves above it. A size above the room then comes from a
    margin or a floor over jobs that fit: the 10 % margin over the P98, a floor a tail job set (a
    run of one job killed raises it to 1.3 x the room), or the fleet's size from other classes'
    runs. Refusing every run for it would stop the 98 % that fit, for the whole window, and a
    class that never runs never learns its own. A job larger than the room is killed here, and
    its observation raises the class's floor; a class with few samples and one such failure has
    more than 2 % failed, and its size stands."""
    if job <= room or room < MIN_PER_JOB:
        return job
    evidence, name = in_class if in_class[0] else used
    weighted = weighed(now_ms, evidence[:MAX_SAMPLES], per_node_cap=True)
    total = sum(w for _, w in weighted)
    p98 = weighted_percentile([(s.peak_per_job, w) for s, w in weighted], PERCENTILE)
    # A failed run of several jobs says their sum passed a room, not that one job does: one job
    # a run is what a hold plans. Only runs of one job (or of an unknown count) that failed count.
    failed = sum(w for s, w in weighted if s.outcome in FAILURES and s.concurrency <= 1)
    if p98 is None or p98 > room or total <= 0 or failed / total > 1 - PERCENTILE:
        return job
    said.append(
        f"held at the room, {room} bytes (one job a run): the size {job} bytes is above it, but "
        f"{name}'s weighted P{round(PERCENTILE * 100)} per-job peak, {p98} bytes, fits it, and its failed "
        f"runs of one job weigh {failed / total:.1%} of its {len(weighted)} sample(s), within {1 - PERCENTILE:.0%}; "
        "a job larger than the room will be "
        "OOM-killed here, and its observation raises the class's floor"
    )
    return room


def _floor_words(floor: int, why: Sample | None, iso: Any) -> str:
    if why is None:
        return f"raised to the floor, {floor} bytes"
    return (
        f"raised to the floor, {floor} bytes: {OOM_BUMP:g} x the {why.outcome} on {why.node} at "
        f"{iso(why.received_ms)} (ran at {why.declared_per_job} bytes per job, peak {why.peak_per_job})"
    )
