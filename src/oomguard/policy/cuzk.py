"""CuZK's own memory arithmetic: what the prover does with the ``total_budget`` it is given.

CuZK (Filecoin Curio's GPU prover, ``extern/cuzk`` of filecoin-project/curio, read at commit
e0294b0) keeps one budget for everything: ``[memory] total_budget`` in its TOML config. Its rules,
with the lines they come from:

- ``total_budget`` is a string. ``"auto"`` (the default) is /proc/meminfo MemTotal minus
  ``safety_margin`` (default ``"5GiB"``); an explicit value is used as written, the margin not
  subtracted (cuzk-core/src/config.rs L57-108, ``resolve_total_budget`` L100-108).
- ``parse_size`` (config.rs L482-497) takes a whole number followed by GiB, MiB, GB or MB, or plain
  bytes; anything else silently becomes 50 GiB (0 after MiB or MB). Writing the value into CuZK's
  config, and reading an operator's, is ``run``'s (``supervisor/cuzk.py``, which ports
  ``parse_size``); this module only counts.
- The SRS (Groth16 parameters, CUDA-pinned) and the PCE (pre-compiled circuits, heap) acquire
  their size from the same budget before they load (engine.rs L2187-2193 and L3638-3643 for the
  SRS; cuzk-memory-manager.md L82 and L122-124: "One budget covers everything: SRS (pinned), PCE
  (heap), and working set (heap)").
- Each partition acquires its FULL estimate before synthesis (cuzk-memory-manager.md L150-165):
  14 GiB PoRep and WindowPoSt, 0.5 GiB WinningPoSt, 9 GiB SnapDeals (memory.rs L35-57). An
  ``acquire`` larger than what is free waits, for ever if it can never fit (memory.rs L186-192).
- The synthesis workers: ``max_partitions_in_budget = total_budget / POREP_PARTITION_FULL_BYTES``
  (engine.rs L1413, the PoRep constant for every circuit), ``synth_worker_count =
  max_partitions_in_budget.min(max_parallel).max(2)`` with ``max_parallel_synthesis = 0`` meaning
  18 (engine.rs L1433-1437). The worker count does not subtract the SRS and PCE; the budget does.

So the partitions in flight at once are min(floor((total_budget - SRS - PCE) / per partition),
workers). The built-in profiles (``profiles.json``, ``"consumer": "cuzk"``) say CuZK's sizes:
``baseline`` = SRS + PCE (``baseline_parts``), ``per_job`` = one partition's FULL estimate.
Pure arithmetic, standard library only: ``plan`` shows it, and ``run`` may import it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard.policy.plan import Shape

CONSUMER = "cuzk"  # a profile's ``consumer`` that these rules apply to
GIB = 1 << 30
POREP_PARTITION_FULL_BYTES = 14 * GIB  # memory.rs L36: engine.rs L1413 sizes the workers by it
DEFAULT_MAX_PARALLEL = 18  # engine.rs L1435: max_parallel_synthesis = 0 means 18
MIN_WORKERS = 2  # engine.rs L1437: .max(2)


def workers(total_budget_bytes: int, max_parallel_synthesis: int = 0) -> int:
    """CuZK's synthesis worker count for *total_budget_bytes* (engine.rs L1413, L1433-1437):
    max(2, min(total_budget / 14 GiB, max_parallel)), max_parallel 18 when the setting is 0."""
    max_parallel = max_parallel_synthesis or DEFAULT_MAX_PARALLEL
    return max(min(total_budget_bytes // POREP_PARTITION_FULL_BYTES, max_parallel), MIN_WORKERS)


def partitions(total_budget_bytes: int, shape: Shape, max_parallel_synthesis: int = 0) -> int:
    """How many partitions CuZK synthesises at once with ``total_budget = total_budget_bytes``.

    *shape* gives CuZK's sizes: ``baseline`` (SRS + PCE, acquired from the budget first) and
    ``per_job`` (one partition's FULL estimate). min(floor((total_budget - baseline) / per_job),
    workers); 0 when the budget cannot hold the SRS, the PCE and one partition: CuZK then waits
    for ever rather than failing."""
    if total_budget_bytes < shape.baseline:
        return 0
    fit = (total_budget_bytes - shape.baseline) // shape.per_job
    return min(fit, workers(total_budget_bytes, max_parallel_synthesis))
