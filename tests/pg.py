"""A real PostgreSQL server for tests: a throwaway cluster in a temp dir, on a free loopback port.

The Debian packages are installed by scripts/system-deps.sh (run by `make test`). As root the
server runs as the `postgres` user (PostgreSQL refuses root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time


def _bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    def __init__(self) -> None:
        self.bindir = _bindir()
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
        self.dir = tempfile.mkdtemp(prefix="oomguard-pg-")
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        data = os.path.join(self.dir, "data")
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
        deadline = time.monotonic() + 60
        while (
            subprocess.run(
                [f"{self.bindir}/pg_isready", "-h", "127.0.0.1", "-p", str(self.port)], capture_output=True
            ).returncode
            != 0
        ):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("PostgreSQL did not start")
            time.sleep(0.1)
        return self.url("postgres")

    def url(self, db: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def create_db(self, name: str) -> str:
        subprocess.run(
            [f"{self.bindir}/createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name],
            check=True,
            capture_output=True,
        )
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
