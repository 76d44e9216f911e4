"""The manager's clock: times are integer epoch milliseconds inside (``*_ms`` columns).

Thin wrappers of the one ISO writer and reader in :mod:`oomguard.times`, so the database, the API
and the dashboard all speak "2026-11-30T19:37:18.123Z".
"""

from __future__ import annotations

import time

from oomguard.times import iso_from_epoch, parse_iso

HALF_MS = 0.0005  # iso_from_epoch truncates: half a millisecond more keeps ms/1000's float rounding harmless


def now_ms() -> int:
    return int(time.time() * 1000)


def iso_ms(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO 8601 UTC with milliseconds and ``Z``; None stays None."""
    return None if ms is None else iso_from_epoch(ms / 1000 + HALF_MS)


def parse_iso_ms(text: object) -> int | None:
    """Epoch milliseconds from an ISO 8601 time; None for anything else (never raises)."""
    t = parse_iso(text)
    return None if t is None else round(t * 1000)
