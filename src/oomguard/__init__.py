"""oomguard: the memory a process may really use inside a container, and a budget that fits.

Public API (each name is loaded on first use, so ``oomguard check`` starts fast)::

    import oomguard
    report = oomguard.probe()                   # live system; or probe(root="snap.tar.gz")
    report["memory"]["effective_bytes"], report["budget"]["bytes"]
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
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
    "__version__",
    "capture",
    "format_size",
    "make_plan",
    "open_root",
    "parse_size",
    "probe",
    "resolve_budget",
    "to_json",
]

_LAZY = {
    "probe": "api",
    "MemoryBudget": "reserve",
    "Reservation": "reserve",
    "ReservationTooLarge": "reserve",
    "Shape": "plan",
    "make_plan": "plan",
    "resolve_budget": "budget",
    "Report": "_types",
    "Root": "root",
    "LiveRoot": "root",
    "open_root": "root",
    "capture": "snapshot",
    "parse_size": "units",
    "format_size": "units",
    "to_json": "render",
    "OomguardError": "errors",
    "UsageError": "errors",
    "SnapshotError": "errors",
    "ThresholdError": "errors",
}

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._types import Report
    from .api import probe
    from .budget import resolve_budget
    from .errors import OomguardError, SnapshotError, ThresholdError, UsageError
    from .plan import Shape, make_plan
    from .render import to_json
    from .reserve import MemoryBudget, Reservation, ReservationTooLarge
    from .root import LiveRoot, Root, open_root
    from .snapshot import capture
    from .units import format_size, parse_size


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
