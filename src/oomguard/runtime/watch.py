"""Watched admission for ``MemoryBudget``: the group's working set, sampled, and the rule it feeds.

A ``Watch`` says what to sample and under which line to stay: a *sampler* (a callable that
returns the working set in bytes, or None when it cannot be read), the hard *ceiling* and
the *guard margin* under it. ``Watch.from_report`` builds one for this process's memory
cgroup; a test passes its own sampler, or a Root over a fake tree.

The working set is what the kernel will not give back without swapping or killing: usage
minus the inactive page cache, as the probe and kubelet compute it.
- v2 (Documentation/admin-guide/cgroup-v2.rst, "Memory Interface Files"): ``memory.current``
  ("the total amount of memory currently being used by the cgroup and its descendants")
  minus ``inactive_file`` of ``memory.stat``.
- v1 (Documentation/admin-guide/cgroup-v1/memory.rst, 5.2): ``memory.usage_in_bytes`` minus
  ``total_inactive_file`` ("total_<counter>: # hierarchical version of <counter>"), else the
  group's own ``inactive_file``.

The rule the samples feed is a pure decision, ``policy/admission.py`` (``Admission``); this
module is the machinery around it: what to sample (``Watch``) and the thread that samples.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from oomguard.policy.admission import MAX_OVERSHOOT
from oomguard.policy.budget import guard_margin
from oomguard.probes.counters import read_working_set
from oomguard.sources.root import LiveRoot, Root
from oomguard.units import format_size, parse_size_or_percent

if TYPE_CHECKING:
    from collections.abc import Callable

    from oomguard._types import Report

    Sampler = Callable[[], "int | None"]

__all__ = ["SamplerThread", "Watch", "read_working_set", "sample_once"]

DEFAULT_INTERVAL = 0.1  # seconds between samples


def _unknown() -> int | None:
    return None


def sample_once(watch: Watch) -> int | None:
    """One sample; a sampler that raises gives an unknown working set (None)."""
    try:
        return watch.sampler()
    except Exception:
        return None


class Watch:
    """What a watched ``MemoryBudget`` samples, every *interval* seconds, and the line it keeps under.

    *ceiling_bytes* is the hard ceiling (None: unknown, and admission falls back to reserved
    bytes only); *margin_bytes* the guard margin under it (default ``guard_margin``).
    *overshoot* is the ratio of real to declared sizes assumed from the start (>= 1);
    *learn* lets the samples raise it, after a warm-up of *warmup_bytes* released (default:
    the ceiling; see ``Admission``). *source* names what is sampled and *unknown_reason* why
    nothing can be (both for messages).
    """

    __slots__ = (
        "ceiling",
        "interval",
        "learn",
        "margin",
        "overshoot",
        "sampler",
        "source",
        "unknown_reason",
        "warmup_bytes",
    )

    def __init__(
        self,
        sampler: Sampler,
        ceiling_bytes: int | None,
        *,
        margin_bytes: int | None = None,
        interval: float = DEFAULT_INTERVAL,
        overshoot: float = 1.0,
        learn: bool = True,
        warmup_bytes: int | None = None,
        source: str = "sampler",
        unknown_reason: str | None = None,
    ) -> None:
        if ceiling_bytes is not None and (isinstance(ceiling_bytes, bool) or ceiling_bytes < 0):
            raise ValueError(f"ceiling_bytes must be a non-negative int or None, got {ceiling_bytes!r}")
        if margin_bytes is not None and (isinstance(margin_bytes, bool) or margin_bytes < 0):
            raise ValueError(f"margin_bytes must be a non-negative int or None, got {margin_bytes!r}")
        if not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        if not 1.0 <= overshoot <= MAX_OVERSHOOT:
            raise ValueError(f"overshoot must be from 1.0 to {MAX_OVERSHOOT}, got {overshoot!r}")
        if ceiling_bytes is not None:
            room = guard_margin(ceiling_bytes, margin_bytes)  # None: no room under the ceiling
            if room is None:  # no line to keep under: admit by reserved bytes only, and say why
                given = "default guard margin" if margin_bytes is None else f"guard margin {format_size(margin_bytes)}"
                what = "the " + given
                ceiling = format_size(ceiling_bytes)
                sampler, unknown_reason = _unknown, f"{what} leaves no room under the {ceiling} ceiling"
            margin_bytes = room
        self.sampler = sampler
        self.ceiling = ceiling_bytes
        self.margin = margin_bytes
        self.interval = float(interval)
        self.overshoot = float(overshoot)
        self.learn = learn
        self.warmup_bytes = warmup_bytes
        self.source = source
        self.unknown_reason = unknown_reason

    @property
    def limit(self) -> int | None:
        """ceiling - margin: the working set that admission keeps under (None: unknown)."""
        if self.ceiling is None:
            return None
        return max(0, self.ceiling - (self.margin or 0))

    @classmethod
    def from_report(
        cls, report: Report, root: Root, *, margin: int | str | None = None, interval: float = DEFAULT_INTERVAL
    ) -> Watch:
        """The memory cgroup whose limit binds (else this process's own) and the report's ceiling.

        *margin*: bytes, or text as for ``--margin`` (``"64MiB"``, ``"2%"`` of the ceiling).
        Raises ``UsageError`` for bad text.
        """
        mem = report["memory"]
        cg, ceiling = mem["cgroup"], mem["effective_bytes"]
        margin_bytes = _margin(margin, ceiling)
        version, group = cg["version"], cg["dir"]
        if cg["limit_file"] is not None and mem["limited_by"] == f"cgroup-v{version}":
            group = cg["limit_file"].rpartition("/")[0]  # a charge fails at the level that binds
        why = None
        if version is None or group is None:
            why = "this process's memory cgroup was not found"
        elif ceiling is None:
            why = "the memory ceiling is unknown"
        if why is not None or version is None or group is None:
            return cls(_unknown, None, interval=interval, source="memory cgroup", unknown_reason=why)
        return cls(
            _group_sampler(root, group, version),
            ceiling,
            margin_bytes=margin_bytes,
            interval=interval,
            source=f"{group} (cgroup v{version})",
            unknown_reason=f"the working set of {group} cannot be read",
        )

    @classmethod
    def live(cls, *, margin: int | str | None = None, interval: float = DEFAULT_INTERVAL) -> Watch:
        """``from_report`` over a probe of the live system (no GPU probe)."""
        from oomguard.policy.budget import probe

        root = LiveRoot()
        return cls.from_report(probe(root, gpu=False), root, margin=margin, interval=interval)

    def __repr__(self) -> str:
        return f"<Watch {self.source}: keep under {format_size(self.limit)} every {self.interval} s>"


def _margin(margin: int | str | None, ceiling: int | None) -> int | None:
    if margin is None or isinstance(margin, int):
        return margin
    size, pct = parse_size_or_percent(margin, "guard margin")
    if pct is None:
        return size
    return None if ceiling is None else int(ceiling * pct / 100)


def _group_sampler(root: Root, group: str, version: int) -> Sampler:
    def sample() -> int | None:
        return read_working_set(root, group, version)

    return sample


class _Observer(Protocol):
    def _observe(self, ws: int | None) -> None: ...


class SamplerThread:
    """The daemon thread that feeds *budget* a sample every ``watch.interval`` seconds, or at
    once when poked (a release with requests waiting: usage may just have fallen).

    It holds only a weak reference to the budget: it ends on ``stop()`` (``close()``) or when
    the budget is garbage collected (a finalizer calls ``stop``).
    """

    def __init__(self, budget: _Observer, watch: Watch) -> None:
        self._wake = threading.Event()
        self.stopped = False
        weakref.finalize(budget, self.stop)
        ref = weakref.ref(budget)
        self.thread = threading.Thread(target=self._loop, args=(ref, watch), name="oomguard-watch", daemon=True)
        self.thread.start()

    def poke(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self.stopped = True
        self._wake.set()

    def close(self) -> None:
        """Stop, and wait for the thread to end (unless called from it)."""
        self.stop()
        if self.thread is not threading.current_thread():
            self.thread.join()

    def _loop(self, ref: weakref.ref[Any], watch: Watch) -> None:
        while True:
            self._wake.wait(watch.interval)
            self._wake.clear()
            if self.stopped:
                return
            ws = sample_once(watch)
            budget = ref()
            if budget is None:
                return
            budget._observe(ws)
            del budget
