"""``capture()``: probe the live system through a recording root and write what was read as a snapshot.

Every file the probe read, every marker it found and the environment variables oomguard uses
are written as a tree rooted at "/" into a .tar.gz; ``check --root FILE`` then computes what
the node computed (docs/snapshots.md).
"""

from __future__ import annotations

import os

from oomguard.errors import UsageError
from oomguard.probes import probe_system
from oomguard.sources.root import Root
from oomguard.sources.snapshot import RecordingRoot, write_snapshot


def capture(path: str, force: bool = False, source: Root | None = None) -> int:
    """Probe the live system and write a snapshot to *path*; returns the number of files.

    Written to a temporary file and renamed, so *path* is never left half-written.
    Refuses to overwrite an existing file unless *force*. *source* replaces the live system
    (tests record a fake driver through it).
    """
    if os.path.exists(path) and not force:
        raise UsageError(f"capture: {path} exists (use --force to overwrite)")
    rec = RecordingRoot(source)
    probe_system(rec, rec.environ())
    return write_snapshot(rec, path)
