"""Exceptions for usage and input errors; each carries the exit code the CLI uses.

Problems found while probing are not exceptions: they become warnings in the report.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_USAGE = 2  # bad flag, bad size, missing or corrupt snapshot
EXIT_THRESHOLD = 3  # a --require style threshold was not met
EXIT_VERIFY_FAILED = 4  # verify: the machine did not deliver the memory


class OomguardError(Exception):
    """Base class; ``exit_code`` is what ``oomguard`` exits with."""

    exit_code = EXIT_USAGE


class UsageError(OomguardError):
    """A flag, environment variable or argument that cannot be used as given."""


class SnapshotError(OomguardError):
    """A ``--root`` snapshot that is missing, unreadable or not a snapshot."""


class ThresholdError(OomguardError):
    """A threshold such as ``--require`` was not met."""

    exit_code = EXIT_THRESHOLD
