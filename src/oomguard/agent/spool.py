"""The spool: items waiting for the manager, durable on disk, replayed oldest first.

Nothing is lost when the manager is down: every report, event and observation is written here first
(temp file, fsync, rename, fsync of the directory), then sent and removed. One JSON file per
item, named ``<seq:012d>-<kind>.json``; *seq* gives the send order, across processes too
(``run --manager`` and ``agent`` may share a spool). Items the manager will never accept, and
items it keeps answering with 5xx for too long, move to ``rejected/`` (``agent/rejected.py``).

An item is read as a regular file only, at most ``MAX_ITEM_BYTES`` (4 MiB; the manager takes 1 MiB
by default), never through a symbolic link and never blocking (``read_item``): a FIFO, a device, a
link (to ``/dev/zero``, say), a directory or a larger file named like an item moves to ``rejected/``
(reason ``unreadable``) with one line in the log, and the queue goes on.

Faults of the directory itself (unreadable, removed, a file in its place, disk full) are
``SpoolError`` values for the sender, which then reports directly; at start ``open_spool``
turns them into a ``BadParameter("spool")``.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from typing import Any

from oomguard.agent.rejected import move_to_rejected, read_retry, write_retry
from oomguard.errors import BadParameter
from oomguard.sources.files import loads_json, read_bounded

KINDS = ("report", "event", "observation")
_SEQ_DIGITS = 12
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 3600.0
_REJECTED = "rejected"
_RETRY_SUFFIX = ".retry"
MAX_ITEM_BYTES = 4 << 20  # an item is a report or an event: tens of KiB


def read_item(path: str) -> object:
    """The JSON of the spool item *path*: ``OSError`` when it is not a regular file (no link is
    followed, no FIFO waited on) or holds more than ``MAX_ITEM_BYTES``, ``ValueError`` when it is not
    JSON (or nests too deep; ``sources.files.loads_json``)."""
    return loads_json(read_bounded(path, MAX_ITEM_BYTES, follow=False))


class SpoolError(Exception):
    """The spool directory cannot be read or written; the message is one line naming it."""


def _why(exc: OSError) -> str:
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        return "not a directory"
    return exc.strerror or str(exc)


def default_spool_dir(env: dict[str, str]) -> str:
    """``$OOMGUARD_SPOOL``, else ``$XDG_STATE_HOME/oomguard/spool``, else
    ``~/.local/state/oomguard/spool`` (``~`` from ``$HOME`` in *env* when set)."""
    spool = env.get("OOMGUARD_SPOOL", "")
    if spool:
        return os.path.expanduser(spool)
    state = env.get("XDG_STATE_HOME", "")
    if state and os.path.isabs(state):  # the XDG spec: relative paths are invalid, ignore them
        return os.path.join(state, "oomguard", "spool")
    home = env.get("HOME", "") or os.path.expanduser("~")
    return os.path.join(home, ".local", "state", "oomguard", "spool")


def open_spool(directory: str) -> Spool:
    """The spool in *directory* (created when missing); ``BadParameter("spool")`` when
    it cannot be created, read or written."""
    try:
        spool = Spool(directory)
        os.listdir(directory)
    except OSError as exc:
        raise BadParameter("spool", f"cannot use {directory!r} as the spool directory ({_why(exc)})") from None
    if not os.access(directory, os.R_OK | os.W_OK | os.X_OK):
        raise BadParameter("spool", f"cannot use {directory!r} as the spool directory (permission denied)")
    return spool


def parse_name(name: str) -> tuple[int, str] | None:
    """``000000000042-report.json`` -> ``(42, "report")``; None for anything else."""
    if not name.endswith(".json"):
        return None
    seq, dash, kind = name[: -len(".json")].partition("-")
    if not dash or kind not in KINDS or len(seq) < _SEQ_DIGITS or not (seq.isascii() and seq.isdigit()):
        return None
    return int(seq), kind


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory: the rename is all we get
        pass
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


class Spool:
    """A directory of items waiting for the manager, one JSON file each, named
    ``<seq:012d>-<kind>.json``; *seq* gives the send order. ``OSError`` when *directory*
    cannot be created (``open_spool`` turns that into a usage error)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.rejected_dir = os.path.join(directory, _REJECTED)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._lock = threading.Lock()
        self._last_seq = 0
        self._retries: dict[str, tuple[int, float]] = {}  # when <name>.retry cannot be written
        self._remove_strays()

    def _remove_strays(self) -> None:
        """Temp files left by a crash mid-``put`` (never renamed: never part of the spool), and
        ``.retry`` counters whose item is gone."""
        now = time.time()
        with contextlib.suppress(OSError):
            names = set(os.listdir(self.directory))
            for name in names:
                path = os.path.join(self.directory, name)
                if name.startswith(_TMP_PREFIX):
                    with contextlib.suppress(OSError):
                        if now - os.stat(path).st_mtime > _STALE_TMP_S:  # younger: maybe another process's
                            os.unlink(path)
                elif name.endswith(_RETRY_SUFFIX) and name[: -len(_RETRY_SUFFIX)] not in names:
                    with contextlib.suppress(OSError):
                        os.unlink(path)

    def _max_seq(self) -> int:
        top = 0
        for directory in (self.directory, self.rejected_dir):
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                parsed = parse_name(name)
                if parsed is not None:
                    top = max(top, parsed[0])
        return top

    def put(self, kind: str, body: dict[str, Any]) -> str:
        """Store *body* durably; returns its path. Raises ``ValueError`` for an unknown *kind*,
        ``TypeError``/``ValueError`` for a body JSON cannot encode, ``SpoolError`` when the
        directory cannot take it (disk full, removed, unwritable). A removed directory is
        created again."""
        if kind not in KINDS:
            raise ValueError(f"unknown spool item kind {kind!r} (expected report or event)")
        data = json.dumps(body, separators=(",", ":")).encode("utf-8")
        try:
            try:
                return self._put(kind, data)
            except FileNotFoundError:  # the directory was removed under us (a tmp cleaner)
                os.makedirs(self.directory, mode=0o700, exist_ok=True)
                return self._put(kind, data)
        except OSError as exc:
            raise SpoolError(f"cannot write to the spool {self.directory} ({_why(exc)})") from None

    def _put(self, kind: str, data: bytes) -> str:
        tmp = os.path.join(self.directory, f"{_TMP_PREFIX}{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
            path = self._name_and_place(tmp, kind)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(self.directory)
        return path

    def _name_and_place(self, tmp: str, kind: str) -> str:
        """Give *tmp* the next free seq; returns the item's path."""
        with self._lock:
            seq = max(self._last_seq, self._max_seq()) + 1
            while True:
                path = os.path.join(self.directory, f"{seq:0{_SEQ_DIGITS}d}-{kind}.json")
                if self._place(tmp, path):
                    break
                seq = max(seq, self._max_seq()) + 1  # another process took it
            self._last_seq = seq
        return path

    @staticmethod
    def _place(tmp: str, path: str) -> bool:
        """Rename *tmp* to *path* atomically unless *path* exists (two processes may pick the
        same seq); False when it does. Without hard links, ``os.replace`` after a check."""
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # no hard links here (some FUSE / network file systems)
            if os.path.exists(path):
                return False
            os.replace(tmp, path)
            return True
        os.unlink(tmp)
        return True

    def pending(self) -> list[str]:
        """Paths of the items to send, oldest first (temp files and ``rejected/`` excluded);
        ``SpoolError`` when the directory cannot be read (a missing one holds nothing)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise SpoolError(f"cannot read the spool {self.directory} ({_why(exc)})") from None
        items: list[tuple[int, str]] = []
        for name in names:
            parsed = parse_name(name)
            if parsed is not None:
                items.append((parsed[0], name))
        items.sort()
        return [os.path.join(self.directory, name) for _, name in items]

    def note_server_error(self, path: str, now: float | None = None) -> tuple[int, float]:
        """Count one more 5xx answer to *path*; ``(answers, time of the first)``. Kept in
        ``<name>.retry`` (in memory too: a counter that cannot be written only resets)."""
        now = time.time() if now is None else now
        answers, first = read_retry(path + _RETRY_SUFFIX) or self._retries.get(path) or (0, now)
        state = (answers + 1, min(first, now))
        self._retries[path] = state
        write_retry(path + _RETRY_SUFFIX, *state)
        return state

    def done(self, path: str) -> None:
        """Remove a delivered item; ``SpoolError`` when it cannot be removed."""
        self._retries.pop(path, None)
        with contextlib.suppress(OSError):
            os.unlink(path + _RETRY_SUFFIX)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise SpoolError(f"cannot remove {path} ({_why(exc)})") from None

    def reject(self, path: str, reason: dict[str, Any]) -> str:
        """Move *path* to ``rejected/`` (kept for a human) with ``<name>.why`` beside it, JSON
        *reason*; returns the new path. ``SpoolError`` when it cannot be moved."""
        self._retries.pop(path, None)
        with contextlib.suppress(OSError):
            os.unlink(path + _RETRY_SUFFIX)
        try:
            return move_to_rejected(path, self.rejected_dir, reason)
        except OSError as exc:
            raise SpoolError(f"cannot move {path} to {self.rejected_dir} ({_why(exc)})") from None
