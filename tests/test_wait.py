"""tests/helpers/wait.py: wait_until returns the first truthy value, or fails naming what it waited for."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.helpers.wait import wait_until


def test_returns_the_first_truthy_value() -> None:
    seen: Iterator[object] = iter([0, None, "", [], 7, 8])
    assert wait_until(lambda: next(seen), interval=0) == 7
    assert next(seen) == 8  # not called again once it held


def test_waits_for_another_thread() -> None:
    flag = threading.Event()
    threading.Thread(target=flag.set).start()
    assert wait_until(flag.is_set, what="the thread to set the flag") is True


def test_the_deadline_names_what_and_the_last_value() -> None:
    values = iter(range(-1000, 0))
    with pytest.raises(AssertionError, match=r"waited 0.05 s for the counter to reach 1; last value seen: ") as info:
        wait_until(lambda: [] if next(values) < 0 else [1], timeout=0.05, interval=0.001, what="the counter to reach 1")
    assert str(info.value).endswith("last value seen: []")


def test_the_predicate_runs_at_least_once_and_its_errors_propagate() -> None:
    assert wait_until(lambda: 1, timeout=0) == 1

    def broken() -> int:
        raise KeyError("no")

    with pytest.raises(KeyError):
        wait_until(broken)
