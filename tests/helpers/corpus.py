"""The fixture corpus (tests/fixtures/<case>/): where it is, and how a case is checked against its expected.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oomguard import probe
from oomguard.sources.root import DirRoot

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SHARED = FIXTURES / "_shared"
REPO = FIXTURES.parent.parent
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").is_file())


def lookup(report: dict[str, Any], dotted: str) -> Any:
    node: Any = report
    for part in dotted.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def warning_mismatches(got: list[dict[str, str]], want: list[dict[str, Any]]) -> list[str]:
    """What differs between the report's warnings and expected ones: codes in order (duplicates
    count), then each expected fact as a substring of the message at the same position."""
    codes, want_codes = [w["code"] for w in got], [w["code"] for w in want]
    if codes != want_codes:
        return [f"warning codes {codes} != expected {want_codes}"]
    return [
        f"warning {i} ({w['code']}): fact {fact!r} not in {g['message']!r}"
        for i, (g, w) in enumerate(zip(got, want, strict=True))
        for fact in w["facts"]
        if fact not in g["message"]
    ]


def check_case(case_dir: Path) -> list[str]:
    """Every way the probe of *case_dir*/root differs from its expected.json (empty when it matches)."""
    expected = json.loads((case_dir / "expected.json").read_text())
    report: dict[str, Any] = probe(root=DirRoot(str(case_dir / "root")), **expected.get("args", {}))  # type: ignore[assignment]
    problems = []
    for dotted, want in expected["fields"].items():
        try:
            got = lookup(report, dotted)
        except (KeyError, IndexError, TypeError):
            problems.append(f"{dotted}: not in the report")
            continue
        if got != want:
            problems.append(f"{dotted}: {got!r} != expected {want!r}")
    return problems + warning_mismatches(report["warnings"], expected["warnings"])
