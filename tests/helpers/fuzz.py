"""How hard the property tests search: the full count in ``make test``, a tenth in ``make test-fast``.

``make test-fast`` (the quick loop, CONTRIBUTING.md) sets ``OOMGUARD_TEST_FAST=1``; hypothesis then
runs the ``oomguard-fast`` profile (tests/conftest.py) and every explicit count goes through
``examples``, so a quick run still tries each property, just fewer times. ``make test`` and CI run
the full counts.
"""

from __future__ import annotations

import os

FAST = os.environ.get("OOMGUARD_TEST_FAST") == "1"
DIVISOR = 10  # a tenth of the examples in the quick loop
FLOOR = 10  # but never fewer than this
DEFAULT = 100  # hypothesis' own max_examples ("settings.max_examples", default 100)


def examples(n: int) -> int:
    """*n* examples, or a tenth of them (at least ``FLOOR``) in the quick loop."""
    return max(FLOOR, n // DIVISOR) if FAST else n
