"""``oomguard capture``: save every file the probe reads as a .tar.gz snapshot."""

from __future__ import annotations

import argparse
import sys

from oomguard.commands import flags
from oomguard.errors import EXIT_OK, UsageError

SUMMARY = (
    "Save every file the probe reads (a snapshot) as a .tar.gz, for a bug report or a test "
    "fixture; replay it with 'oomguard check --root FILE'. The environment is reduced to the "
    "variables oomguard reads (docs/snapshots.md)."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = "%(prog)s [--force] FILE.tar.gz"
    parser.description = SUMMARY
    flags.option(parser, "--force", "overwrite FILE if it exists (a regular file only)")
    # Optional here so that a missing FILE gets oomguard's own one-line message.
    parser.add_argument("file", nargs="?", metavar="FILE.tar.gz", help="the snapshot to write")


def execute(args: argparse.Namespace) -> int:
    if not args.file:
        raise UsageError("capture: missing FILE.tar.gz (see 'oomguard capture --help')")
    import os
    import stat

    from oomguard.probes.capture import capture

    try:
        mode = os.lstat(args.file).st_mode
    except OSError:
        mode = None  # missing (written new), or a path capture itself will say it cannot write
    if mode is not None and not stat.S_ISREG(mode):
        # --force replaces a file by rename: a FIFO, a device (/dev/null) or a link would be replaced too.
        raise UsageError(f"capture: {args.file} exists and is not a regular file; it is not replaced")

    n = capture(args.file, force=args.force)
    sys.stderr.write(f"oomguard: wrote {n} files to {args.file}\n")
    return EXIT_OK
