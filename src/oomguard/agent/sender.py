"""The sender: delivers spooled reports and events to the fleet manager over HTTP.

The manager's contract::

    POST {manager}/api/v1/reports  {"node", "id", "report", "interval_s", "time"}
    POST {manager}/api/v1/events   {"node", "id", "event"}
    Authorization: Bearer TOKEN

2xx: stored (a duplicate ``id`` is stored once, so resending is always safe); 4xx other
than 401, 403, 408 and 429: never accepted (the item moves to ``rejected/`` for a human, the
queue goes on); 5xx, 401, 403, 408, 429, 3xx, network errors and timeouts: try again later,
in order. Network failures are values (``"retry:<why>"``), never exceptions.

Standard library only: the agent runs on every node.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from oomguard._version import __version__
from oomguard.agent.log import one_line, stderr_log
from oomguard.agent.spool import Spool, parse_name
from oomguard.errors import UsageError
from oomguard.times import iso_now

_ENDPOINTS = {"report": "reports", "event": "events"}
# 4xx answers that mean "not now" rather than "never".
_RETRY_4XX = frozenset({401, 403, 408, 429})  # a wrong token is fixed by an operator: keep the data


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


def check_manager(manager: str) -> str:
    """The manager's base URL without trailing slashes; ``UsageError`` naming ``--manager``
    unless it is an http(s) URL with a host and no query or fragment."""
    base = manager.strip().rstrip("/")
    try:
        parts = urllib.parse.urlsplit(base)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--manager: the URL must be http://HOST[:PORT][/PATH] or https://..., got {manager!r}")
    if parts.query or parts.fragment:
        raise UsageError(f"--manager: the URL must not have a query or fragment, got {manager!r}")
    return base


def check_token(token: str) -> str:
    """*token* without surrounding white space; ``UsageError`` naming ``--token`` when it holds
    spaces or control characters (it could not travel in a header)."""
    token = token.strip()
    if any(c.isspace() or not c.isprintable() for c in token):
        raise UsageError("--token (or OOMGUARD_AGENT_TOKEN): must not contain spaces or control characters")
    return token


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
        return one_line(f"{err.reason}", 160)
    return one_line(f"{type(err).__name__}: {err}", 160)


def _error_detail(err: urllib.error.HTTPError) -> str:
    """A short reason from the error body (``{"error": ...}``/``{"detail": ...}`` or text)."""
    try:
        data = err.read(65536)
    except Exception:  # the body of an error answer is a courtesy: its loss is not a failure
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
                return one_line(parsed[key], 120)
        return one_line(text, 120)
    if text.lstrip().startswith("<"):  # an HTML error page says nothing useful on one line
        return ""
    return one_line(text, 120)


def _http_outcome(e: urllib.error.HTTPError) -> str:
    """``"rejected:<status> <reason>"`` or ``"retry:<why>"`` for an error answer."""
    code = e.code
    detail = _error_detail(e)
    reason = f"{code} {e.reason}" + (f": {detail}" if detail else "")
    if 400 <= code < 500 and code not in _RETRY_4XX:
        return f"rejected:{reason}"
    if 300 <= code < 400:
        where = e.headers.get("Location", "?") if e.headers is not None else "?"
        return f"retry:{code} {e.reason} (redirect to {one_line(where, 100)}: check the manager URL)"
    return f"retry:{reason}"


class Sender:
    """Delivers spooled items to the manager, oldest first. ``UsageError`` for a bad manager
    URL or token."""

    def __init__(
        self,
        manager: str,
        token: str,
        spool: Spool,
        *,
        timeout: float = 10.0,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.manager = check_manager(manager)
        self.token = check_token(token)
        self.spool = spool
        self.timeout = timeout
        self.log: Callable[[str], None] = log if log is not None else stderr_log
        self._opener = urllib.request.build_opener(_NoRedirect())
        self._flush_lock = threading.Lock()
        self._failing: str | None = None  # the last retry reason, logged once until it changes

    def _url(self, kind: str) -> str:
        if kind not in _ENDPOINTS:
            raise ValueError(f"unknown item kind {kind!r} (expected report or event)")
        return f"{self.manager}/api/v1/{_ENDPOINTS[kind]}"

    def _request(self, kind: str, body: dict[str, Any]) -> urllib.request.Request:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"oomguard-agent/{__version__}",
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body, separators=(",", ":")).encode("utf-8")
        return urllib.request.Request(self._url(kind), data=data, method="POST", headers=headers)

    def post(self, kind: str, body: dict[str, Any]) -> str:
        """One POST: ``"ok"``, ``"rejected:<status> <reason>"`` or ``"retry:<why>"``. Network
        errors never raise."""
        req = self._request(kind, body)
        try:
            # the status line said stored; the rest of the answer does not matter
            with (
                self._opener.open(req, timeout=self.timeout) as resp,
                contextlib.suppress(OSError, http.client.HTTPException),
            ):
                resp.read(1 << 20)
            return "ok"
        except urllib.error.HTTPError as e:
            return _http_outcome(e)
        except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException) as e:
            return f"retry:{_network_why(e)}"

    def send(self, kind: str, body: dict[str, Any]) -> bool:
        """Spool *body* first (nothing is lost if we die mid-request), then flush; True when
        the spool is empty afterwards. When the spool cannot be written (disk full), the item
        is posted directly instead and only a failed post loses it (logged)."""
        try:
            self.spool.put(kind, body)
        except OSError as e:
            self.log(f"cannot spool the {kind} ({one_line(str(e), 120)}); sending it directly")
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
            while paths := self.spool.pending():
                for path in paths:
                    if path in seen:  # could not be removed: do not loop on it
                        return False
                    seen.add(path)
                    outcome = self._deliver(path)
                    if outcome.startswith("retry:"):
                        self._note_failing(outcome[len("retry:") :])
                        return False
                    delivered += outcome == "ok"
            if self._failing is not None:
                self._failing = None
                self.log(f"manager reachable again; delivered {delivered} spooled item(s)")
            return True

    def _note_failing(self, why: str) -> None:
        """Log a retry reason once, until it changes or the manager is reachable again."""
        if why != self._failing:
            self._failing = why
            n = len(self.spool.pending())
            self.log(f"manager not reachable ({why}); {n} item(s) spooled in {self.spool.directory}")

    def _deliver(self, path: str) -> str:
        parsed = parse_name(os.path.basename(path))
        kind = parsed[1] if parsed is not None else "report"
        try:
            with open(path, "rb") as f:
                body = json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:  # delivered by another process meanwhile
            return "ok"
        except (OSError, ValueError) as e:
            body = None
            bad = f"unreadable spool file: {one_line(str(e), 120)}"
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
        self.log(f"{os.path.basename(path)} will not be sent ({one_line(why, 160)}); kept in {where}")

    def report(self, node: str, report: dict[str, Any], interval_s: float | None) -> bool:
        """Send a ``check`` report; True when nothing is left in the spool."""
        body = {"node": node, "id": uuid.uuid4().hex, "report": report, "interval_s": interval_s, "time": iso_now()}
        return self.send("report", body)

    def event(self, node: str, event: dict[str, Any]) -> bool:
        """Send a supervisor event; True when nothing is left in the spool."""
        return self.send("event", {"node": node, "id": uuid.uuid4().hex, "event": event})
