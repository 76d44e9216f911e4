"""Fair connections: /healthz latency for a second client while one client holds 1,500 half-open
connections (issue 22, item 1), under RLIMIT_NOFILE 1,024:1,024 and 1,024:20,000, against a real
manager process on SQLite. Prints p50, p99 and max, and how many answers were not 200.

Usage: python bench/connections.py [--seconds 5] [--half-open 1500] [--src DIR]
(--src DIR: serve from another source tree, e.g. ``git archive HEAD src | tar -x -C DIR``)
(the [manager] extra installed; clients bind 127.0.0.4 and 127.0.0.2, which Linux's loopback has)
"""

from __future__ import annotations

import contextlib
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.manager import ManagerProcess  # noqa: E402

ATTACKER, OTHER = "127.0.0.4", "127.0.0.2"


def arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def healthz(port: int) -> tuple[int, float]:
    start = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(OTHER, 0)) as s:
            s.settimeout(5)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            head = s.recv(4096)
        status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1 ") else 0
    except OSError:
        status = 0
    return status, time.monotonic() - start


def run(nofile: tuple[int, int], half_open: int, seconds: float, src: str | None) -> str:
    env = {"PYTHONPATH": src} if src else None
    with tempfile.TemporaryDirectory() as tmp:
        manager = ManagerProcess(f"sqlite:///{tmp}/bench.db", nofile=nofile, env=env).start()
        held: list[socket.socket] = []
        try:
            for _ in range(half_open):
                with contextlib.suppress(OSError):
                    s = socket.create_connection(("127.0.0.1", manager.port), timeout=2, source_address=(ATTACKER, 0))
                    held.append(s)
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
            times, bad = [], 0
            stop = time.monotonic() + seconds
            while time.monotonic() < stop:
                status, took = healthz(manager.port)
                times.append(took)
                bad += status != 200
                time.sleep(0.01)
        finally:
            for s in held:
                s.close()
            manager.stop()
    times.sort()
    ms = [1000 * times[int(q * (len(times) - 1))] for q in (0.5, 0.99, 1.0)]
    return (
        f"NOFILE {nofile[0]}:{nofile[1]}: {len(held)} half-open held by {ATTACKER}; /healthz from {OTHER}: "
        f"{len(times)} requests, p50 {ms[0]:.1f} ms, p99 {ms[1]:.1f} ms, max {ms[2]:.1f} ms, not 200: {bad}"
    )


def main() -> None:
    half_open, seconds = int(arg("--half-open", "1500")), float(arg("--seconds", "5"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < half_open + 100 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (half_open + 100, hard))
    for nofile in ((1024, 1024), (1024, 20_000)):
        print(run(nofile, half_open, seconds, arg("--src", "") or None), flush=True)


if __name__ == "__main__":
    main()
