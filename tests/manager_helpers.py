"""Shared set-up for the manager tests: databases (a real SQLite file, a real PostgreSQL) and servers."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tests.conftest import FIXTURES, REPO

AGENT = "agent-secret-token"
VIEWER = "viewer-secret-token"
AGENT_H = {"Authorization": f"Bearer {AGENT}"}
VIEWER_H = {"Authorization": f"Bearer {VIEWER}"}
GiB = 1024**3


def fixture_report(case: str = "original_503g_host_342g_v2_container", **budget: Any) -> dict[str, Any]:
    """A real report, probed from a fixture tree."""
    from oomguard import probe
    from oomguard.sources.root import DirRoot

    report: dict[str, Any] = probe(root=DirRoot(str(FIXTURES / case / "root")), **budget)  # type: ignore[assignment]
    return copy.deepcopy(report)


def envelope(node: str, report: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"node": node, "id": uuid.uuid4().hex, "report": report, **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ManagerProcess:
    """``oomguard manager`` as a real process (uvicorn), for crash and wire-level tests."""

    def __init__(self, db_url: str, *args: str) -> None:
        self.db_url = db_url
        self.args = args
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ManagerProcess:
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "oomguard",
                "manager",
                "--db",
                self.db_url,
                "--port",
                str(self.port),
                "--agent-token",
                AGENT,
                "--viewer-token",
                VIEWER,
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                    raise RuntimeError(f"manager did not start: {err}") from None
                time.sleep(0.05)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data))
