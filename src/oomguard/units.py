"""Sizes: parse what people type, print in binary units.

Parsing avoids ``re`` on purpose: ``oomguard check`` must start fast, and
importing ``re`` alone costs more than the whole probe (see docs/architecture.md).
"""

from __future__ import annotations

from oomguard.errors import UsageError

KiB = 1024
MiB = KiB * 1024
GiB = MiB * 1024
TiB = GiB * 1024
PiB = TiB * 1024

# Case-insensitive unit suffixes. Single letters and the IEC forms are binary;
# the SI forms with a B (KB, MB, ...) are decimal, as on a disk label.
_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "kb": 1000,
    "m": MiB,
    "mib": MiB,
    "mb": 1000**2,
    "g": GiB,
    "gib": GiB,
    "gb": 1000**3,
    "t": TiB,
    "tib": TiB,
    "tb": 1000**4,
    "p": PiB,
    "pib": PiB,
    "pb": 1000**5,
}

_NUMBER_CHARS = frozenset("0123456789.")

# The largest size and duration any flag, variable or profile takes; the one definition (docs/cli.md,
# "Sizes and durations"). A size fits a signed 64-bit count, as every length it reaches does: C's
# ssize_t in mmap(2) and mlock(2) (Python raises OverflowError above it), the kernel's memory
# counters, PostgreSQL's bigint. Ten years is far above any interval, backoff or hold, and keeps each
# wait in range: Python docs, threading.TIMEOUT_MAX (9,223,372,036 s on Linux): "Specifying a timeout
# greater than this value will raise an OverflowError"; ``time.sleep`` has the same bound. (A
# poll(2) timeout is an int of milliseconds, 24.8 days at most: waits longer than that are cut into
# slices where they poll.)
MAX_SIZE = 2**63 - 1
MAX_SIZE_TEXT = "2^63-1 bytes"
MAX_DURATION = 3650 * 86400.0  # ten years: "3650d"
MAX_DURATION_TEXT = "3650d"


def parse_size(text: str, what: str = "size") -> int:
    """Parse ``"1.5GiB"``, ``"512M"``, ``"4GB"`` or ``"123"`` into bytes, at most ``MAX_SIZE``.

    Raises ``UsageError`` naming *what* (a flag or variable) on anything else.
    """
    value = _size(text, what)
    if value > MAX_SIZE:
        raise UsageError(f"{what}: {text.strip()!r} is too large (at most {MAX_SIZE_TEXT})")
    return value


def _size(text: str, what: str) -> int:
    """``parse_size`` without the maximum (``format_size_precise`` reads back any size it prints)."""
    s = text.strip().replace("_", "")
    if s.startswith("-") and s[1:2].isdigit():
        raise UsageError(f"{what}: {text.strip()} is negative (a size is 0 or more)")
    i = 0
    while i < len(s) and s[i] in _NUMBER_CHARS:
        i += 1
    number, unit = s[:i], s[i:].strip().lower()
    factor = _UNITS.get(unit)
    if not number or len(number) > 30 or number.count(".") > 1 or number == "." or factor is None:
        raise UsageError(f"{what}: invalid size {text!r} (use e.g. 512MiB, 8G, 1.5GiB, 4GB or a byte count)")
    if "." in number:
        whole, _, frac = number.partition(".")
        # Exact arithmetic: 0.1 GiB must not turn into 107374182.40000001 bytes.
        scale: int = 10 ** len(frac)
        value = int(whole or "0") * factor + int(frac or "0") * factor // scale
    else:
        value = int(number) * factor
    return value


def parse_size_or_percent(text: str, what: str) -> tuple[int | None, float | None]:
    """Return ``(bytes, None)`` for a size or ``(None, percent)`` for ``"80%"``."""
    s = text.strip()
    if s.endswith("%"):
        num = s[:-1].strip()
        try:
            pct = float(num)
        except ValueError:
            pct = -1.0
        if not (0.0 <= pct <= 100.0) or not num or num.lower() in ("nan", "inf"):
            raise UsageError(f"{what}: invalid percentage {text!r} (use a number from 0 to 100, e.g. 80%)")
        return None, pct
    return parse_size(s, what), None


def format_size(n: int | None) -> str:
    """``23.54 GiB``, ``1.25 GiB``, ``512 MiB``, ``0 B`` (two decimals at most); ``-`` for None."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, factor in (("PiB", PiB), ("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= factor:
            value = n / factor
            text = f"{value:.2f}".rstrip("0").rstrip(".")
            return f"{sign}{text} {unit}"
    return f"{sign}{n} B"


def format_size_precise(n: int | None) -> str:
    """``format_size``, with the byte count added where the rounding hides it.

    For messages that compare a size with a threshold: 64 MiB - 1 must not read as "64 MiB".
    """
    shown = format_size(n)
    if n is None or n < 0 or _size(shown, "size") == n:
        return shown
    return f"{shown} ({n} bytes)"


def format_size_exact(n: int) -> str:
    """The largest binary unit that divides *n* exactly, no space: ``332GiB``, ``1280MiB``, ``12345B``.

    Parseable by ``parse_size`` back to the same number (for ``{budget}`` in worker arguments).
    """
    for unit, factor in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


_DURATIONS = {"": 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, what: str = "duration") -> float:
    """``"1s"``, ``"500ms"``, ``"5m"``, ``"1h"``, ``"2d"`` or plain seconds (``"0.5"``) -> seconds,
    at most ``MAX_DURATION``; ``UsageError`` naming *what* on anything else."""
    s = text.strip().lower()
    i = 0
    while i < len(s) and s[i] in _NUMBER_CHARS:
        i += 1
    number, unit = s[:i], s[i:].strip()
    factor = _DURATIONS.get(unit)
    try:
        value = float(number) if number and len(number) <= 30 else -1.0
    except ValueError:
        value = -1.0
    if factor is None or value < 0:
        raise UsageError(f"{what}: invalid duration {text!r} (use e.g. 500ms, 30s, 5m, 1h or seconds)")
    seconds = value * factor
    if not seconds <= MAX_DURATION:  # inf too: "9" * 30 days is a float, not an error, until here
        raise UsageError(f"{what}: {text.strip()!r} is too long (at most {MAX_DURATION_TEXT})")
    return seconds
