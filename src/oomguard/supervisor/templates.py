"""Config files written before each start: ``run --render TEMPLATE OUTPUT`` and ``run --cuzk``.

A worker that reads its budget from a config file, not from its arguments, gets it there:
before each start ``run`` reads the operator's TEMPLATE, fills it in, and replaces OUTPUT with
the result (a temporary file in OUTPUT's directory, flushed to disk, then ``rename(2)`` over
OUTPUT: the worker never reads a half-written file, and the template is never written). The
general form fills in the placeholders of the worker's arguments (``config.py``) in the file's
text; ``--cuzk`` sets CuZK's ``[memory] total_budget`` (``supervisor/cuzk.py``) in a file that
holds no placeholder at all.

Both are checked before anything starts (``check``): an unreadable template, a mistyped
placeholder, a CuZK config without a ``[memory]`` table, or an OUTPUT whose directory cannot be
written is a one-line usage error, exit 2. A write that fails at a later restart (a full disk)
stops the run the same way: the worker never starts on a file that still holds a larger budget.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable

from oomguard.errors import UsageError
from oomguard.sources.files import read_bounded

MAX_BYTES = 1 << 20  # a config file of a few hundred lines is a few KiB


def read_template(path: str, flag: str) -> str:
    """The template's text; ``UsageError`` naming *flag* when it cannot be read as UTF-8 text."""
    try:
        return read_bounded(path, MAX_BYTES).decode("utf-8")
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeError:
        raise UsageError(f"{flag}: {path} is not UTF-8 text") from None
    except ValueError as exc:  # a NUL in the path
        raise UsageError(f"{flag}: cannot read {path!r}: {exc}") from None


def check_writable(path: str, flag: str) -> None:
    """``UsageError`` unless a file can be created in *path*'s directory (where the rename happens)."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{flag}: {path} is a directory; name the file to write")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".oomguard-", dir=directory)
    except OSError as exc:
        raise UsageError(f"{flag}: cannot write in {directory}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(tmp)


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Replace *path* by *text*: a temporary file in its directory, fsync'd, renamed over it
    (rename(2): "If newpath already exists, it will be atomically replaced"). ``OSError`` on failure,
    and the temporary file is removed."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".oomguard-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Rendered:
    """One file written before each start: *template* filled in by *fill* (text, placeholder values
    -> text), written to *output*; *flag* names it in messages, *describe* says what a written text
    holds ("total_budget = ..."), for the line ``run`` prints."""

    def __init__(
        self,
        template: str,
        output: str,
        flag: str,
        fill: Callable[[str, dict[str, str]], str],
        describe: Callable[[str], str] | None = None,
    ) -> None:
        if os.path.abspath(template) == os.path.abspath(output):
            raise UsageError(f"{flag}: the output {output} is the template itself; name another file")
        self.template = template
        self.output = output
        self.flag = flag
        self.fill = fill
        self.describe = describe or (lambda text: "rendered")  # what a written file holds, in words

    def check(self, values: dict[str, str]) -> None:
        """What ``write`` would refuse at the first start, said now (*values*: any sample values)."""
        self.fill(read_template(self.template, self.flag), values)
        check_writable(self.output, self.flag)

    def write(self, values: dict[str, str]) -> str:
        """Fill the template in with *values* and replace the output; the text written. ``UsageError``
        (one line) when the template cannot be read or filled in, or the output cannot be written."""
        text = self.fill(read_template(self.template, self.flag), values)
        try:
            mode = os.stat(self.template).st_mode & 0o777  # a config may hold secrets: keep its mode
        except OSError:
            mode = 0o600
        try:
            write_atomic(self.output, text, mode)
        except OSError as exc:
            raise UsageError(f"{self.flag}: cannot write {self.output}: {exc.strerror or exc}") from None
        return text
