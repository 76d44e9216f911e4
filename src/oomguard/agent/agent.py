"""The agent's client side: send ``check`` reports and supervisor events to a fleet manager.

Nothing is lost when the manager is down: every item is written to a spool directory
first (durably: temp file, fsync, rename, fsync of the directory), then the spool is
replayed oldest first. The manager's contract::

    POST {manager}/api/v1/reports  {"node", "id", "report", "interval_s"}
    POST {manager}/api/v1/events   {"node", "id", "event"}
    Authorization: Bearer TOKEN

2xx: stored (a duplicate ``id`` is stored once, so resending is always safe); 4xx other
than 408 and 429: never accepted (the item moves to ``rejected/`` for a human, the queue
goes on); 5xx, 408, 429, 3xx, network errors and timeouts: try again later, in order.

Standard library only: the agent runs on every node.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from oomguard._version import __version__
from oomguard.errors import EXIT_OK, EXIT_SPOOLED
from oomguard.times import iso_now

NODE_NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"
NODE_NAME_MAX = 128
_NODE_NAME_SET = frozenset(NODE_NAME_CHARS)

KINDS = ("report", "event")
_ENDPOINTS = {"report": "reports", "event": "events"}
_SEQ_DIGITS = 12
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 3600.0
_REJECTED = "rejected"
# 4xx answers that mean "not now" rather than "never".
_RETRY_4XX = frozenset({401, 403, 408, 429})  # a wrong token is fixed by an operator: keep the data


def sanitize_node_name(name: str) -> str:
    """*name* with every character outside ``NODE_NAME_CHARS`` replaced by ``-``, at most
    128 characters; never empty, never only dots (fallback ``node``)."""
    clean = "".join(c if c in _NODE_NAME_SET else "-" for c in name[:NODE_NAME_MAX])
    return clean if clean.strip(".") else "node"


def default_node_name(env: dict[str, str]) -> str:
    """``VAST_CONTAINERLABEL`` (the instance label on vast.ai), else the host name; sanitized."""
    label = env.get("VAST_CONTAINERLABEL", "").strip()
    if label:
        return sanitize_node_name(label)
    try:
        host = socket.gethostname()
    except OSError:
        host = ""
    return sanitize_node_name(host)


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


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _stderr_log(line: str) -> None:
    sys.stderr.write("oomguard agent: " + line + "\n")
    sys.stderr.flush()


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


def _parse_name(name: str) -> tuple[int, str] | None:
    """``000000000042-report.json`` -> ``(42, "report")``; None for anything else."""
    if not name.endswith(".json"):
        return None
    seq, dash, kind = name[: -len(".json")].partition("-")
    if not dash or kind not in KINDS or len(seq) < _SEQ_DIGITS or not (seq.isascii() and seq.isdigit()):
        return None
    return int(seq), kind


class Spool:
    """A directory of items waiting for the manager, one JSON file each, named
    ``<seq:012d>-<kind>.json``; *seq* gives the send order."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.rejected_dir = os.path.join(directory, _REJECTED)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._lock = threading.Lock()
        self._last_seq = 0
        self._remove_stale_temps()

    def _remove_stale_temps(self) -> None:
        """Temp files left by a crash mid-``put`` (never renamed: never part of the spool)."""
        now = time.time()
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            if name.startswith(_TMP_PREFIX):
                path = os.path.join(self.directory, name)
                try:
                    if now - os.stat(path).st_mtime > _STALE_TMP_S:  # younger: maybe another process's
                        os.unlink(path)
                except OSError:
                    pass

    def _max_seq(self) -> int:
        top = 0
        for directory in (self.directory, self.rejected_dir):
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                parsed = _parse_name(name)
                if parsed is not None:
                    top = max(top, parsed[0])
        return top

    def put(self, kind: str, body: dict[str, Any]) -> str:
        """Store *body* durably; returns its path. Raises ``ValueError`` for an unknown *kind*,
        ``TypeError``/``ValueError`` for a body JSON cannot encode, ``OSError`` when the disk fails."""
        if kind not in KINDS:
            raise ValueError(f"unknown spool item kind {kind!r} (expected report or event)")
        data = json.dumps(body, separators=(",", ":")).encode("utf-8")
        tmp = os.path.join(self.directory, f"{_TMP_PREFIX}{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            with self._lock:
                seq = max(self._last_seq, self._max_seq()) + 1
                while True:
                    path = os.path.join(self.directory, f"{seq:0{_SEQ_DIGITS}d}-{kind}.json")
                    if self._place(tmp, path):
                        break
                    seq = max(seq, self._max_seq()) + 1  # another process took it
                self._last_seq = seq
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(self.directory)
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
        """Paths of the items to send, oldest first (temp files and ``rejected/`` excluded)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        items: list[tuple[int, str]] = []
        for name in names:
            parsed = _parse_name(name)
            if parsed is not None:
                items.append((parsed[0], name))
        items.sort()
        return [os.path.join(self.directory, name) for _, name in items]

    def reject(self, path: str, why: str) -> None:
        """Move *path* to ``rejected/`` (kept for a human) with ``<name>.why`` beside it."""
        os.makedirs(self.rejected_dir, mode=0o700, exist_ok=True)
        name = os.path.basename(path)
        with open(os.path.join(self.rejected_dir, name + ".why"), "w", encoding="utf-8") as f:
            f.write(_one_line(why, 2000) + "\n")
        with contextlib.suppress(FileNotFoundError):  # else another process dealt with it
            os.replace(path, os.path.join(self.rejected_dir, name))

    def done(self, path: str) -> None:
        """Remove a delivered item."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirected POST would be replayed as a GET without its body and could look like a
    success: turn every 3xx into an ``HTTPError`` instead."""

    def redirect_request(  # noqa: PLR0917 (the base class's signature)
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


def _check_manager(manager: str) -> str:
    """The manager's base URL without trailing slashes; ``ValueError`` unless http(s)."""
    base = manager.strip().rstrip("/")
    try:
        parts = urllib.parse.urlsplit(base)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"manager URL must be http://HOST[:PORT][/PATH] or https://..., got {manager!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"manager URL must not have a query or fragment, got {manager!r}")
    return base


def _network_why(err: BaseException) -> str:
    if isinstance(err, urllib.error.URLError) and isinstance(err.reason, BaseException):
        err = err.reason
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    if isinstance(err, http.client.RemoteDisconnected):
        return "connection closed without an answer"
    if isinstance(err, ConnectionResetError):
        return "connection reset"
    if isinstance(err, TimeoutError):
        return "timed out"
    if isinstance(err, socket.gaierror):
        return f"cannot resolve host ({err.strerror or err})"
    if isinstance(err, urllib.error.URLError):
        return _one_line(f"{err.reason}", 160)
    return _one_line(f"{type(err).__name__}: {err}", 160)


def _error_detail(err: urllib.error.HTTPError) -> str:
    """A short reason from the error body (``{"error": ...}``/``{"detail": ...}`` or text)."""
    try:
        data = err.read(65536)
    except Exception:
        data = b""
    finally:
        with contextlib.suppress(Exception):
            err.close()
    if not data:
        return ""
    text = data.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for key in ("error", "detail", "message"):
            if isinstance(parsed.get(key), str):
                return _one_line(parsed[key], 120)
        return _one_line(text, 120)
    if text.lstrip().startswith("<"):  # an HTML error page says nothing useful on one line
        return ""
    return _one_line(text, 120)


class Sender:
    """Delivers spooled items to the manager, oldest first."""

    def __init__(
        self,
        manager: str,
        token: str,
        spool: Spool,
        *,
        timeout: float = 10.0,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.manager = _check_manager(manager)
        token = token.strip()
        if any(c.isspace() or not c.isprintable() for c in token):
            raise ValueError("manager token must not contain spaces or control characters")
        self.token = token
        self.spool = spool
        self.timeout = timeout
        self.log: Callable[[str], None] = log if log is not None else _stderr_log
        self._opener = urllib.request.build_opener(_NoRedirect())
        self._flush_lock = threading.Lock()
        self._failing: str | None = None  # the last retry reason, logged once until it changes

    def _url(self, kind: str) -> str:
        if kind not in _ENDPOINTS:
            raise ValueError(f"unknown item kind {kind!r} (expected report or event)")
        return f"{self.manager}/api/v1/{_ENDPOINTS[kind]}"

    def post(self, kind: str, body: dict[str, Any]) -> str:
        """One POST: ``"ok"``, ``"rejected:<status> <reason>"`` or ``"retry:<why>"``. Network
        errors never raise."""
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"oomguard-agent/{__version__}",
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body, separators=(",", ":")).encode("utf-8")
        req = urllib.request.Request(self._url(kind), data=data, method="POST", headers=headers)
        try:
            # the status line said stored; the rest of the answer does not matter
            with (
                self._opener.open(req, timeout=self.timeout) as resp,
                contextlib.suppress(OSError, http.client.HTTPException),
            ):
                resp.read(1 << 20)
            return "ok"
        except urllib.error.HTTPError as e:
            code = e.code
            detail = _error_detail(e)
            reason = f"{code} {e.reason}" + (f": {detail}" if detail else "")
            if 400 <= code < 500 and code not in _RETRY_4XX:
                return f"rejected:{reason}"
            if 300 <= code < 400:
                where = e.headers.get("Location", "?") if e.headers is not None else "?"
                return f"retry:{code} {e.reason} (redirect to {_one_line(where, 100)}: check the manager URL)"
            return f"retry:{reason}"
        except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException) as e:
            return f"retry:{_network_why(e)}"

    def send(self, kind: str, body: dict[str, Any]) -> bool:
        """Spool *body* first (nothing is lost if we die mid-request), then flush; True when
        the spool is empty afterwards. When the spool cannot be written (disk full), the item
        is posted directly instead and only a failed post loses it (logged)."""
        try:
            self.spool.put(kind, body)
        except OSError as e:
            self.log(f"cannot spool the {kind} ({_one_line(str(e), 120)}); sending it directly")
            result = self.post(kind, body)
            if result != "ok":
                self.log(f"{kind} {body.get('id', '?')} lost: {result}")
                return False
        return self.flush()

    def flush(self) -> bool:
        """Send spooled items oldest first until the spool is empty (True) or the manager
        asks to try later (False, order kept). Rejected items move to ``rejected/``."""
        with self._flush_lock:
            delivered = 0
            seen: set[str] = set()
            while True:
                paths = self.spool.pending()
                if not paths:
                    break
                for path in paths:
                    if path in seen:  # could not be removed: do not loop on it
                        return False
                    seen.add(path)
                    outcome = self._deliver(path)
                    if outcome == "ok":
                        delivered += 1
                    elif outcome.startswith("retry:"):
                        why = outcome[len("retry:") :]
                        if why != self._failing:
                            self._failing = why
                            n = len(self.spool.pending())
                            self.log(f"manager not reachable ({why}); {n} item(s) spooled in {self.spool.directory}")
                        return False
            if self._failing is not None:
                self._failing = None
                self.log(f"manager reachable again; delivered {delivered} spooled item(s)")
            return True

    def _deliver(self, path: str) -> str:
        name = os.path.basename(path)
        parsed = _parse_name(name)
        kind = parsed[1] if parsed is not None else "report"
        try:
            with open(path, "rb") as f:
                body = json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:  # delivered by another process meanwhile
            return "ok"
        except (OSError, ValueError) as e:
            body = None
            bad = f"unreadable spool file: {_one_line(str(e), 120)}"
        else:
            bad = "spool file is not a JSON object"
        if not isinstance(body, dict):
            self._reject(path, bad)
            return "rejected"
        outcome = self.post(kind, body)
        if outcome == "ok":
            self.spool.done(path)
        elif outcome.startswith("rejected:"):
            self._reject(path, f"manager rejected it: {outcome[len('rejected:') :]}")
        return outcome

    def _reject(self, path: str, why: str) -> None:
        self.spool.reject(path, why)
        where = os.path.join(self.spool.rejected_dir, os.path.basename(path))
        self.log(f"{os.path.basename(path)} will not be sent ({_one_line(why, 160)}); kept in {where}")

    def report(self, node: str, report: dict[str, Any], interval_s: float | None) -> bool:
        """Send a ``check`` report; True when nothing is left in the spool."""
        body = {"node": node, "id": uuid.uuid4().hex, "report": report, "interval_s": interval_s, "time": iso_now()}
        return self.send("report", body)

    def event(self, node: str, event: dict[str, Any]) -> bool:
        """Send a supervisor event; True when nothing is left in the spool."""
        return self.send("event", {"node": node, "id": uuid.uuid4().hex, "event": event})


def _wait(sender: Sender, interval: float, spent: float, sleep: Callable[[float], None]) -> None:
    """Sleep out the rest of the interval; while items wait in the spool, retry them with
    backoff (1 s, doubling, capped at the interval)."""
    remaining = interval - spent
    delay = 1.0
    while remaining > 0:
        if not sender.spool.pending():
            sleep(remaining)
            return
        step = min(delay, remaining)
        sleep(step)
        remaining -= step
        if remaining <= 0:
            return  # the next cycle's report flushes anyway
        t0 = time.monotonic()
        sender.flush()
        remaining -= time.monotonic() - t0
        delay = min(delay * 2, interval)


def run_agent(
    *,
    manager: str,
    token: str,
    node: str,
    interval: float,
    once: bool,
    spool_dir: str,
    make_report: Callable[[], dict[str, Any]],
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] | None = None,
    max_cycles: int | None = None,
) -> int:
    """Report to the manager once (*once*: ``EXIT_OK`` when the spool is empty
    afterwards, else ``EXIT_SPOOLED``; a failing *make_report* raises) or every *interval*
    seconds until *max_cycles* (None: forever; returns 0). In *once* mode the report's
    ``interval_s`` is *interval* when it is > 0 (a cron period), else null.
    ``ValueError`` for a bad manager URL, token or interval."""
    emit = log if log is not None else _stderr_log
    sender = Sender(manager, token, Spool(spool_dir), log=emit)
    if once:
        delivered = sender.report(node, make_report(), interval if interval > 0 else None)
        return EXIT_OK if delivered else EXIT_SPOOLED
    if not interval > 0:
        raise ValueError(f"the report interval must be > 0 seconds, got {interval}")
    cycles = 0
    while max_cycles is None or cycles < max_cycles:
        t0 = time.monotonic()
        try:
            sender.report(node, make_report(), interval)
        except Exception as e:
            emit(f"report failed: {type(e).__name__}: {_one_line(str(e), 300)}")
        cycles += 1
        if max_cycles is not None and cycles >= max_cycles:
            break
        _wait(sender, interval, time.monotonic() - t0, sleep)
    return 0
