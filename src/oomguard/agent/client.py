"""One POST to the fleet manager, and what its answer means. Network failures are values.

The manager's contract::

    POST {manager}/api/v1/reports  {"node", "id", "report", "interval_s", "time"}
    POST {manager}/api/v1/events   {"node", "id", "event"}
    POST {manager}/api/v1/observations {"node", "id", "observation"}
    Authorization: Bearer TOKEN

Every answer is one ``Outcome`` kind (RFC 9110 section 15 for the status classes):

- ``ok``: 2xx, stored (a duplicate ``id`` is stored once, so resending is always safe);
- ``retry``: no answer (refused, reset, timed out, no such host), 408 or 429: try again later,
  in order; says nothing about the item;
- ``server``: 5xx: try again later, in order; counted per item (a manager that never takes one
  item must not block the queue: ``spool.GIVE_UP_*``);
- ``token``: 401 or 403, the manager refused the agent's token;
- ``url``: 404, 405 or a redirect (3xx): no manager API at that URL (a redirected POST would be
  replayed as a GET without its body, so redirects are never followed);
- ``rejected``: any other 4xx (400, 409, 413, 422, ...): the manager will never take this item.

Standard library only: the agent runs on every node.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from oomguard._version import __version__
from oomguard.agent.log import one_line
from oomguard.errors import BadParameter

ENDPOINTS = {"report": "reports", "event": "events", "observation": "observations"}
RETRY_4XX = frozenset({408, 429})  # "not now" (RFC 9110 15.5.9, RFC 6585 section 4), not "never"
# A 429 whose Retry-After (RFC 9110 10.2.3: delay-seconds) is this long or longer is a refusal that
# lasts (the manager's caps on distinct profiles and classes: a day): "rejected", so that the queue
# goes on rather than wait behind it.
LASTING_S = 3600
TOKEN_4XX = frozenset({401, 403})
URL_4XX = frozenset({404, 405})
BODY_EXCERPT = 500  # characters of an error answer kept beside a rejected item


@dataclass(frozen=True)
class Outcome:
    """What one POST came to: *kind* (see the module doc), the HTTP *status* when there was an
    answer, *why* (one line for the log) and *body* (an excerpt of the error answer)."""

    kind: str
    status: int | None = None
    why: str = ""
    body: str = ""

    @property
    def delivered(self) -> bool:
        return self.kind == "ok"

    @property
    def later(self) -> bool:
        """Try again later (the item stays in the spool, the queue waits behind it)."""
        return self.kind in ("retry", "server")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """Turn every 3xx into an ``HTTPError``: a redirected POST would come back as a body-less GET."""

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


SHAPE = "http://HOST[:PORT][/PATH] or https://..."
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")  # urlsplit lower-cases the host


def _visible_ascii(text: str) -> bool:
    """Only the characters ``!`` to ``~``: no space, no control, nothing beyond ASCII."""
    return all("!" <= c <= "~" for c in text)


def _host_problem(parts: urllib.parse.SplitResult) -> str | None:
    """Why the URL's host cannot be connected to as written, or None. A name is dot-separated
    labels of 1-63 letters, digits, ``-`` or ``_`` (253 characters at most; the ``idna`` codec that
    ``socket`` encodes a host with raises ``UnicodeError`` for an empty label or a longer one); an
    IP version 6 address is in brackets. ``%`` escapes (``http://%00/``) are no host's."""
    host = parts.hostname or ""
    if "[" in parts.netloc:
        import ipaddress

        try:
            ipaddress.IPv6Address(host)
        except ValueError:  # Python 3.11's urlsplit refuses it already, 3.10's does not: one answer on both
            return f"the URL must be {SHAPE}"
        return None
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(0 < len(label) <= 63 and set(label) <= _HOST_CHARS for label in name.split(".")):
        return (
            "the URL's host must be a name (dot-separated labels of 1-63 letters, digits, '-' or '_') or an IP address"
        )
    return None


def check_manager(manager: str) -> str:
    """The manager's base URL without trailing slashes; ``BadParameter("manager")``, one line,
    unless it is an http(s) URL of visible ASCII (percent-encode the path, punycode the host)
    with a host that can be connected to, and no user, query or fragment."""
    base = manager.strip().rstrip("/")
    if not _visible_ascii(base):
        why = "no spaces, control or non-ASCII characters: percent-encode them, punycode a host"
        raise BadParameter("manager", f"the URL must be visible ASCII ({why}), got {manager!r}")
    try:
        parts = urllib.parse.urlsplit(base)
        _ = parts.port  # raises ValueError for a port that is not a number, or out of range
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadParameter("manager", f"the URL must be {SHAPE}, got {manager!r}")
    if parts.query or parts.fragment:
        raise BadParameter("manager", f"the URL must not have a query or fragment, got {manager!r}")
    if parts.username is not None or parts.password is not None:
        raise BadParameter("manager", "the URL must not carry a user or password (the manager takes a bearer token)")
    problem = _host_problem(parts)
    if problem is not None:
        raise BadParameter("manager", f"{problem}, got {manager!r}")
    return base


TOKEN_RULE = "only visible ASCII characters, no spaces (what an HTTP header carries and the manager accepts)"


def check_token(token: str) -> str:
    """*token* without surrounding white space; ``BadParameter("token")`` unless it is visible
    ASCII (``!`` to ``~``), as the manager's own rule (``manager/settings.py``): a header carries
    Latin-1 at most (``http.client`` raises ``UnicodeEncodeError`` beyond), and a space or a
    control character could not travel in one. The message never repeats the token."""
    token = token.strip()
    if not _visible_ascii(token):
        raise BadParameter("token", f"must hold {TOKEN_RULE}")
    return token


def network_why(err: BaseException) -> str:
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


def _read_error_body(err: urllib.error.HTTPError) -> str:
    try:
        data = err.read(65536)
    except Exception:  # the body of an error answer is a courtesy: its loss is not a failure
        data = b""
    finally:
        with contextlib.suppress(Exception):
            err.close()
    return data.decode("utf-8", "replace") if data else ""


def _detail(text: str) -> str:
    """A short reason from an error body (``{"error"|"detail"|"message": str}`` or plain text)."""
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for key in ("error", "detail", "message"):
            if isinstance(parsed.get(key), str):
                return one_line(parsed[key], 120)
    if not text or text.lstrip().startswith("<"):  # an HTML error page says nothing useful on one line
        return ""
    return one_line(text, 120)


def _kind_of(status: int) -> str:
    if 300 <= status < 400 or status in URL_4XX:
        return "url"
    if status in TOKEN_4XX:
        return "token"
    if status in RETRY_4XX:
        return "retry"
    if 400 <= status < 500:
        return "rejected"
    return "server"


def http_outcome(err: urllib.error.HTTPError) -> Outcome:
    """The ``Outcome`` of an error answer (3xx, 4xx, 5xx)."""
    text = _read_error_body(err)
    detail = _detail(text)
    why = f"{err.code} {err.reason}" + (f": {detail}" if detail else "")
    if 300 <= err.code < 400:
        where = err.headers.get("Location", "?") if err.headers is not None else "?"
        why += f" (redirect to {one_line(where, 100)})"
    kind = _kind_of(err.code)
    if err.code == 429 and _retry_after_s(err) >= LASTING_S:
        kind = "rejected"
    return Outcome(kind, err.code, why, one_line(text, BODY_EXCERPT))


def _retry_after_s(err: urllib.error.HTTPError) -> int:
    """The answer's ``Retry-After`` in seconds (delay-seconds only); 0 when absent or another form."""
    value = (err.headers.get("Retry-After", "") if err.headers is not None else "").strip()
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 9 else 0


class Client:
    """POSTs items to the manager at *manager* with bearer *token*. ``BadParameter`` naming the
    parameter for a bad URL or token."""

    def __init__(self, manager: str, token: str, *, timeout: float = 10.0) -> None:
        self.manager = check_manager(manager)
        self.token = check_token(token)
        self.timeout = timeout
        self._opener = urllib.request.build_opener(NoRedirect())

    def url(self, kind: str) -> str:
        if kind not in ENDPOINTS:
            raise ValueError(f"unknown item kind {kind!r} (expected report or event)")
        return f"{self.manager}/api/v1/{ENDPOINTS[kind]}"

    def _request(self, kind: str, body: dict[str, Any]) -> urllib.request.Request:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"oomguard-agent/{__version__}",
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body, separators=(",", ":")).encode("utf-8")
        return urllib.request.Request(self.url(kind), data=data, method="POST", headers=headers)

    def post(self, kind: str, body: dict[str, Any]) -> Outcome:
        """One POST of *body* to the *kind* endpoint. Network errors never raise."""
        return self.post_within(kind, body, self.timeout)

    def post_within(self, kind: str, body: dict[str, Any], timeout: float) -> Outcome:
        """``post``, each network operation within *timeout* seconds (not the client's)."""
        req = self._request(kind, body)
        try:
            # the status line said stored; the rest of the answer does not matter
            with self._opener.open(req, timeout=timeout) as resp:
                status = int(resp.status)
                with contextlib.suppress(OSError, http.client.HTTPException):
                    resp.read(1 << 20)
            return Outcome("ok", status)
        except urllib.error.HTTPError as e:
            return http_outcome(e)
        except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException, UnicodeError) as e:
            # UnicodeError: the idna codec on a host ``check_manager`` let through; a value, never a dead thread
            return Outcome("retry", None, network_why(e))
