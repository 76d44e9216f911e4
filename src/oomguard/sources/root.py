"""Where the probe reads from: the live system, a snapshot directory, or a snapshot tarball.

This is the only module that reads files under /proc and /sys (the probe, ``run``,
``verify`` and ``--isolate`` all read through a Root; the few cgroup writes are in
``cgroupfs.py``). Every read returns either text or a ``Failure`` value (psutil's
``cat(path, fallback=...)`` idea), so the parsers never see an ``OSError`` and a missing
file is a fact, not a crash. Test a result with ``isinstance(text, Failure)``: a Failure
has no truth value of its own, because an empty file ("") is falsy too.
"""

from __future__ import annotations

import os
import stat

from oomguard.errors import SnapshotError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from oomguard._types import WarningEntry

MAX_FILE_BYTES = 1 << 20  # no file the probe reads is anywhere near this


class Failure:
    """A read that did not return text: ``kind`` is "missing", "denied" or "error"."""

    __slots__ = ("detail", "kind", "path")

    def __init__(self, path: str, kind: str, detail: str = "") -> None:
        self.path = path
        self.kind = kind
        self.detail = detail

    def __repr__(self) -> str:
        return f"Failure({self.path!r}, {self.kind!r}, {self.detail!r})"


def _failure_from_oserror(path: str, exc: OSError) -> Failure:
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return Failure(path, "missing")
    if isinstance(exc, PermissionError):
        return Failure(path, "denied", exc.strerror or "permission denied")
    return Failure(path, "error", exc.strerror or str(exc))


class Root:
    """Base class. Paths are absolute as on the probed system ("/proc/meminfo")."""

    label = "/"
    live = False

    def read(self, path: str) -> str | Failure:
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def listdir(self, path: str) -> list[str] | Failure:
        """The names in directory *path*, sorted (``run`` lists /proc to find orphans)."""
        raise NotImplementedError

    def text(
        self, path: str, warnings: list[WarningEntry] | None = None, *, lost: str = "", missing: bool = False
    ) -> str | None:
        """The text of *path*, or None when it cannot be read: the one "read, or warn and go on" step.

        With *warnings*, a failed read becomes a warning (``report.warn_failure``: ``unreadable``,
        or ``missing`` when *missing* says an absent file is news), saying what is *lost* (default
        "its value is ignored"). Without *warnings*, a failure is just None: the caller has nothing
        to add (the run side's samples, a group that is gone). Use ``read()`` where the kind of
        failure decides something.
        """
        text = self.read(path)
        if not isinstance(text, Failure):
            return text
        if warnings is not None and (missing or text.kind != "missing"):
            from oomguard.report import warn_failure

            warn_failure(warnings, text, lost or "its value is ignored")
        return None

    def names(self, path: str) -> list[str]:
        """``listdir(path)``, or [] when it cannot be listed (a group or process that is gone)."""
        found = self.listdir(path)
        return [] if isinstance(found, Failure) else found

    def readlink(self, path: str) -> str | Failure:
        """The text of symbolic link *path* (``/proc/self/ns/pid`` reads ``pid:[4026531836]``).

        A snapshot stores such a link as a file holding that text (a tarball or a fixture tree then
        needs no links), so this reads the file; the live root reads the link.
        """
        text = self.read(path)
        return text.strip() if isinstance(text, str) else text

    def environ(self) -> dict[str, str]:
        """The probed process's environment."""
        raise NotImplementedError

    def gpu_query(self, timeout: float) -> dict[str, Any]:
        """What the NVIDIA driver reports (see probes/gpu.py); a snapshot replays its gpus.json."""
        text = self.read("/gpus.json")
        if isinstance(text, Failure):
            return {"gpus": [], "error": "the snapshot has a GPU driver but no gpus.json"}
        import json

        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
            return {"gpus": [], "error": "the snapshot's gpus.json is malformed"}
        return data


class LiveRoot(Root):
    """The running system; the environment is this process's ``os.environ``."""

    live = True

    def read(self, path: str) -> str | Failure:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_FILE_BYTES)
        except OSError as exc:
            return _failure_from_oserror(path, exc)
        except ValueError:  # a NUL byte: the kernel never writes one in a path
            return _bad_path(path)
        return data.decode("utf-8", "surrogateescape")

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def listdir(self, path: str) -> list[str] | Failure:
        try:
            return sorted(os.listdir(path))
        except OSError as exc:
            return _failure_from_oserror(path, exc)
        except ValueError:
            return _bad_path(path)

    def readlink(self, path: str) -> str | Failure:
        try:
            return os.readlink(path)
        except OSError as exc:
            return _failure_from_oserror(path, exc)
        except ValueError:
            return _bad_path(path)

    def environ(self) -> dict[str, str]:
        return dict(os.environ)

    def gpu_query(self, timeout: float) -> dict[str, Any]:
        from oomguard.sources.gpu import query_live

        return query_live(timeout)


def parse_environ(text: str) -> dict[str, str]:
    """``/proc/<pid>/environ``: NUL-separated ``KEY=value`` entries."""
    env: dict[str, str] = {}
    for entry in text.split("\0"):
        key, sep, value = entry.partition("=")
        if sep and key:
            env[key] = value
    return env


class _SnapshotRoot(Root):
    """Shared behaviour of directory and tarball snapshots."""

    def environ(self) -> dict[str, str]:
        text = self.read("/proc/self/environ")
        return parse_environ(text) if isinstance(text, str) else {}


class DirRoot(_SnapshotRoot):
    """A file tree laid out as under "/" (a fixture or an unpacked snapshot).

    Paths come from the snapshot's own text (a cgroup path in proc/self/cgroup), so any
    string is taken: ``..`` stops at the tree's top, and a path the OS refuses (a NUL byte,
    an unencodable character) or a file that is not a regular one (a FIFO would block) is a
    ``Failure``, never an exception.
    """

    def __init__(self, base: str) -> None:
        self.base = os.path.abspath(base)
        self.label = base

    def _path(self, path: str) -> str:
        return os.path.join(self.base, os.path.normpath("/" + path).lstrip("/"))

    def read(self, path: str) -> str | Failure:
        try:
            fd = os.open(self._path(path), os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            return _failure_from_oserror(path, exc)
        except ValueError:
            return _bad_path(path)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return Failure(path, "error", "not a regular file")
            chunks: list[bytes] = []
            size = 0
            while size < MAX_FILE_BYTES:
                chunk = os.read(fd, MAX_FILE_BYTES - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except OSError as exc:
            return _failure_from_oserror(path, exc)
        finally:
            os.close(fd)
        return b"".join(chunks).decode("utf-8", "surrogateescape")

    def exists(self, path: str) -> bool:
        try:
            return os.path.lexists(self._path(path))
        except ValueError:  # pragma: no cover - lexists already answers False on Python >= 3.8
            return False

    def listdir(self, path: str) -> list[str] | Failure:
        try:
            return sorted(os.listdir(self._path(path)))
        except OSError as exc:
            return _failure_from_oserror(path, exc)
        except ValueError:
            return _bad_path(path)


def _bad_path(path: str) -> Failure:
    why = "the path holds a NUL byte" if "\0" in path else "the path cannot be encoded"
    return Failure(path, "error", why)


# A snapshot tarball's limits (docs/snapshots.md): ``capture`` writes what the probe read, tens to
# hundreds of files of a few KiB (the largest fixture: 84 files, 131 KB), each at most MAX_FILE_BYTES.
# A tarball beyond any of them is refused with one line (exit 2) before it costs more memory or time:
# the contents are decompressed through a counter, so a gzip bomb stops at the cap too.
MAX_SNAPSHOT_BYTES = 32 << 20  # the files' total size
MAX_SNAPSHOT_MEMBERS = 10_000  # files, directories and links
_MAX_STREAM_BYTES = 2 * MAX_SNAPSHOT_BYTES  # the whole tar stream: contents plus headers and padding


class _TooMuch(Exception):
    """A snapshot tarball beyond a limit; the message says which."""


class _Counted:
    """A decompressed stream that refuses to give more than *limit* bytes in all."""

    def __init__(self, inner: Any, limit: int) -> None:
        self.inner = inner
        self.limit = limit
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        want = self.limit + 1 - self.count if size < 0 else min(size, self.limit + 1 - self.count)
        data = self.inner.read(want) if want > 0 else b""
        self.count += len(data)
        if self.count > self.limit:
            raise _TooMuch(f"more than {self.limit >> 20} MiB of tar data")
        return bytes(data)


def _decompressed(raw: Any) -> Any:
    """*raw* (a binary file at its start) decompressed by its magic bytes: gzip, bzip2, xz, or a plain tar."""
    magic = raw.read(6)
    raw.seek(0)
    if magic[:2] == b"\x1f\x8b":
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")
    if magic[:3] == b"BZh":
        import bz2

        return bz2.BZ2File(raw)
    if magic == b"\xfd7zXZ\x00":
        import lzma

        return lzma.LZMAFile(raw)
    return raw


class TarRoot(_SnapshotRoot):
    """A ``.tar.gz`` snapshot (or .tar, .tar.bz2, .tar.xz), read into memory; nothing is extracted
    to disk. ``SnapshotError`` (one line) for a tarball that cannot be read or is beyond a limit:
    more than ``MAX_SNAPSHOT_MEMBERS`` members, a file above ``MAX_FILE_BYTES``, files above
    ``MAX_SNAPSHOT_BYTES`` in all (the decompressed stream is cut there too)."""

    def __init__(self, tarball: str) -> None:
        import tarfile  # only snapshots pay for it
        import zlib

        self.label = tarball
        self.files: dict[str, str] = {}
        self.dirs: set[str] = {"/"}
        errors: tuple[type[BaseException], ...] = (OSError, tarfile.TarError, EOFError, zlib.error)
        try:
            import lzma  # the xz module's own error is no OSError

            errors += (lzma.LZMAError,)
        except ImportError:  # pragma: no cover - a Python built without lzma
            pass
        try:
            fd = os.open(tarball, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO: no wait for a writer
            with open(fd, "rb") as raw:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(0, "not a regular file")
                self._read(tarfile, _Counted(_decompressed(raw), _MAX_STREAM_BYTES))
        except _TooMuch as exc:
            raise SnapshotError(f"--root: snapshot {tarball!r} is too large: {exc}") from None
        except errors as exc:
            # tarfile's error lists every method it tried, one per line: keep one line.
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SnapshotError(
                f"--root: cannot read snapshot {tarball!r}: not a readable tar archive ({detail})"
            ) from None

    def _read(self, tarfile: Any, stream: _Counted) -> None:
        """Every member of the tar *stream* (tarfile's stream mode, "r|": one pass, no seeking)."""
        total = 0
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for count, member in enumerate(tar, 1):
                if count > MAX_SNAPSHOT_MEMBERS:
                    raise _TooMuch(f"more than {MAX_SNAPSHOT_MEMBERS} members")
                name = os.path.normpath("/" + member.name.lstrip("/"))
                if member.isfile():
                    if member.size > MAX_FILE_BYTES:
                        raise _TooMuch(f"{name} holds more than {MAX_FILE_BYTES >> 20} MiB")
                    total += member.size
                    if total > MAX_SNAPSHOT_BYTES:
                        raise _TooMuch(f"its files hold more than {MAX_SNAPSHOT_BYTES >> 20} MiB")
                if name == "/":
                    continue
                self._add_parents(name)
                if member.isdir():
                    self.dirs.add(name)
                elif member.isfile():
                    f = tar.extractfile(member)
                    if f is not None:
                        self.files[name] = f.read().decode("utf-8", "surrogateescape")

    def _add_parents(self, name: str) -> None:
        parent = os.path.dirname(name)
        while parent not in self.dirs:
            self.dirs.add(parent)
            parent = os.path.dirname(parent)

    def read(self, path: str) -> str | Failure:
        text = self.files.get(os.path.normpath(path))
        return text if text is not None else Failure(path, "missing")

    def exists(self, path: str) -> bool:
        p = os.path.normpath(path)
        return p in self.files or p in self.dirs

    def listdir(self, path: str) -> list[str] | Failure:
        p = os.path.normpath(path)
        if p not in self.dirs:
            return Failure(path, "missing")
        prefix = p.rstrip("/") + "/"
        names = {n[len(prefix) :].split("/", 1)[0] for n in (*self.files, *self.dirs) if n.startswith(prefix)}
        return sorted(names)


def open_root(spec: str | None) -> Root:
    """``None`` or "/" for the live system; a directory or tarball for a snapshot.

    Raises ``SnapshotError`` when *spec* is missing or is not a snapshot.
    """
    if spec is None or os.path.abspath(spec) == "/":
        return LiveRoot()
    if os.path.isdir(spec):
        root: Root = DirRoot(spec)
    elif os.path.isfile(spec):
        root = TarRoot(spec)
    elif os.path.lexists(spec):  # a FIFO, a device (/dev/zero), a socket, a dangling link
        raise SnapshotError(f"--root: {spec!r} is neither a snapshot directory nor a regular file")
    else:
        raise SnapshotError(f"--root: no such snapshot directory or tarball: {spec!r}")
    if not root.exists("/proc/meminfo") and not root.exists("/proc/self/cgroup"):
        raise SnapshotError(f"--root: {spec!r} is not a snapshot (it has neither proc/meminfo nor proc/self/cgroup)")
    return root
