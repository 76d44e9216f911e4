"""Fixtures shared by the agent's tests: a fake manager on a real socket, a URL nobody listens
on, and no proxy variables from the caller's environment (urllib would route through them)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.helpers.agent_fake import FakeManager, drop_proxy_variables, running_manager, unused_port_url


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in drop_proxy_variables(dict(os.environ)):
        monkeypatch.delenv(key)


@pytest.fixture
def manager() -> Iterator[FakeManager]:
    yield from running_manager()


@pytest.fixture
def dead_url() -> str:
    return unused_port_url()
