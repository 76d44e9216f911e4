"""A small fake fleet manager (a real HTTP server in a thread) and helpers for the agent tests."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from oomguard.agent import Spool

TOKEN = "s3cret-token"


class FakeManager:
    """Records every POST, stores each id once (like the real manager), answers ``status``
    (``status_for[id]`` beats it); ``drop_next`` requests are stored and then the socket is closed
    without an answer."""

    def __init__(self) -> None:
        self.status = 200
        self.status_for: dict[str, int] = {}
        self.drop_next = 0
        self.headers: dict[str, str] = {}  # sent with every answer (Retry-After, say)
        self.requests: list[dict[str, Any]] = []
        self.stored: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def received_ids(self) -> list[str]:
        return [r["body"]["id"] for r in self.requests]

    def stored_reports(self) -> list[Any]:
        return [self.stored[i].get("report") for i in self.order]

    def start(self, port: int = 0) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def _answer_for(self, body: dict[str, Any]) -> tuple[int, bool]:
        """(status, drop) for one POST; stores it on 200."""
        with self.lock:
            status = self.status_for.get(body["id"], self.status)
            if status == 200 and body["id"] not in self.stored:
                self.stored[body["id"]] = body
                self.order.append(body["id"])
            drop = status == 200 and self.drop_next > 0
            if drop:
                self.drop_next -= 1
        return status, drop


def _handler_for(manager: FakeManager) -> type[BaseHTTPRequestHandler]:
    """The request handler of *manager*: it records, stores, drops and answers as told."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, payload: dict[str, Any], extra: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            with manager.lock:
                manager.requests.append({"method": "GET", "path": self.path, "body": {"id": None}})
            self._answer(200, {"looks": "like success"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with manager.lock:
                manager.requests.append(
                    {
                        "method": "POST",
                        "path": self.path,
                        "auth": self.headers.get("Authorization"),
                        "ctype": self.headers.get("Content-Type"),
                        "body": body,
                    }
                )
            status, drop = manager._answer_for(body)
            if drop:  # stored, but the answer never arrives
                self.close_connection = True
                return
            extra = {"Location": "https://elsewhere.example/api"} if 300 <= status < 400 else {}
            extra.update(manager.headers)
            self._answer(status, {"error": f"fake answer {status}"} if status >= 300 else {"stored": True}, extra)

    return Handler


def running_manager() -> Iterator[FakeManager]:
    """A started FakeManager, stopped afterwards (the body of a fixture)."""
    m = FakeManager()
    m.start()
    yield m
    m.stop()


def unused_port_url() -> str:
    """A URL on a port with nothing listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def drop_proxy_variables(environ: dict[str, str]) -> list[str]:
    """Names of the *_proxy variables (urllib honours them; the fake manager is reached directly)."""
    return [k for k in environ if k.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")]


class Logs(list[str]):
    """A ``log`` callable that keeps the lines and checks each is one line without a traceback."""

    def __call__(self, line: str) -> None:
        assert "\n" not in line and "Traceback" not in line
        self.append(line)


def names(paths: list[str]) -> list[str]:
    return [os.path.basename(p) for p in paths]


def put_reports(spool: Spool, n: int) -> list[str]:
    ids = [f"id{i:03d}" for i in range(n)]
    for i in ids:
        spool.put("report", {"node": "n1", "id": i, "report": {"i": i}, "interval_s": None})
    return ids


def agent_args(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """``run_agent`` keywords for a loop against nothing (override *manager* to reach one)."""
    args: dict[str, Any] = {
        "manager": "http://127.0.0.1:9",
        "token": TOKEN,
        "node": "n1",
        "interval": 10,
        "once": False,
        "spool_dir": str(tmp_path / "spool"),
        "make_report": dict,
        "log": Logs(),
    }
    return {**args, **overrides}


def why_of(rejected: Path, name: str) -> dict[str, Any]:
    """The JSON reason beside a rejected item."""
    return json.loads((rejected / f"{name}.why").read_text())  # type: ignore[no-any-return]
