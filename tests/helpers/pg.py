"""A real PostgreSQL server for tests: a throwaway cluster in a temp dir, on a free loopback port.

The Debian packages are installed by scripts/system-deps.sh (run by `make test`). As root the
server runs as the `postgres` user (PostgreSQL refuses root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.wait import wait_until


def _bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """*keep*: the cluster lives in that directory, is reused when it holds one, and is kept at
    stop() (bench/dashboard.py --keep: load 100,000 nodes once, measure later)."""

    def __init__(self, keep: str | None = None) -> None:
        self.bindir = _bindir()
        self.keep = keep
        self.dir = ""
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def unavailable(self) -> str | None:
        if self.bindir is None:
            return "PostgreSQL is not installed (scripts/system-deps.sh installs it as root)"
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                return "running as root and there is no 'postgres' user to run the server as"
        return None

    def _as_owner(self, cmd: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return cmd
        return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", *cmd]

    def start(self) -> str:
        assert self.bindir is not None
        if self.keep:
            os.makedirs(self.keep, exist_ok=True)
            self.dir = self.keep
        else:
            self.dir = tempfile.mkdtemp(prefix="oomguard-pg-")
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        data = os.path.join(self.dir, "data")
        if not self.reused():
            subprocess.run(
                self._as_owner(
                    [f"{self.bindir}/initdb", "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"]
                ),
                check=True,
                capture_output=True,
            )
        self.port = _free_port()
        self.proc = subprocess.Popen(
            self._as_owner(
                [
                    f"{self.bindir}/postgres",
                    "-D",
                    data,
                    "-p",
                    str(self.port),
                    "-k",
                    self.dir,
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "max_connections=200",
                ]
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc = self.proc

        def up_or_gone() -> bool:
            isready = [f"{self.bindir}/pg_isready", "-h", "127.0.0.1", "-p", str(self.port)]
            return proc.poll() is not None or subprocess.run(isready, capture_output=True).returncode == 0

        try:  # a RuntimeError: the callers turn it into a skip, with the reason
            wait_until(up_or_gone, interval=0.1, what="PostgreSQL to accept connections")
        except AssertionError:
            raise RuntimeError("PostgreSQL did not start within 60 s") from None
        if proc.poll() is not None:
            raise RuntimeError(f"PostgreSQL did not start: it exited {proc.returncode}")
        return self.url("postgres")

    def reused(self) -> bool:
        """True when the kept directory already held a cluster."""
        return self.keep is not None and os.path.exists(os.path.join(self.keep, "data", "PG_VERSION"))

    def url(self, db: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def create_db(self, name: str) -> str:
        subprocess.run(
            [f"{self.bindir}/createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name],
            check=True,
            capture_output=True,
        )
        return self.url(name)

    def drop_db(self, name: str) -> None:
        subprocess.run(
            [f"{self.bindir}/dropdb", "--if-exists", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name],
            check=True,
            capture_output=True,
        )

    def cluster_pids(self) -> list[int]:
        """The postmaster and its children (the backends holding a pool's connections)."""
        assert self.proc is not None
        root = self.proc.pid
        pids = [root]
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            except OSError:
                continue
            if fields.get("PPid", "").strip() == str(root):
                pids.append(int(status.parent.name))
        return pids

    def stop(self) -> None:
        """Fast shutdown (SIGINT: sessions ended, a clean checkpoint), not the smart one of SIGTERM,
        which waits for every client to leave (https://www.postgresql.org/docs/15/server-shutdown.html):
        a kept cluster (``keep``) killed after that wait started its next run with crash recovery."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.dir and not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def own_server() -> Iterator[PostgresServer]:
    """A server of one test's own, to stop, freeze (SIGSTOP its processes) or hang; woken
    (SIGCONT) and stopped at the end, whatever the test left it as. Skips where none can run."""
    import pytest

    server = PostgresServer()
    if server.unavailable():
        pytest.skip(str(server.unavailable()))
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            for pid in server.cluster_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            server.proc.send_signal(signal.SIGINT)
        server.stop()
