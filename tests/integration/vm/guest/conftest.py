"""Fixtures of the guest run (loaded only inside the VM: the host ignores this folder)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.vm.guest.cg import Group, new_group


@pytest.fixture(autouse=True)
def _only_in_the_vm() -> None:
    """These tests make top-level groups under /sys/fs/cgroup: never on a real host."""
    if os.environ.get("VMTEST_GUEST") != "1":
        pytest.skip("guest tests run only inside the VM: python -m pytest tests/integration/vm")


@pytest.fixture
def group() -> Iterator[Callable[..., Group]]:
    """Factory: ``group(max_bytes=None)`` makes a top-level group; all are removed afterwards."""
    made: list[Group] = []

    def make(max_bytes: int | None = None) -> Group:
        g = new_group(max_bytes)
        made.append(g)
        return g

    yield make
    for g in reversed(made):
        g.remove()


@pytest.fixture
def events(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"
