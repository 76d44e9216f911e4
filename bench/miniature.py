"""The fleet learns, in miniature (issue 23, item 6): three nodes as real memory cgroups under
this process's own (root, cgroup v1 or a delegated v2), an agent and ``run --profile --learned``
on each, one real manager (SQLite). The scenario is ``tests/helpers/miniature.py``; this prints,
per node, each round's jobs and how the run ended, the kernel's OOM kills, and the jobs per node
of the last round against the declared size's.

Usage: python bench/miniature.py [--runs N]   (N scenarios one after the other; default 3)
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.manager import ManagerProcess  # noqa: E402
from tests.helpers.miniature import BASELINE, BUDGET, DECLARED, NODES, run_miniature  # noqa: E402
from tests.helpers.realcgroup import Group, writable_parent  # noqa: E402


def main() -> int:
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 3
    version, parent = writable_parent()
    if version is None:
        print(f"real cgroups unavailable: {parent}")
        return 1
    declared_jobs = (BUDGET - BASELINE) // DECLARED
    print(
        f"cgroup v{version}; declared {DECLARED >> 20} MiB a job: {declared_jobs} jobs in a {BUDGET >> 20} MiB budget"
    )
    for run in range(runs):
        with tempfile.TemporaryDirectory() as work:
            groups = {
                name: Group(version, Path(parent), f"oomguard-bench-mini-{name}-{uuid.uuid4().hex[:8]}")
                for name in NODES
            }
            server = ManagerProcess(f"sqlite:///{work}/fleet.db").start()
            try:
                out = run_miniature(server.url, groups, Path(work))
            finally:
                server.stop()
                for g in groups.values():
                    g.close()
        for name, (cls, real) in NODES.items():
            jobs = " -> ".join(str(c) for c in out.concurrency[name])
            ends = ", ".join(str(r) for r in out.reasons[name])
            print(
                f"run {run + 1} {name} ({cls}, {real >> 20} MiB a job): jobs {jobs}; ends {ends}; "
                f"kernel OOM kills {out.kernel_oom_kills[name]}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
