"""Reading a file someone else named, safely: regular files only, never blocking, never unbounded.

Every file oomguard reads because a flag, a variable or a directory listing named it (``--profiles``,
a spool item, a ``.retry`` counter) goes through ``read_bounded``: a FIFO would block ``open(2)``
until a writer comes, ``/dev/zero`` would be read for ever, and a symbolic link in the spool could
point at either. So the file is opened with ``O_NONBLOCK`` (open(2): "When possible, the file is
opened in nonblocking mode"; for a FIFO, an open for reading then returns at once), checked with
``fstat`` to be a regular file (``S_ISREG``) before one byte is read, and read up to a cap: one byte
more than the cap tells a file that is too large. With *follow* False, ``O_NOFOLLOW`` refuses a
symbolic link (open(2): "If the trailing component ... is a symbolic link, then the open fails,
with the error ELOOP").

The failures are ``OSError``\\ s whose ``strerror`` is one line (``NotRegularFile``, ``FileTooLarge``),
so callers that already turn an ``OSError`` into a message need nothing new. ``loads_json`` parses
JSON within a nesting depth: a 100,000-deep ``[[[...`` is a ``ValueError``, not a ``RecursionError``.
"""

from __future__ import annotations

import errno
import json
import os
import stat

MAX_DEPTH = 64  # nesting levels a JSON or TOML input may have; oomguard's own files use under 10


class NotRegularFile(OSError):
    """The path is a FIFO, a device, a socket or a directory."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.EINVAL, "not a regular file (a FIFO, a device, a socket or a directory)", path)


class FileTooLarge(OSError):
    """The file holds more than the cap."""

    def __init__(self, path: str, limit: int) -> None:
        from oomguard.units import format_size

        super().__init__(errno.EFBIG, f"larger than {format_size(limit)}", path)


def read_bounded(path: str, limit: int, *, follow: bool = True) -> bytes:
    """The bytes of the regular file *path*, at most *limit* of them; ``OSError`` otherwise (see the
    module doc): missing, denied, ``NotRegularFile``, ``FileTooLarge``, a symbolic link
    (``ELOOP``) without *follow*. ``ValueError`` for a path with a NUL byte (as ``open``)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(path)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise FileTooLarge(path, limit)
        return b"".join(chunks)
    finally:
        os.close(fd)


def too_deep(value: object, limit: int = MAX_DEPTH) -> bool:
    """True when *value* (parsed JSON or TOML: dicts and lists) nests deeper than *limit* levels;
    iterative, so any depth is measured without recursion."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def loads_json(data: bytes | str, limit: int = MAX_DEPTH) -> object:
    """``json.loads`` within *limit* nesting levels: ``ValueError`` (one line) for invalid JSON and
    for JSON nested deeper. Past the interpreter's recursion limit (``sys.getrecursionlimit()``, 1,000)
    the decoder itself raises ``RecursionError`` ("maximum recursion depth exceeded while decoding a
    JSON array"): caught here too, and said the same way."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError(f"nested more than {limit} levels deep") from None
    if too_deep(value, limit):
        raise ValueError(f"nested more than {limit} levels deep")
    return value


def write_regular(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write *data* to *path*, created or truncated, only when it is (or becomes) a regular file:
    ``O_NOFOLLOW`` refuses a symbolic link and ``O_NONBLOCK`` a FIFO without a reader (open(2):
    "ENXIO ... O_NONBLOCK | O_WRONLY is set, the named file is a FIFO, and no process has the FIFO
    open for reading"); a FIFO with one, or a device, is ``NotRegularFile``, nothing written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(path)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
