"""What psutil, dask and oomguard each report as the memory limit, inside one real limited cgroup.

Creates a child of this process's memory cgroup limited to --limit (default 1.5 GiB; needs
root and a writable cgroup, as in the test suite), runs each tool inside it, prints a table.

Usage: python bench/limits_vs_peers.py [--limit SIZE]   (needs the [bench] extra: psutil, distributed)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.realcgroup import Group, writable_parent  # noqa: E402

from oomguard.units import format_size, parse_size  # noqa: E402

PEERS = {
    "psutil.virtual_memory().total": "import psutil; print(psutil.virtual_memory().total)",
    "distributed.system.MEMORY_LIMIT": "from distributed.system import MEMORY_LIMIT; print(MEMORY_LIMIT)",
    "oomguard memory.effective_bytes": ("import oomguard; print(oomguard.probe()['memory']['effective_bytes'])"),
    "oomguard budget.bytes (auto)": "import oomguard; print(oomguard.probe()['budget']['bytes'])",
}


def main() -> int:
    limit = parse_size(sys.argv[sys.argv.index("--limit") + 1]) if "--limit" in sys.argv else 1536 * 1024**2
    version, parent = writable_parent()
    if version is None:
        print(f"cannot run: {parent}")
        return 1
    group = Group(version, Path(parent))
    try:
        group.set_limit(limit)
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        env.pop("OOMGUARD_BUDGET", None)
        print(f"cgroup v{version} group {group.dir} limited to {format_size(limit)} ({limit} bytes)")
        print(f"host MemTotal: {format_size(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))}\n")
        print(f"| {'tool':<34} | {'reports':>12} | {'bytes':>14} | right? |")
        print(f"|{'-' * 36}|{'-' * 14}|{'-' * 16}|--------|")
        for name, code in PEERS.items():
            proc = group.run(sys.executable, "-c", code, env=env)
            out = proc.stdout.strip()
            value = int(json.loads(out)) if out.isdigit() else None
            ok = "yes" if value is not None and value <= limit else "NO"
            shown = format_size(value) if value is not None else (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"| {name:<34} | {shown:>12} | {value if value is not None else '-':>14} | {ok:>6} |")
    finally:
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
