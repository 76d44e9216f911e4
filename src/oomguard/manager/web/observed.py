"""What the manager says of itself (issue 39, item 5): failed tokens counted and logged (a line per
client a minute at most), HTTP requests counted and timed by route and status, the process's own
numbers and the build, all on /metrics beside the fleet's.

- ``oomguard_manager_auth_failures_total{role}``: requests whose token was refused, by the role it
  was tried for (``agent``, ``viewer``, ``reader``, ``admin``); the log line names the client's
  address, the node a node-shaped token claims (never the token) and the reason. Twelve bad tokens
  had left no trace.
- ``oomguard_manager_http_requests_total{route,method,status}`` and
  ``oomguard_manager_http_request_duration_seconds{route,method}`` (a histogram): the route's
  template (``/api/v1/nodes/{name}``, never the path a client chose: bounded labels), ``unmatched``
  for a path no route has; a method outside RFC 9110's (and PATCH) is ``other``.
- ``process_*`` (prometheus_client's ProcessCollector: /proc/self/stat and /proc/self/limits;
  https://prometheus.github.io/client_python/collector/) and ``python_info``.
- ``oomguard_build_info{version,python} 1``.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from oomguard._version import __version__
from oomguard.manager.web.credentials import PREFIX

log = logging.getLogger("oomguard.manager.auth")
LOG_EVERY_S = 60.0  # one line per client a minute at most; the lines between are counted in the next
ROLES = ("agent", "viewer", "reader", "admin")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})  # RFC 9110 section 9 and PATCH
_MAX_CLIENTS = 10_000  # the clients remembered for the log's rate; past it the oldest are forgotten


def claimed_node(token: str | None) -> str | None:
    """The node a node-shaped token (``ogn1.NODE.MAC``) claims, whether or not it is valid; the
    token itself is never logged."""
    if not token or not token.startswith(PREFIX):
        return None
    node = token[len(PREFIX) :].rpartition(".")[0]
    return node[:128] if node and node.isprintable() else None


class AuthFailures:
    """Failed tokens: a counter by role, and a log line per client a minute at most."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(ROLES, 0)
        self._last: dict[str, tuple[float, int]] = {}  # client -> (when its last line was, failures since)
        self._lock = threading.Lock()

    def failed(self, role: str, client: str, token: str | None) -> None:
        now = time.monotonic()
        with self._lock:
            self.counts[role] = self.counts.get(role, 0) + 1
            last, since = self._last.get(client, (-LOG_EVERY_S, 0))
            if now - last < LOG_EVERY_S:
                self._last[client] = (last, since + 1)
                return
            if len(self._last) >= _MAX_CLIENTS:
                self._last.pop(next(iter(self._last)))
            self._last[client] = (now, 0)
        node = claimed_node(token)
        what = "no token" if not token else ("a node's token not signed by a fleet secret" if node else "a wrong token")
        more = f"; {since} more from it since its last line" if since else ""
        log.warning(
            "oomguard manager: refused %s token from %s%s: %s%s",
            role,
            client,
            f" (claims node {node!r})" if node else "",
            what,
            more,
            extra={"event": "auth-failure", "role": role, "client": client, "node": node, "reason": what},
        )


class Observed:
    """The manager's own series, kept for the life of the app."""

    def __init__(self) -> None:
        self.auth = AuthFailures()
        self.requests = Counter(
            "oomguard_manager_http_requests",
            "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=None,
        )
        self.latency = Histogram(
            "oomguard_manager_http_request_duration_seconds",
            "Time from a request's start to its answer's end, by route template and method.",
            ["route", "method"],
            registry=None,
        )
        self.process = ProcessCollector(registry=None)
        self.platform = PlatformCollector(registry=None)

    def collectors(self) -> list[Any]:
        return [self.requests, self.latency, self.process, self.platform, _Build(), _Auth(self.auth)]


class _Build:
    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(
            "oomguard_build_info", "The manager's version and Python (value 1).", labels=["version", "python"]
        )
        g.add_metric([__version__, platform.python_version()], 1.0)
        yield g


class _Auth:
    def __init__(self, auth: AuthFailures) -> None:
        self.auth = auth

    def collect(self) -> Iterator[Metric]:
        c = CounterMetricFamily(
            "oomguard_manager_auth_failures",
            "Requests whose token was refused, by the role it was tried for.",
            labels=["role"],
        )
        for role, n in sorted(self.auth.counts.items()):
            c.add_metric([role], float(n))
        yield c


class HttpMetrics:
    """ASGI middleware: each request's route template, method, status and time (``Observed``)."""

    def __init__(self, app: Any, observed: Observed) -> None:
        self.app = app
        self.observed = observed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [0]

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = str(scope.get("method", ""))
            method = method if method in METHODS else "other"  # a client's made-up method: no label of its own
            self.observed.requests.labels(route, method, str(status[0] or 500)).inc()
            self.observed.latency.labels(route, method).observe(time.perf_counter() - start)
