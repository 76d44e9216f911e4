"""A stand-in for CuZK's status server on a real socket (127.0.0.1), answering as the real one does.

The real server (filecoin-project/curio e0294b0, extern/cuzk/cuzk-daemon/src/main.rs L121-203) is
raw TCP: it reads up to 4 KiB of the request, answers a request line starting ``GET /status`` with
``HTTP/1.1 200 OK``, ``Content-Type: application/json``, ``Content-Length``,
``Access-Control-Allow-Origin: *``, ``Connection: close`` and the snapshot's JSON, anything else
with a 404 and ``404 Not Found\\n``; then it closes. This one does the same with the fixture
(tests/fixtures/cuzk/status.json), or, by ``mode``, misbehaves: ``garbage`` (200, not JSON),
``hang`` (never answers), ``drip`` (the headers, then a byte every 0.2 s), ``redirect`` (302),
``latin1`` (200, a body that is not UTF-8), ``error`` (CuZK's own 500).
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STATUS_JSON = Path(__file__).resolve().parent.parent / "fixtures" / "cuzk" / "status.json"


def status_fixture() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(STATUS_JSON.read_text())
    return data


def _response(status: str, ctype: str, body: bytes, cors: bool = True) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
    if cors:
        head += "Access-Control-Allow-Origin: *\r\n"
    return (head + "Connection: close\r\n\r\n").encode() + body


class FakeCuzk:
    """CuZK's status server in a thread; ``body`` is what ``GET /status`` answers (the fixture's
    JSON unless changed), ``mode`` how it misbehaves (None: not at all)."""

    def __init__(self, body: bytes | None = None, mode: str | None = None) -> None:
        self.body = STATUS_JSON.read_bytes() if body is None else body
        self.mode = mode
        self.requests: list[str] = []
        self.stop_event = threading.Event()
        fake = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data = self.request.recv(4096)
                first = data.decode("utf-8", "replace").split("\r\n", 1)[0]
                fake.requests.append(first)
                self.request.sendall(fake.answer(first, self.request))

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answer(self, first: str, sock: Any) -> bytes:
        if not first.startswith("GET /status"):
            return _response("404 Not Found", "text/plain", b"404 Not Found\n", cors=False)
        if self.mode == "hang":
            self.stop_event.wait(30)
            return b""
        if self.mode == "drip":
            sock.sendall(_response("200 OK", "application/json", self.body)[: -len(self.body)])
            for byte in self.body:
                if self.stop_event.wait(0.2):
                    break
                sock.sendall(bytes([byte]))
            return b""
        if self.mode == "redirect":
            return b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        if self.mode == "error":
            error = b'{"error":"key must be a string"}'  # main.rs L165-180: serde_json's error, quoted
            return _response("500 Internal Server Error", "application/json", error)
        body = {"garbage": b"<html>not json</html>", "latin1": b'{"memory": "\xe9t\xe9"}'}.get(
            self.mode or "", self.body
        )
        return _response("200 OK", "application/json", body)

    def close(self) -> None:
        self.stop_event.set()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def fake_cuzk(body: bytes | None = None, mode: str | None = None) -> Iterator[FakeCuzk]:
    server = FakeCuzk(body, mode)
    try:
        yield server
    finally:
        server.close()
