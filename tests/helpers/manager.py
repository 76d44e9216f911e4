"""Shared set-up for the manager tests: databases (a real SQLite file, a real PostgreSQL) and servers."""

from __future__ import annotations

import atexit
import copy
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.conftest import FIXTURES, REPO
from tests.helpers.pg import PostgresServer
from tests.helpers.wait import wait_until

if TYPE_CHECKING:
    from oomguard.manager.store import Store

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


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place inside a JSON value (keys and list indexes from the top), the value itself left out."""
    out = []
    if isinstance(value, dict):
        for key, sub in value.items():
            out += [(*prefix, key), *json_paths(sub, (*prefix, key))]
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            out += [(*prefix, i), *json_paths(sub, (*prefix, i))]
    return out


_PG = PostgresServer()


def shared_pg() -> PostgresServer:
    """The one throwaway PostgreSQL server of this test session (started on first use, stopped at exit).
    Raises ``RuntimeError`` with the reason when it cannot run here."""
    why = _PG.unavailable()
    if why:
        raise RuntimeError(why)
    if _PG.proc is None:
        _PG.start()
        atexit.register(_stop_pg)
    return _PG


def write_latest(conn: Any, node_ids: Any, received_ms: int, report_json: str) -> None:
    """Each node's latest whole report (the node page's), written straight into the database."""
    from sqlalchemy import insert

    from oomguard.manager.db import latest_reports

    rows = [{"node_id": i, "received_ms": received_ms, "report": report_json} for i in node_ids]
    conn.execute(insert(latest_reports), rows)


def write_history(engine: Any, n_nodes: int, times_of: Any, batch: int) -> int:
    """Stored reports of nodes 1..*n_nodes* at the receive times ``times_of(node_id)`` (the 342 GiB
    container's numbers), written straight into the database, *batch* nodes a transaction; the
    number of rows written."""
    from sqlalchemy import insert

    from oomguard.manager.db import reports

    total = 0
    for first in range(1, n_nodes + 1, batch):
        rows = [
            {
                "node_id": node_id,
                "ingest_id": f"r-{node_id}-{k}",
                "received_ms": t,
                "effective_bytes": 342 << 30,
                "budget_bytes": 332 << 30,
                "usage_bytes": (200 + k % 50) << 30,
                "working_set_bytes": (150 + k % 40) << 30,
            }
            for node_id in range(first, min(first + batch, n_nodes + 1))
            for k, t in enumerate(times_of(node_id))
        ]
        with engine.begin() as conn:
            conn.execute(insert(reports), rows)
        total += len(rows)
    return total


def pg_or_skip() -> PostgresServer:
    """``shared_pg()``, or pytest.skip, saying why on stderr, where PostgreSQL cannot run here."""
    import pytest

    try:
        return shared_pg()
    except RuntimeError as why:
        print(f"\nSKIP PostgreSQL tests: {why}", file=sys.stderr)
        pytest.skip(str(why))


def db_url_of(kind: str, tmp_path: Path, prefix: str, filename: str = "oomguard.db") -> str:
    """A database URL of *kind*, for fixtures parametrized by kind: "sqlite", a file *filename* in
    *tmp_path*; "postgresql", a fresh database on the shared server, named *prefix* + random."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / filename}"
    name = prefix + uuid.uuid4().hex[:12]
    url = pg_or_skip().create_db(name)
    _CREATED.append(name)
    return url


_CREATED: list[str] = []  # the databases db_url_of made on the shared server since release_databases


def release_databases() -> None:
    """Close the connections still open to the databases ``db_url_of`` made since the last call
    (tests/conftest.py calls it at the end of each test module). A test's engines and stores are
    dropped, not disposed, and a store's writer thread keeps its engine, with its pooled
    connections, alive: a run of the manager's tests held 162 idle ones before
    tests/manager/test_manager_live.py, whose next tests met the server's max_connections (200: "sorry,
    too many clients already")."""
    if not _CREATED or _PG.proc is None or _PG.proc.poll() is not None:
        _CREATED.clear()
        return
    import psycopg

    names = list(_CREATED)
    _CREATED.clear()
    with psycopg.connect(_PG.url("postgres"), autocommit=True) as conn:
        terminate = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ANY(%s)"
        conn.execute(terminate, (names,))


def migrated_db(kind: str, tmp_path: Path, prefix: str) -> str:
    """``db_url_of``, migrated to the head revision."""
    from oomguard.manager.db import migrate

    url = db_url_of(kind, tmp_path, prefix)
    migrate(url)
    return url


def observation_body(**kw: Any) -> dict[str, Any]:
    """An observation (``POST /api/v1/observations``'s ``observation``) of profile cuzk-porep that
    fits the fixture report's 342 GiB container: 4 jobs of 14 GiB declared, 10 GiB seen; *kw* over it."""
    return {
        "profile": "cuzk-porep",
        "declared_per_job_bytes": 14 * GiB,
        "peak_per_job_bytes": 10 * GiB,
        "declared_baseline_bytes": 40 * GiB,
        "peak_baseline_bytes": 30 * GiB,
        "concurrency": 4,
        "outcome": "ok",
        "time": "2027-01-15T08:00:00Z",
        **kw,
    }


def exit_event_body(reason: str = "oom-kill", time: str = "2027-01-15T08:00:00Z") -> dict[str, Any]:
    """The exit event ``run`` sends beside a failed run's observation (the same ``time``, which
    confirms it: ``store/claims.py``); *time*: ``observation_body``'s by default."""
    return {"event": "exit", "reason": reason, "time": time, "signal": 9, "concurrency": 4}


def _stop_pg() -> None:
    """SIGINT first: PostgreSQL's fast shutdown, which does not wait for the pools' idle connections."""
    if _PG.proc is not None and _PG.proc.poll() is None:
        _PG.proc.send_signal(signal.SIGINT)
    _PG.stop()


def local_client(app: Any) -> Any:
    """A TestClient that speaks to the app as http://localhost (a Host the default allow-list accepts)."""
    from fastapi.testclient import TestClient

    return TestClient(app, base_url="http://localhost")


def envelope(node: str, report: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"node": node, "id": uuid.uuid4().hex, "report": report, **extra}


class Clock:
    """The manager's clock (epoch ms), moved by the test."""

    def __init__(self, t: int) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def make_store(url: str, clock: Clock, **kw: Any) -> Store:
    """The manager's store on *url*, in process, on the test's *clock*."""
    from oomguard.manager.db import make_engine
    from oomguard.manager.store import Store

    return Store(make_engine(url), clock=clock, **kw)


@functools.cache
def _default_report() -> dict[str, Any]:
    return fixture_report()  # probed once, on first use


def ingest(store: Store, node: str, *, agent_ms: int | None = None, ingest_id: str | None = None, **extra: Any) -> bool:
    """One report of *node* into *store* as the API would hand it over (``report=`` in *extra*:
    that report instead of the default fixture's); whether it was stored (False: a duplicate)."""
    import asyncio

    from oomguard.manager.bodies import ReportEnvelope

    body = envelope(node, extra.pop("report") if "report" in extra else _default_report(), **extra)
    body["id"] = ingest_id or body["id"]
    env = ReportEnvelope.model_validate(body)
    return asyncio.run(store.ingest_report_async(env, json.dumps(env.report), agent_ms))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ManagerProcess:
    """``oomguard manager`` as a real process (uvicorn), for crash and wire-level tests. Its stderr
    goes to a file (``log()``), so a chatty server can never block on a full pipe."""

    def __init__(
        self,
        db_url: str,
        *args: str,
        tokens: bool = True,
        env: dict[str, str] | None = None,
        nofile: tuple[int, int] | None = None,
    ) -> None:
        self.db_url = db_url
        self.args = args
        self.tokens = tokens
        self.env = env or {}
        self.nofile = nofile  # (soft, hard) RLIMIT_NOFILE to start with
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        fd, path = tempfile.mkstemp(prefix="oomguard-manager-", suffix=".log")
        os.close(fd)
        self.stderr_path = Path(path)
        atexit.register(self.stderr_path.unlink, missing_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        tokens = ["--agent-token", AGENT, "--viewer-token", VIEWER] if self.tokens else []
        return [
            *(sys.executable, "-m", "oomguard", "manager", "--db", self.db_url, "--port", str(self.port)),
            *tokens,
            *self.args,
        ]

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def start(self) -> ManagerProcess:
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **self.env}
        command = self.command()
        if self.nofile is not None:  # prlimit(1) sets the limits, then execs the manager (same pid)
            command = ["prlimit", f"--nofile={self.nofile[0]}:{self.nofile[1]}", "--", *command]
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env)
        proc = self.proc

        def listening() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"manager did not start: {self.log()}") from None
                return False

        wait_until(listening, interval=0.05, what=f"the manager to listen on port {self.port}")
        return self

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
                self.proc.wait(10)


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data))


def one_request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    source: str | None = None,
) -> int:
    """One request to a real manager on 127.0.0.1:*port*, on a connection of its own (from *source*,
    a loopback address, when given): its status, 0 for no answer (refused, reset, or none within the
    generous bound)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0) if source else None)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def refused_at_start(
    tmp_path: Path, argv: list[str], env: dict[str, str], message: str, monkeypatch: Any, capsys: Any
) -> None:
    """``oomguard manager`` in process with *argv* and *env*: exit 2, *message* in one line on
    stderr, nothing on stdout, and the database never touched."""
    from oomguard.cli import main

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["manager", "--db", f"sqlite:///{tmp_path / 'x.db'}", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and message in out.err, out.err
    assert not (tmp_path / "x.db").exists()  # refused before the database is touched
