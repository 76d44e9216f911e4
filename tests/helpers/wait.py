"""``wait_until``: the one way a test waits for an event (GitHub issue #35, item 1).

A test never sleeps a fixed time in place of an event (a file appearing, a log line, a cgroup
counter, a process state, a thread having sampled, a server answering): on this shared 2-core
machine a fixed sleep is either too short under load or wasted when idle. It polls the event
instead, with a deadline that only bounds a hang.

Standard library only: the VM's guest checks (``tests/integration/vm/guest/``) import it too, and the guest
has the checkout and the host's interpreter but runs pytest with no plugins.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TIMEOUT_S = 60.0  # bounds a hang only: a sound build meets every event long before it
INTERVAL_S = 0.01


def wait_until(
    predicate: Callable[[], T], *, timeout: float = TIMEOUT_S, interval: float = INTERVAL_S, what: str = "the condition"
) -> T:
    """Call *predicate* every *interval* seconds until it returns a truthy value; return that value.

    At the deadline (*timeout* seconds) raise AssertionError naming *what* and the last value the
    predicate returned. An exception from the predicate propagates at once.
    """
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"waited {timeout:g} s for {what}; last value seen: {value!r}")
        time.sleep(interval)
