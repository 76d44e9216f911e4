"""Serving the app: uvicorn, set up so that no single client can stop the manager.

- File descriptors: the soft RLIMIT_NOFILE is raised to the hard limit at start (getrlimit(2):
  an unprivileged process may raise its soft limit up to the hard one); the connection cap stays
  ``FD_RESERVE`` below it (``connection_cap``), so the manager always has descriptors left for
  its database, its logs and the ``OVERFLOW_SLOTS`` connections that get a 503.
- Fair connections (``web.connections``): each client (peer address; an IPv6 /64) may hold at
  most ``per_client_cap`` connections, at most half the global cap (``DEFAULT_PER_CLIENT`` by
  default), and all clients together ``max_connections + OVERFLOW_SLOTS``; over either, a new
  connection is closed as it is accepted. A trusted proxy's address (``trusted_proxies``) has
  only the global cap: it carries many clients, and at accept time no forwarded address is known.
- The 503 cap (``--max-connections``, uvicorn's ``limit_concurrency``): above it a request gets
  503 at once, and a connection that has not sent its request is closed after
  ``protocol.OVERLOAD_TIMEOUT_S`` instead of ``header_timeout_s``.
- Room for what matters (issue 37, item 4): a protected request (``web.priority``: /healthz, or a
  valid token or session) is served above the 503 cap, and when every place is taken a new
  connection evicts an unprotected one of the client holding the most (``connections.Admission``),
  so clients without a token, from a few dozen addresses, cannot starve /healthz and the agents.
- Deadlines for every connection and method (``protocol.GuardedH11Protocol``): uvicorn (0.54) starts its
  keep-alive timer only after a response and cancels it on any byte, even a byte of a body it will
  never read; so a connection's headers must arrive within ``header_timeout_s`` (408 when some
  bytes came), its body within ``body_timeout_s`` (+ ``BODY_GRACE_S``, so that ``BodyLimit``'s
  408 comes first when the app is reading) whatever the method and whether or not an answer went
  out already, and a connection idle between requests is closed after ``keep_alive_s``. A GET,
  HEAD or OPTIONS request that announces a body gets 400 and the connection is closed as soon as
  its headers are in, before any app code runs (``protocol.BodylessGuard``; ``middleware.BodyLimit`` has
  the same rule for the app run by any other server).
- ``X-Forwarded-*`` are not uvicorn's to believe (``proxy_headers=False``): ``web.proxies``
  believes them from ``trusted_proxies`` only.
- Logs: one line per message (text, or JSON with ``--log-format json``: ``manager.logs``), passwords
  and tokens masked (``Redactor``), and each kind
  of message at most ``LOG_BURST`` times a minute (``RateLimitFilter``; the next one that passes
  says how many were dropped). A flood of bad requests cannot fill the disk. Running out of
  descriptors while accepting (EMFILE) is one such line, not asyncio's traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import time
from collections.abc import Sequence
from typing import Any

import uvicorn

from oomguard.errors import UsageError
from oomguard.manager.logs import formatter
from oomguard.manager.redact import Redactor, first_line
from oomguard.manager.settings import PER_CLIENT_DEFAULT
from oomguard.manager.web.connections import OUT_OF_DESCRIPTORS, Admission, GuardedListener
from oomguard.manager.web.priority import classifier
from oomguard.manager.web.protocol import BODY_TIMEOUT_S, guarded_protocol
from oomguard.manager.web.proxies import Network

NR_OPEN_DEFAULT = 1_048_576  # Linux's fs.nr_open default: the most a soft limit can be when hard is unlimited
FD_RESERVE = 128  # descriptors kept for the database, logs, files and OVERFLOW_SLOTS when the cap is clamped
OVERFLOW_SLOTS = 32  # connections accepted above the 503 cap, to tell them 503 at once
# One client (address) may hold this many connections (the default is the settings', one definition):
# an agent holds one, a browser at most 6 per host (HTTP/1.1; Chromium's and Firefox's per-host
# pool), a few dozen agents share a NAT address, and bench/ingest.py's 50 keep-alive clients fit; a
# fifteenth of the default cap (1000), so one address leaves the others 936 of it, and 832 of the
# 896 that a 1,024 descriptor limit gives.
DEFAULT_PER_CLIENT = PER_CLIENT_DEFAULT
KEEP_ALIVE_S = 5.0  # an idle connection between requests is closed after this
LOG_BURST = 20
EMFILE_LOG_EVERY_S = 10.0
LOG_WINDOW_S = 60.0
_log = logging.getLogger("oomguard.manager.connections")


def raise_nofile() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (or fs.nr_open's default when unlimited); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NR_OPEN_DEFAULT if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):  # a lower nr_open: keep the soft limit, the cap adapts
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return NR_OPEN_DEFAULT if soft == resource.RLIM_INFINITY else int(soft)


def connection_cap(requested: int, nofile: int) -> int:
    """*requested*, or less when the descriptor limit would not leave FD_RESERVE free."""
    return max(8, min(requested, nofile - FD_RESERVE))


def per_client_cap(per_client: int, global_cap: int) -> int:
    """*per_client*, at most half of *global_cap* (and at least 1): one client never holds more
    than half of the connections, whatever the flags say."""
    return max(1, min(per_client, global_cap // 2))


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the server starts, so a bad address is a one-line error."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"--port: port {port} is already in use on {host}") from None
        if exc.errno == errno.EACCES:
            raise UsageError(f"--port: port {port} needs privileges this process does not have") from None
        if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
            raise UsageError(f"--host: {host} is not an address of this machine") from None
        raise UsageError(f"manager: cannot listen on {host} port {port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def one_line(exc: BaseException) -> str:
    """An exception in one line, at most 300 characters (the log formatter masks the secrets)."""
    return f"{type(exc).__name__}: {first_line(exc)}"[:300]


class AcceptFailed:
    """The event loop's exception handler: a failure nobody retrieved is one line (never a
    traceback); running out of descriptors (or memory) in ``accept()``
    is one warning line at most every ``every_s`` (with how many times it happened since the last
    line), not asyncio's traceback for each ("socket.accept() out of system resource", which
    ``BaseSelectorEventLoop._accept_connection`` reports, then retries after
    ``asyncio.constants.ACCEPT_RETRY_DELAY`` = 1 s); anything else goes to asyncio's default."""

    def __init__(self, every_s: float = EMFILE_LOG_EVERY_S) -> None:
        self.every_s = every_s
        self.last = -every_s
        self.since = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = str(context.get("message"))
        if "never retrieved" in message and isinstance(exc, Exception):
            # A future or task whose failure nobody awaited any more (its request timed out): the
            # fault is already answered 503 and logged once per episode (``store.health``). One line,
            # not asyncio's traceback for each (issue 37: 22 in 84 s while PostgreSQL hung).
            _log.warning("%s: %s", message.splitlines()[0], one_line(exc))
            return
        accept = "accept" in message
        if not (accept and isinstance(exc, OSError) and exc.errno in OUT_OF_DESCRIPTORS):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self.last < self.every_s:
            self.since += 1
            return
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        more = f"; {self.since} more since the last line" if self.since else ""
        _log.warning("cannot accept connections (%s: %s); new connections wait 1 s%s", name, exc.strerror, more)
        self.last, self.since = now, 0


class GuardedServer(uvicorn.Server):
    """uvicorn's server on guarded listening sockets (``connections.GuardedListener``), with
    ``AcceptFailed`` as its loop's exception handler. Sockets must be passed to ``run``/``serve``."""

    def __init__(self, config: uvicorn.Config, admission: Admission) -> None:
        super().__init__(config)
        self.admission = admission

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().set_exception_handler(AcceptFailed())
        if sockets is not None:
            sockets = [GuardedListener.wrap(s, self.admission) for s in sockets]
        await super().startup(sockets=sockets)


class RateLimitFilter(logging.Filter):
    """At most *burst* records of one kind (logger and message template) per *window_s*."""

    def __init__(self, burst: int = LOG_BURST, window_s: float = LOG_WINDOW_S) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self._seen: dict[tuple[str, str], list[float]] = {}  # key -> [window start, passed, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        now = time.monotonic()
        state = self._seen.setdefault(key, [now, 0.0, 0.0])
        if now - state[0] >= self.window_s:
            dropped = int(state[2])
            state[:] = [now, 0.0, 0.0]
            if dropped:
                record.msg = f"{record.msg} [{dropped} more like this dropped in the last {self.window_s:g}s]"
        state[1] += 1
        if state[1] > self.burst:
            state[2] += 1
            return False
        return True


def logging_config(redactor: Redactor, log_format: str = "text") -> dict[str, Any]:
    """uvicorn's ``log_config``: everything to stderr, masked and rate-limited, as text or JSON
    (``manager.logs``); no access log."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"masked": {"()": formatter, "log_format": log_format, "redactor": redactor}},
        "filters": {"rate": {"()": RateLimitFilter}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "masked",
                "filters": ["rate"],
            }
        },
        "root": {"level": "WARNING", "handlers": ["stderr"]},
        "loggers": {
            "uvicorn": {"level": "WARNING", "handlers": [], "propagate": True},
            "uvicorn.error": {"level": "WARNING", "handlers": [], "propagate": True},
            "uvicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
        },
    }


def build_server(
    app: Any,
    *,
    max_connections: int,
    header_timeout_s: float,
    redactor: Redactor | None,
    log: bool = True,
    per_client_connections: int = DEFAULT_PER_CLIENT,
    trusted_proxies: Sequence[Network] = (),
    body_timeout_s: float | None = None,
    keep_alive_s: float = KEEP_ALIVE_S,
    log_format: str = "text",
) -> GuardedServer:
    """The uvicorn server (``log=False`` leaves the process's logging as it is: tests in-process).
    *max_connections* is the 503 cap (already fitted to the descriptor limit: ``connection_cap``);
    *body_timeout_s* defaults to the app's ``state.settings.body_timeout_s`` when it has one."""
    if body_timeout_s is None:
        settings = getattr(getattr(app, "state", None), "settings", None)
        body_timeout_s = float(getattr(settings, "body_timeout_s", BODY_TIMEOUT_S))
    admission = Admission(
        per_client_cap(per_client_connections, max_connections), max_connections + OVERFLOW_SLOTS, trusted_proxies
    )
    config = uvicorn.Config(
        app,
        http=guarded_protocol(header_timeout_s, body_timeout_s, admission, classifier(app)),
        limit_concurrency=max_connections,
        timeout_keep_alive=keep_alive_s,  # type: ignore[arg-type]
        proxy_headers=False,
        log_config=logging_config(redactor or Redactor(), log_format) if log else None,
        access_log=False,
        timeout_graceful_shutdown=10,
        lifespan="on",
    )
    return GuardedServer(config, admission)


def serve(
    app: Any,
    sock: socket.socket,
    *,
    max_connections: int,
    header_timeout_s: float,
    redactor: Redactor,
    per_client_connections: int = DEFAULT_PER_CLIENT,
    trusted_proxies: Sequence[Network] = (),
    body_timeout_s: float | None = None,
    log_format: str = "text",
) -> None:
    """Run uvicorn on *sock* until stopped (SIGINT, SIGTERM)."""
    build_server(
        app,
        max_connections=max_connections,
        header_timeout_s=header_timeout_s,
        redactor=redactor,
        per_client_connections=per_client_connections,
        trusted_proxies=trusted_proxies,
        body_timeout_s=body_timeout_s,
        log_format=log_format,
    ).run(sockets=[sock])
