"""Times as text: ISO 8601 UTC with milliseconds and a ``Z`` ("2026-11-30T19:37:18.123Z").

One writer and one reader for the supervisor's events, the agent's reports and the manager.
"""

from __future__ import annotations

import time


def iso_from_epoch(t: float) -> str:
    """Seconds since the epoch as ISO 8601 UTC with milliseconds (truncated) and ``Z``."""
    ms = int(t * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def iso_now() -> str:
    return iso_from_epoch(time.time())


def parse_iso(text: object) -> float | None:
    """Seconds since the epoch from an ISO 8601 time (``Z`` or an offset; no offset is UTC).

    Anything else (not text, NUL bytes, out of range, not a time) is None: never raises.
    """
    if not isinstance(text, str) or not text or len(text) > 64:
        return None
    from datetime import datetime, timezone

    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return dt.timestamp()
    except (ValueError, OverflowError, OSError):
        return None
