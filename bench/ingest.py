"""Manager ingest throughput: reports stored per second with 50 concurrent clients, beside the
same server's /healthz in the same run (goal: ingest >= half of /healthz; 10,000 nodes reporting
every 30 s need about 333 reports/s). SQLite and PostgreSQL.

Usage: python bench/ingest.py [--seconds 10] [--clients 50] [--db sqlite|postgresql|both] [--src DIR]
(--src DIR: serve from another source tree, e.g. ``git archive HEAD src | tar -x -C DIR``)
(root, or a user that can run PostgreSQL; the [manager] extra installed)
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.manager import AGENT_H, ManagerProcess, fixture_report  # noqa: E402
from tests.helpers.pg import PostgresServer  # noqa: E402


def options() -> argparse.Namespace:
    """The command line (an unknown option, or ``--help``, is argparse's: it used to be ignored and
    the bench ran anyway)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="each measure's length (default 10)")
    parser.add_argument("--clients", type=int, default=50, help="keep-alive clients (default 50)")
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--src", metavar="DIR", help="serve from another source tree")
    return parser.parse_args()


def hammer(
    port: int, path: str, clients: int, seconds: float, body_for: Callable[[int], bytes] | None = None
) -> tuple[int, int]:
    """(2xx answers, other answers) from *clients* keep-alive connections for *seconds*."""
    ok = [0] * clients
    bad = [0] * clients
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while time.monotonic() < stop:
            try:
                if body_for is None:
                    conn.request("GET", path)
                else:
                    conn.request(
                        "POST",
                        path,
                        body=body_for(i),
                        headers={
                            **AGENT_H,
                            "Content-Type": "application/json",
                        },
                    )
                resp = conn.getresponse()
                resp.read()
                if 200 <= resp.status < 300:
                    ok[i] += 1
                else:
                    bad[i] += 1
            except (OSError, http.client.HTTPException):
                bad[i] += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(ok), sum(bad)


def rates(
    db_url: str, node_of: Callable[[int], str], clients: int, seconds: float, env: dict[str, str] | None = None
) -> tuple[float, float, int, int]:
    """A real manager over *db_url*: its /healthz answers per second, then its reports stored per
    second (client *i* posts reports of node ``node_of(i)``), and the errors of each."""
    server = ManagerProcess(db_url, env=env).start()
    report = json.dumps(fixture_report())

    def body(i: int) -> bytes:
        return f'{{"node": "{node_of(i)}", "id": "{uuid.uuid4().hex}", "report": {report}}}'.encode()

    try:
        hammer(server.port, "/healthz", clients, 1.0)  # warm up
        h_ok, h_bad = hammer(server.port, "/healthz", clients, seconds)
        r_ok, r_bad = hammer(server.port, "/api/v1/reports", clients, seconds, body)
    finally:
        server.stop()
    return h_ok / seconds, r_ok / seconds, h_bad, r_bad


def run(db_url: str, label: str, clients: int, seconds: float, src: str | None) -> None:
    env = {"PYTHONPATH": src or str(REPO / "src")}
    h, r, h_bad, r_bad = rates(db_url, lambda i: f"node-{i:05d}", clients, seconds, env)
    print(
        f"{label:<11} /healthz {h:8.0f}/s   reports {r:8.0f}/s stored   ratio {r / h:5.2f}   "
        f"(errors: healthz {h_bad}, reports {r_bad})"
    )


def main() -> None:
    opts = options()
    seconds, clients, which = opts.seconds, opts.clients, opts.db
    print(
        f"{clients} concurrent keep-alive clients, {seconds:g} s each, report body {len(json.dumps(fixture_report()))} "
        "bytes (a real report); client and server share this machine's CPUs"
    )
    if which in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as d:
            run(f"sqlite:///{d}/bench.db", "SQLite", clients, seconds, opts.src)
    if which in ("postgresql", "both"):
        pg = PostgresServer()
        why = pg.unavailable()
        if why:
            print(f"PostgreSQL: skipped ({why})")
            return
        pg.start()
        try:
            run(pg.create_db("bench"), "PostgreSQL", clients, seconds, opts.src)
        finally:
            pg.stop()


if __name__ == "__main__":
    main()
