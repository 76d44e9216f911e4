"""oomguard: the memory a process may really use inside a container, and a budget that fits.

Public API (each name is loaded on first use, so ``oomguard check`` starts fast)::

    import oomguard
    report = oomguard.probe()                   # live system; or probe(root="snap.tar.gz")
    report["memory"]["effective_bytes"], report["budget"]["bytes"]
"""

from __future__ import annotations

from oomguard._version import __version__

__all__ = [
    "BadParameter",
    "LiveRoot",
    "MemoryBudget",
    "OomguardError",
    "Report",
    "Reservation",
    "ReservationTooLarge",
    "Root",
    "Shape",
    "SnapshotError",
    "ThresholdError",
    "UsageError",
    "Watch",
    "__version__",
    "capture",
    "format_size",
    "learned_shape",
    "make_plan",
    "open_root",
    "parse_size",
    "probe",
    "resolve_budget",
    "send_observation",
    "to_json",
]

_LAZY = {
    "probe": "policy.budget",
    "MemoryBudget": "runtime.reserve",
    "Reservation": "runtime.reserve",
    "ReservationTooLarge": "runtime.reserve",
    "Shape": "policy.plan",
    "make_plan": "policy.plan",
    "learned_shape": "agent.learned",
    "send_observation": "agent.learned",
    "resolve_budget": "policy.budget",
    "Report": "_types",
    "Root": "sources.root",
    "LiveRoot": "sources.root",
    "open_root": "sources.root",
    "capture": "probes.capture",
    "parse_size": "units",
    "format_size": "units",
    "to_json": "commands.render",
    "OomguardError": "errors",
    "UsageError": "errors",
    "BadParameter": "errors",
    "SnapshotError": "errors",
    "ThresholdError": "errors",
    "Watch": "runtime.watch",
}

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import Report
    from oomguard.agent.learned import learned_shape, send_observation
    from oomguard.commands.render import to_json
    from oomguard.errors import BadParameter, OomguardError, SnapshotError, ThresholdError, UsageError
    from oomguard.policy.budget import probe, resolve_budget
    from oomguard.policy.plan import Shape, make_plan
    from oomguard.probes.capture import capture
    from oomguard.runtime.reserve import MemoryBudget, Reservation, ReservationTooLarge
    from oomguard.runtime.watch import Watch
    from oomguard.sources.root import LiveRoot, Root, open_root
    from oomguard.units import format_size, parse_size


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'oomguard' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"oomguard.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
