"""A stand-in for CuZK's ``cuzk-daemon``: its command line, its config and its memory budget, scaled down.

What it copies from CuZK (filecoin-project/curio at e0294b0, extern/cuzk):
- the command line, cuzk-daemon/src/main.rs L17-31: ``--config``/``-c`` (default
  /data/zk/cuzk.toml), ``--listen``/``-l``, ``--log-level``; clap refuses anything else with
  "error: unexpected argument '...' found" and exit 2. A missing config file means the defaults
  (L38-44).
- the config, cuzk-core/src/config.rs L57-108: ``[memory] total_budget`` and ``safety_margin``
  are strings (serde: a TOML integer fails the load: "invalid type: integer, expected a string");
  ``"auto"`` is /proc/meminfo MemTotal (memory.rs L83-100; 256 GiB when unreadable) minus
  ``safety_margin``; any other value is ``parse_size``'d (L482-497, ported as
  ``oomguard.supervisor.cuzk.parse_size``, whose own test pins it to CuZK's) and used as written.
- the budget, cuzk-memory-manager.md L19-24 and memory.rs L35-38: the pinned SRS (44 GiB) and the
  PCE (26 GiB) reserve from the budget for the life of the process; each partition reserves 14 GiB
  before its synthesis and gives it back after; ``MemoryBudget::acquire`` waits while the next
  reservation would pass the total. Partitions wait for the GPU in a bounded channel of the
  pipeline's lookahead, max(configured, min(total / 14 GiB, 32)) (engine.rs L13-17, L1412-1414,
  L1854-1856), beside the ones being synthesised: the stand-in holds the most that fit in the
  budget, up to that lookahead (a simplification: CuZK's own count also depends on its timing).

Scaled by ``CUZK_STANDIN_SCALE`` (default 64: 704 MiB SRS, 416 MiB PCE, 224 MiB a partition);
``CUZK_STANDIN_BATCHES`` batches (default 1), each filling the budget with partitions, touching
every page, then freeing them; ``CUZK_STANDIN_FACTOR`` (default 1) makes a partition really use
that many times its estimate (the estimate stays what CuZK reserves). It prints what it read and
each batch, then "done".
"""

from __future__ import annotations

import mmap
import os
import sys

from oomguard.supervisor.cuzk import parse_size, toml_loads

GiB = 1 << 30
USAGE = """cuzk proving engine daemon

Usage: cuzk-daemon [OPTIONS]

Options:
  -c, --config <CONFIG>        Path to configuration file (TOML) [default: /data/zk/cuzk.toml]
  -l, --listen <LISTEN>        Override listen address (e.g. "0.0.0.0:9820" or "unix:///run/curio/cuzk.sock")
      --log-level <LOG_LEVEL>  Override log level
  -h, --help                   Print help
"""


def _args(argv: list[str]) -> str:
    """The config path, as clap would take the command line; exits as clap does otherwise."""
    config, i = "/data/zk/cuzk.toml", 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            sys.stdout.write(USAGE)
            sys.exit(0)
        name, eq, value = arg.partition("=")
        if name in ("-c", "--config", "-l", "--listen", "--log-level"):
            if not eq:
                i += 1
                if i >= len(argv):
                    sys.exit(f"error: a value is required for '{name} <VALUE>' but none was supplied")
                value = argv[i]
            if name in ("-c", "--config"):
                config = value
        else:
            sys.stderr.write(f"error: unexpected argument '{arg}' found\n\nUsage: cuzk-daemon [OPTIONS]\n")
            sys.exit(2)
        i += 1
    return config


def _string(memory: dict[str, object], key: str, default: str) -> str:
    value = memory.get(key, default)
    if not isinstance(value, str):
        sys.exit(f"Error: failed to load config: invalid type: {type(value).__name__}, expected a string for {key}")
    return value


def total_budget(path: str) -> int:
    """What CuZK's ``MemoryConfig::resolve_total_budget`` gives for the config at *path*."""
    loads = toml_loads()
    assert loads is not None, "the stand-in reads TOML with tomllib: Python >= 3.11"
    memory: dict[str, object] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            memory = loads(f.read()).get("memory", {})
    budget = _string(memory, "total_budget", "auto")
    margin = _string(memory, "safety_margin", "5GiB")
    if budget != "auto":
        return parse_size(budget)
    with open("/proc/meminfo") as f:
        kib = next((int(x.split()[1]) for x in f if x.startswith("MemTotal:") and x.rstrip().endswith("kB")), None)
    total = kib * 1024 if kib is not None else 256 * GiB
    return max(0, total - parse_size(margin))


def used(size: int) -> mmap.mmap:
    """*size* bytes of private anonymous memory, every page touched: really used, charged to the cgroup,
    and given back at once by ``close`` (munmap), as a large allocation freed by a real allocator. Private
    (MAP_PRIVATE, not mmap's default MAP_SHARED, which is shmem): the OOM reaper frees it as soon as the
    kernel picks this process, so its kill cannot make the supervisor beside it the next victim (docs/run.md,
    "The supervisor's own memory")."""
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    m[::4096] = b"x" * len(range(0, size, 4096))
    return m


def main() -> None:
    total = total_budget(_args(sys.argv[1:]))
    scale = int(os.environ.get("CUZK_STANDIN_SCALE", "64"))
    batches = int(os.environ.get("CUZK_STANDIN_BATCHES", "1"))
    factor = float(os.environ.get("CUZK_STANDIN_FACTOR", "1"))
    srs, pce, partition = 44 * GiB // scale, 26 * GiB // scale, 14 * GiB // scale
    if total < srs + pce:
        sys.exit(f"cuzk-standin: total_budget {total} holds not even the SRS and the PCE ({srs + pce})")
    lookahead = max(1, min(total // partition, 32))
    partitions = min((total - srs - pce) // partition, lookahead)
    print(f"cuzk-standin: total_budget {total} bytes, {partitions} partitions at once", flush=True)
    resident = used(srs + pce)  # held to the end, as CuZK holds its SRS and PCE
    size = int(partition * factor)
    for batch in range(batches):
        held = [used(size) for _ in range(partitions)]
        for m in held:
            m.close()
        print(f"cuzk-standin: batch {batch + 1} of {batches} done", flush=True)
    resident.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
