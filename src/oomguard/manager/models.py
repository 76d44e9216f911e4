"""The old name of the request bodies' module, for tests/test_guard.py alone until its import moves
to ``oomguard.manager.bodies`` (issue 20); then delete this file. Nothing in the manager imports it."""

from __future__ import annotations

from oomguard.manager.bodies import EventEnvelope, ReportEnvelope

__all__ = ["EventEnvelope", "ReportEnvelope"]
