"""Serving the app: uvicorn, set up so that no single client can stop the manager.

- File descriptors: the soft RLIMIT_NOFILE is raised to the hard limit at start (getrlimit(2):
  an unprivileged process may raise its soft limit up to the hard one); the connection cap stays
  below it, so the manager always has descriptors left for its database and its own files.
- A connection cap (``--max-connections``, uvicorn's ``limit_concurrency``): above it a request
  gets 503 at once, and a connection that has not sent its request is closed after
  ``OVERLOAD_TIMEOUT_S`` instead of ``header_timeout_s``.
- Incomplete requests time out: uvicorn (0.54) starts its keep-alive timer only after a
  response, so a connection that never completes its headers would be held for ever;
  ``GuardedH11Protocol`` closes it after ``header_timeout_s`` (with 408 when some bytes came). A
  body that trickles is cut off by the ``BodyLimit`` middleware (408).
- Logs: one line per message, passwords and tokens masked (``RedactingFormatter``), and each kind
  of message at most ``LOG_BURST`` times a minute (``RateLimitFilter``; the next one that passes
  says how many were dropped). A flood of bad requests cannot fill the disk.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import resource
import socket
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from oomguard.errors import UsageError
from oomguard.manager.redact import RedactingFormatter, Redactor

NR_OPEN_DEFAULT = 1_048_576  # Linux's fs.nr_open default: the most a soft limit can be when hard is unlimited
FD_RESERVE = 128  # descriptors kept for the database, logs and files when the cap is clamped
OVERLOAD_TIMEOUT_S = 1.0
LOG_BURST = 20
LOG_WINDOW_S = 60.0
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


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


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers."""

    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: Any = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._awaiting_headers():
            self._arm()  # a deadline from the first byte of a request, not renewed by each byte
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _awaiting_headers(self) -> bool:
        return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

    def _arm(self) -> None:
        if self._header_timer is None:
            limit = self.limit_concurrency
            over = limit is not None and len(self.connections) > limit
            timeout = OVERLOAD_TIMEOUT_S if over else self.header_timeout_s
            self._header_timer = self.loop.call_later(timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _timed_out(self) -> None:
        self._header_timer = None
        if self._awaiting_headers():
            if self.conn.trailing_data[0]:  # part of a request came: say why it is closed
                self.transport.write(_408)
            self.transport.close()


def guarded_protocol(header_timeout_s: float) -> type[GuardedH11Protocol]:
    return type("GuardedH11", (GuardedH11Protocol,), {"header_timeout_s": header_timeout_s})


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


def logging_config(redactor: Redactor) -> dict[str, Any]:
    """uvicorn's ``log_config``: everything to stderr, masked and rate-limited; no access log."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"masked": {"()": RedactingFormatter, "fmt": LOG_FORMAT, "redactor": redactor}},
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
    app: Any, *, max_connections: int, header_timeout_s: float, redactor: Redactor | None, log: bool = True
) -> Any:
    """The uvicorn server (``log=False`` leaves the process's logging as it is: tests in-process)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        http=guarded_protocol(header_timeout_s),
        limit_concurrency=max_connections,
        timeout_keep_alive=5,
        log_config=logging_config(redactor or Redactor()) if log else None,
        access_log=False,
        timeout_graceful_shutdown=10,
        lifespan="on",
    )
    return uvicorn.Server(config)


def serve(app: Any, sock: socket.socket, *, max_connections: int, header_timeout_s: float, redactor: Redactor) -> None:
    """Run uvicorn on *sock* until stopped (SIGINT, SIGTERM)."""
    build_server(app, max_connections=max_connections, header_timeout_s=header_timeout_s, redactor=redactor).run(
        sockets=[sock]
    )
