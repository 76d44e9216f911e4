#!/usr/bin/env python3
"""Turn an ``oomguard capture`` snapshot into a fixture: tests/fixtures/NAME/root/ + expected.json.

    python tools/new_fixture.py SNAPSHOT NAME [--fixtures DIR] [--budget B] [--margin M] [--force]

SNAPSHOT is the ``.tar.gz`` that ``oomguard capture FILE`` wrote (or a directory laid out as under
"/"). The tool

1. unpacks the snapshot's regular files into ``DIR/NAME/root/`` (links, devices and paths that
   climb out of the tree are refused; the capture manifest is left out: the probe never reads it);
2. replaces boilerplate with a link to the shared copy (``DIR/_shared/...``, see
   tests/fixtures/README.md) when a file is byte-for-byte one of the shared variants;
3. probes the new tree and writes ``expected.json``: the usual fields filled from that probe,
   the warnings as an ordered list of ``{"code", "facts"}`` (facts: the numbers, sizes, paths and
   quoted values of each message), and ``description``/``source`` as TODO placeholders.

Fill the placeholders (what the layout is; where it comes from: an upstream issue, a man page, a
kernel doc, or "captured on <machine>"), check the facts, and run
``pytest tests/probes/test_fixtures.py -k NAME``: the corpus test refuses a TODO left in place.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
SHARED = "_shared"
# Files of which fixtures keep one shared copy per variant: fixture path -> folder under _shared/.
SHARED_FILES = {"proc/self/limits": "limits"}
MANIFEST = "oomguard-snapshot.txt"  # written by capture (sources/snapshot.py); provenance, not probed
TODO = "TODO"
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_]*\Z")

# The report fields a skeleton pins (each one only when the report has it).
SKELETON_FIELDS = (
    "memory.effective_bytes",
    "memory.limited_by",
    "memory.limit_file",
    "memory.host_total_bytes",
    "memory.meminfo_virtualized",
    "memory.soft_limit_bytes",
    "memory.soft_limit_file",
    "memory.cgroup.version",
    "memory.cgroup.path",
    "memory.swap.limit_bytes",
    "memory.swap.memsw_limit_bytes",
    "memory.oom.oom_kill",
    "memlock.known",
    "memlock.soft_bytes",
    "memlock.hard_bytes",
    "memlock.cap_ipc_lock",
    "cpu.effective_cpus",
    "cpu.limited_by",
    "container.in_container",
    "container.runtime",
    "gpu_driver.status",
    "budget.bytes",
    "budget.source",
    "budget.basis_bytes",
    "budget.safety_margin_bytes",
)

# The key facts of a warning message: quoted values, absolute paths, sizes, numbers, issue refs.
_FACT = re.compile(
    r"""
      '[^'\s]+'                                 # a quoted value or path: '/kubepods/...', 'unlimited'
    | (?<![\w/])/[\w.@:,+=-]+(?:/[\w.@:,+=-]+)*  # an absolute path
    | \b\d+(?:\.\d+)?\ ?[KMGTPE]iB\b             # a size as printed: 14 GiB
    | \b[\w.-]+\#\d+\b                          # an upstream issue: lxcfs#389
    | \b\d{2,}\b                                # a count or a byte number
    | \((?:cgroup-v[12]|meminfo|memory\.\w+)\)   # where a limit came from: (memory.high)
    | \b(?:soft|hard)\ (?:limit|ceiling)\b       # which of two limits: memlock soft/hard, memory.high/max
    | \b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b             # a kernel name: RLIMIT_MEMLOCK, CAP_IPC_LOCK
    | \bMem(?:Total|Available)\b                # a /proc/meminfo field
    """,
    re.VERBOSE,
)


class ToolError(Exception):
    """A usage or input error: printed as one line, exit 2."""


def message_facts(message: str) -> list[str]:
    """The substrings of *message* a fixture pins: every number, size, path and quoted value, in order."""
    facts: list[str] = []
    for match in _FACT.finditer(message):
        fact = match.group(0).rstrip(".,:;")
        if fact not in facts and not any(fact in longer for longer in facts):
            facts.append(fact)
    return facts


def warnings_with_facts(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"code": w["code"], "facts": message_facts(w["message"])} for w in report["warnings"]]


def lookup(report: dict[str, Any], dotted: str) -> Any:
    """``lookup(report, "memory.cgroup.version")``; list items by index (``container.evidence.0``)."""
    node: Any = report
    for part in dotted.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def skeleton_fields(report: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for dotted in SKELETON_FIELDS:
        try:
            fields[dotted] = lookup(report, dotted)
        except (KeyError, IndexError, TypeError):  # a section the report leaves out (no cgroup, no OOM file)
            continue
    return fields


def dump_expected(data: dict[str, Any]) -> str:
    """expected.json text: two-space JSON, one warning per line."""
    warnings = data.get("warnings", [])
    text = json.dumps({**data, "warnings": "\0"}, indent=2, ensure_ascii=False)
    items = ",\n".join("    " + json.dumps(w, ensure_ascii=False) for w in warnings)
    return text.replace('"\\u0000"', f"[\n{items}\n  ]" if warnings else "[]") + "\n"


# --- unpacking -------------------------------------------------------------------------------------


def _safe_relpath(name: str) -> str | None:
    """``./proc/meminfo`` -> ``proc/meminfo``; None for the tree's top; ToolError for a path out of it."""
    rel = os.path.normpath(name.lstrip("/"))
    if rel in (".", ""):
        return None
    if rel.startswith("..") or os.path.isabs(rel):
        raise ToolError(f"snapshot member {name!r} points outside the tree")
    return rel


def _unpack_tar(snapshot: Path) -> dict[str, str]:
    try:
        with tarfile.open(snapshot, "r:*") as tar:
            members = tar.getmembers()
            out: dict[str, str] = {}
            for member in members:
                rel = _safe_relpath(member.name)
                if rel is None or member.isdir():
                    continue
                if not member.isfile():
                    raise ToolError(f"snapshot member {member.name!r} is not a regular file")
                f = tar.extractfile(member)
                assert f is not None
                out[rel] = f.read().decode("utf-8", "surrogateescape")
            return out
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise ToolError(f"cannot read snapshot {str(snapshot)!r}: {exc}") from None


def _unpack_dir(snapshot: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted(snapshot.rglob("*")):
        if path.is_file():
            out[path.relative_to(snapshot).as_posix()] = path.read_bytes().decode("utf-8", "surrogateescape")
    return out


def read_snapshot(snapshot: Path) -> dict[str, str]:
    """Every file of the snapshot: relative path -> text."""
    if snapshot.is_dir():
        files = _unpack_dir(snapshot)
    elif snapshot.is_file():
        files = _unpack_tar(snapshot)
    else:
        raise ToolError(f"no such snapshot: {str(snapshot)!r}")
    if "proc/meminfo" not in files and "proc/self/cgroup" not in files:
        raise ToolError(f"{str(snapshot)!r} is not an oomguard snapshot (neither proc/meminfo nor proc/self/cgroup)")
    return files


def shared_variant(fixtures: Path, rel: str, text: str) -> Path | None:
    """The shared copy of *rel* whose bytes equal *text*, if there is one."""
    folder = SHARED_FILES.get(rel)
    if folder is None or not (fixtures / SHARED / folder).is_dir():
        return None
    for candidate in sorted((fixtures / SHARED / folder).iterdir()):
        if candidate.is_file() and candidate.read_bytes() == text.encode("utf-8", "surrogateescape"):
            return candidate
    return None


def write_tree(files: dict[str, str], root: Path, fixtures: Path) -> list[str]:
    """Write *files* under *root*; shared boilerplate becomes a relative link. Returns the linked paths."""
    linked = []
    dirs = {parent.as_posix() for rel in files for parent in Path(rel).parents}
    for rel, text in sorted(files.items()):
        if rel in dirs:  # a marker the probe found (exists()) that is a directory holding other files
            continue
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        variant = shared_variant(fixtures, rel, text)
        if variant is not None:
            target.symlink_to(os.path.relpath(variant, target.parent))
            linked.append(rel)
        else:
            target.write_bytes(text.encode("utf-8", "surrogateescape"))
    return linked


def provenance(manifest: str | None) -> str:
    if not manifest:
        return ""
    lines = dict(line.split(" ", 1) for line in manifest.splitlines() if " " in line)
    parts = [f"oomguard {lines['oomguard']}" if "oomguard" in lines else "", lines.get("captured", "")]
    return " ".join(p for p in parts if p)


# --- the command ---------------------------------------------------------------------------------


def make_fixture(
    snapshot: Path, name: str, fixtures: Path = FIXTURES, args: dict[str, str] | None = None, force: bool = False
) -> Path:
    """Create ``fixtures/name/`` from *snapshot*; returns the case folder."""
    if not NAME_RE.match(name):
        raise ToolError(f"NAME {name!r}: use lower_snake_case (letters, digits, _), e.g. docker_v2_private_ns")
    case = fixtures / name
    if case.exists():
        if not force:
            raise ToolError(f"{case} exists (use --force to replace it)")
        shutil.rmtree(case)
    files = read_snapshot(snapshot)
    manifest = files.pop(MANIFEST, None)
    write_tree(files, case / "root", fixtures)

    sys.path.insert(0, str(REPO / "src"))
    from oomguard import probe
    from oomguard.sources.root import DirRoot

    args = args or {}
    tree = DirRoot(str(case / "root"))
    report: dict[str, Any] = probe(root=tree, budget=args.get("budget"), margin=args.get("margin"))  # type: ignore[assignment]
    made = provenance(manifest)
    expected: dict[str, Any] = {
        "description": f"{TODO}: the layout in one or two sentences (runtime, cgroup version, where the limit is)",
        "source": f"{TODO}: an upstream issue, man page, kernel doc or named machine"
        + (f" (captured with {made})" if made else ""),
    }
    if args:
        expected["args"] = args
    expected["fields"] = skeleton_fields(report)
    expected["warnings"] = warnings_with_facts(report)
    (case / "expected.json").write_text(dump_expected(expected))
    return case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="new_fixture.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("snapshot", metavar="SNAPSHOT", help="a `oomguard capture` .tar.gz, or a directory")
    parser.add_argument("name", metavar="NAME", help="the case name, lower_snake_case, after the layout or bug")
    parser.add_argument("--fixtures", metavar="DIR", default=str(FIXTURES), help="the corpus (default: %(default)s)")
    parser.add_argument("--budget", help="probe with this budget (kept in expected.json as args)")
    parser.add_argument("--margin", help="probe with this margin (kept in expected.json as args)")
    parser.add_argument("--force", action="store_true", help="replace an existing case folder")
    ns = parser.parse_args(argv)
    args = {k: v for k, v in (("budget", ns.budget), ("margin", ns.margin)) if v is not None}
    try:
        case = make_fixture(Path(ns.snapshot), ns.name, Path(ns.fixtures), args, ns.force)
    except ToolError as exc:
        print(f"new_fixture.py: error: {exc}", file=sys.stderr)
        return 2
    print(f"{case}/expected.json: fill in description and source, check the fields and facts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
