"""The manager on a real loopback socket under its real uvicorn set-up (``build_server``), in a
thread, and the raw-socket moves the wire tests make: connect from a chosen loopback address,
a one-shot GET, and dripping bytes until the server closes (tests/integration/test_manager_hardening.py,
tests/integration/test_manager_connections.py)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from oomguard.manager.web.server import bind, build_server
from tests.helpers.wait import wait_until


class LiveServer:
    """*app* served by ``build_server(app, **kwargs)`` (defaults: a cap of 100 connections, 1 s for
    the headers, no log set-up) on a free loopback port, in a daemon thread."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        args: dict[str, Any] = {"max_connections": 100, "header_timeout_s": 1.0, "redactor": None, "log": False}
        self.server = build_server(app, **{**args, **kwargs})
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        wait_until(lambda: self.server.started, what="the server to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        """A connection from the loopback address *source* (each 127.x address is a client)."""
        return socket.create_connection(("127.0.0.1", self.port), timeout=10, source_address=(source, 0))

    def get(self, path: str = "/healthz", source: str = "127.0.0.1") -> tuple[int, float]:
        """(the status of one ``GET path`` on a connection of its own, seconds it took)."""
        start = time.monotonic()
        with self.connect(source) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
            head = s.recv(4096)
        return int(head.split(b" ")[1]), time.monotonic() - start


def until_closed(
    s: socket.socket, drip: bytes = b"", every_s: float = 0.2, limit_s: float = 8.0
) -> tuple[bytes, float]:
    """Send *drip* a byte every *every_s* until the server closes (or *limit_s*): what it
    answered, and after how many seconds."""
    start, got, sent = time.monotonic(), b"", 0
    s.settimeout(every_s)
    while time.monotonic() - start < limit_s:
        if sent < len(drip):
            try:
                s.sendall(drip[sent : sent + 1])
            except OSError:
                break
            sent += 1
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return got, time.monotonic() - start
