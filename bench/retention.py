"""Retention off the ingest path, and bounded reads of a busy node: the manager as a real process.

``pass``: a fleet's history as it stands when a retention pass starts (every report of the last
70 minutes at a 30 s interval, one per clock hour back to the retention, one report past it: about
860 rows per node, 8.6 M at 10,000 nodes), then reports at the fleet's rate (10,000 nodes every
30 s: 333/s) while the manager runs its retention passes. Latency is measured from each request's
scheduled send time (an open-loop schedule, so a stalled server is not hidden by waiting clients);
goal: p99 under 250 ms during a pass (agents time out at 10 s).

``readers``: one node with 60,000 reports in the last hour (one every 60 ms), read by 16 clients
at once (its API answer and its page, in turn); the manager's resident memory (``VmRSS`` before
and after, and its peak ``VmHWM``, from /proc/PID/status). Goal: peak RSS under 200 MB.

Usage: python bench/retention.py pass [--nodes 10000] [--rate 333] [--passes 2] [--max-seconds 300]
                                      [--thin-every 20] [--first-pass] [--db sqlite|postgresql]
       (--first-pass: no previous pass recorded, so the pass reads the whole history, as the
       first one after the upgrade that brings this retention does)
       python bench/retention.py readers [--readers 16] [--seconds 20] [--db sqlite|postgresql]
       (--db takes a comma-separated list, default sqlite,postgresql; --src DIR serves from another
       source tree, e.g. ``git archive HEAD src | tar -x -C DIR``, to measure the code before a change)
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlalchemy import insert, text  # noqa: E402
from tests.helpers.manager import fixture_report, free_port, write_history, write_latest  # noqa: E402
from tests.helpers.pg import PostgresServer  # noqa: E402

from oomguard.manager.db import make_engine, migrate, nodes  # noqa: E402
from oomguard.manager.db import retention_state as state  # noqa: E402

HOUR, MIN, DAY = 3_600_000, 60_000, 86_400_000
RETENTION_DAYS = 30

# The manager, as ``oomguard manager`` runs it, with the retention's first pass after THIN_S seconds;
# each pass's start and end are printed (epoch seconds) by a wrapper around Store.thin.
LAUNCHER = """
import json, sys, time, uvicorn
from oomguard.manager.app import create_app
from oomguard.manager.settings import Settings
from oomguard.manager import store as S
url, port, thin_s, days = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
thin = S.Store.thin
def timed(self, *a, **k):
    t0 = time.time()
    result = thin(self, *a, **k)
    print("PASS", json.dumps({"start": t0, "end": time.time(), "result": result}), file=sys.stderr, flush=True)
    return result
S.Store.thin = timed
uvicorn.run(create_app(Settings(db_url=url, thin_every_s=thin_s, retention_s=days * 86400)),
            host="127.0.0.1", port=port, log_level="warning", access_log=False)
"""


def arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


class Manager:
    def __init__(self, url: str, thin_s: float, src: str, log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": src}
        self.port = free_port()
        self.log = log
        with log.open("wb") as err:
            argv = [sys.executable, "-c", LAUNCHER, url, str(self.port), str(thin_s), str(RETENTION_DAYS)]
            self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 120
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("manager did not start: " + log.read_text(errors="replace"))
            time.sleep(0.1)

    def passes(self) -> list[dict]:  # type: ignore[type-arg]
        lines = self.log.read_text(errors="replace").splitlines()
        return [json.loads(line[5:]) for line in lines if line.startswith("PASS ")]

    def memory_kb(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) of the manager process, in KiB."""
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines())
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@contextmanager
def database(kind: str, name: str) -> Iterator[str]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/{name}.db"
        return
    pg = PostgresServer()
    why = pg.unavailable()
    if why:
        raise SystemExit(f"PostgreSQL: {why}")
    pg.start()
    try:
        yield pg.create_db(name)
    finally:
        pg.stop()


def node_row(i: int, now: int) -> dict:  # type: ignore[type-arg]
    return {
        "name": f"node-{i:05d}",
        "first_seen_ms": now - RETENTION_DAYS * DAY,
        "last_seen_ms": now - (i % 7) * 1000,
        "interval_ms": 30_000,
        "effective_bytes": 342 << 30,
        "host_total_bytes": 503 << 30,
        "budget_bytes": 332 << 30,
        "limited_by": "cgroup-v2",
        "runtime": "docker",
        "memlock_soft_bytes": 8 << 20,
        "warnings": "[]",
        "gpus": "[]",
    }


def fleet_times(now: int, node: int) -> list[int]:
    """One node's history before a pass, oldest first: one report past the retention, the first
    report of each clock hour, then every report of the last 70 minutes (30 s apart)."""
    full = [now - 70 * MIN + k * 30_000 for k in range(140)]
    first_hour, last_hour = (now - RETENTION_DAYS * DAY) // HOUR + 1, full[0] // HOUR
    hourly = [h * HOUR + (node % 29) * 1000 for h in range(first_hour, last_hour + 1)]
    return [now - RETENTION_DAYS * DAY - 5 * MIN, *(t for t in hourly if t < full[0]), *full]


def populate(url: str, n_nodes: int, times_of: Callable[[int, int], list[int]], now: int) -> int:
    migrate(url)
    engine = make_engine(url)
    latest = json.dumps(fixture_report())
    with engine.begin() as conn:
        conn.execute(insert(nodes), [node_row(i, now) for i in range(n_nodes)])
        write_latest(conn, range(1, n_nodes + 1), now, latest)
    total = write_history(engine, n_nodes, lambda node_id: times_of(now, node_id), batch=200)
    with engine.begin() as conn:  # the planner's statistics, as a database in service has them
        conn.execute(text("ANALYZE"))
    engine.dispose()
    return total


def paced_ingest(port: int, n_nodes: int, rate: float, until: Callable[[], bool]) -> list[tuple[float, float, int]]:
    """Reports at *rate* per second on an open-loop schedule until *until*(); (scheduled, latency s, status)."""
    report = json.dumps(fixture_report())
    threads, t0 = 32, time.time() + 0.5
    results: list[list[tuple[float, float, int]]] = [[] for _ in range(threads)]

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        j = 0
        while not until():
            due = t0 + (j * threads + k) / rate
            j += 1
            time.sleep(max(0.0, due - time.time()))
            node = f"node-{(j * threads + k) * 7919 % n_nodes:05d}"
            body = f'{{"node": "{node}", "id": "{uuid.uuid4().hex}", "report": {report}, "interval_s": 30}}'
            try:
                conn.request("POST", "/api/v1/reports", body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                status = resp.status
            except (OSError, http.client.HTTPException):
                status = 0
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            results[k].append((due, time.time() - due, status))

    pool = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sorted(r for rs in results for r in rs)


def after_passes(manager: Manager, want: int, then_s: float, max_s: float) -> threading.Event:
    """An event set *then_s* seconds after the manager's *want*-th retention pass ended, or after *max_s*."""
    done = threading.Event()
    deadline = time.time() + max_s

    def watch() -> None:
        while manager.proc.poll() is None and time.time() < deadline:
            passes = manager.passes()
            if len(passes) >= want and time.time() > passes[want - 1]["end"] + then_s:
                break
            time.sleep(0.25)
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    return done


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def describe(label: str, rows: list[tuple[float, float, int]]) -> str:
    lat = [r[1] * 1000 for r in rows]
    errors = sum(1 for r in rows if not 200 <= r[2] < 300)
    return (
        f"  {label:<22} {len(rows):6d} reports  p50 {pct(lat, 0.5):7.1f} ms  p99 {pct(lat, 0.99):7.1f} ms  "
        f"max {max(lat, default=float('nan')):7.1f} ms  non-2xx {errors}"
    )


def bench_pass(kind: str) -> None:
    n_nodes, rate, want = int(arg("--nodes", "10000")), float(arg("--rate", "333")), int(arg("--passes", "2"))
    with database(kind, "retention") as url:
        now = int(time.time() * 1000) + 60_000  # the pass runs about a minute after populating: at steady state
        t0 = time.perf_counter()
        rows = populate(url, n_nodes, fleet_times, now)
        if "--first-pass" not in sys.argv:  # where the previous pass, 10 minutes before, ended
            with make_engine(url).begin() as conn:
                conn.execute(insert(state).values(name="thinned_below", value_ms=now - 70 * MIN))
        print(f"{kind}: {n_nodes} nodes, {rows} history rows (populated in {time.perf_counter() - t0:.0f} s)")
        log = Path(tempfile.mkstemp(suffix=".log")[1])
        manager = Manager(url, float(arg("--thin-every", "20")), arg("--src", str(REPO / "src")), log)
        try:
            done = after_passes(manager, want, 5.0, float(arg("--max-seconds", "300")))
            sent = paced_ingest(manager.port, n_nodes, rate, done.is_set)
        finally:
            manager.stop()
        print(f"  ingest at {rate:g}/s (32 keep-alive clients), latency from each report's scheduled send time:")
        passes = manager.passes()
        for n, p in enumerate(passes, 1):
            during = [r for r in sent if p["start"] <= r[0] <= p["end"]]
            print(f"  pass {n}: {p['end'] - p['start']:.1f} s, {p['result']}")
            print(describe(f"during pass {n}", during))
        outside = [r for r in sent if not any(p["start"] <= r[0] <= p["end"] for p in passes)]
        print(describe("outside the passes", outside))
        if not passes:
            print(f"  no retention pass completed (the manager's log: {log})")
            return
        worst = max(pct([r[1] * 1000 for r in sent if p["start"] <= r[0] <= p["end"]], 0.99) for p in passes)
        print(
            f"  goal: p99 < 250 ms during a pass: {'met' if worst < 250 else 'NOT met'} (worst pass p99 {worst:.1f} ms)"
        )


def busy_times(now: int, node: int) -> list[int]:
    return [now - HOUR + k * 60 for k in range(60_000)] if node == 1 else [now - k * 30_000 for k in range(120)]


def bench_readers(kind: str) -> None:
    readers, seconds = int(arg("--readers", "16")), float(arg("--seconds", "20"))
    with database(kind, "readers") as url:
        now = int(time.time() * 1000)
        rows = populate(url, 10, busy_times, now)
        log = Path(tempfile.mkstemp(suffix=".log")[1])
        manager = Manager(url, 86400.0, arg("--src", str(REPO / "src")), log)
        try:
            idle_rss, _ = manager.memory_kb()
            stats = read_hard(manager, readers, seconds)
            rss, hwm = manager.memory_kb()
        finally:
            manager.stop()
    print(f"{kind}: node-00000 with 60000 reports in the last hour ({rows} history rows in all)")
    for path, (sizes, lat, failed) in stats.items():
        size = statistics.median(sizes) / 1024 if sizes else float("nan")
        print(
            f"  {path:<28} answer {size:8.1f} KiB  {len(lat):5d} reads  "
            f"p50 {pct(lat, 0.5):7.1f} ms  p99 {pct(lat, 0.99):7.1f} ms  not 200: {failed[0]}"
        )
    print(
        f"  manager RSS: {idle_rss / 1024:.0f} MiB before, {rss / 1024:.0f} MiB after, peak (VmHWM) "
        f"{hwm / 1024:.0f} MiB with {readers} concurrent readers for {seconds:g} s; "
        f"goal < 200 MB: {'met' if hwm * 1024 < 200e6 else 'NOT met'}"
    )


Reads = dict[str, tuple[list[int], list[float], list[int]]]  # path: answer sizes (2xx), latencies (ms), failures


def read_hard(manager: Manager, readers: int, seconds: float) -> Reads:
    paths = ("/api/v1/nodes/node-00000", "/nodes/node-00000")
    stats: Reads = {p: ([], [], [0]) for p in paths}
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def reader(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", manager.port, timeout=60)
        n = k
        while time.monotonic() < stop:
            path = paths[n % 2]
            n += 1
            t0 = time.perf_counter()
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                body, status = resp.read(), resp.status
            except (OSError, http.client.HTTPException):
                body, status = b"", 0
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", manager.port, timeout=60)
            with lock:
                if status == 200:
                    stats[path][0].append(len(body))
                else:
                    stats[path][2][0] += 1
                stats[path][1].append((time.perf_counter() - t0) * 1000)

    pool = [threading.Thread(target=reader, args=(k,)) for k in range(readers)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return stats


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "pass"
    for kind in arg("--db", "sqlite,postgresql").split(","):
        (bench_pass if what == "pass" else bench_readers)(kind)


if __name__ == "__main__":
    main()
