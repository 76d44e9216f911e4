"""The fixture corpus: one real-world layout per folder, probed offline, checked against expected.json.

tests/fixtures/<case>/root/      the file tree as under "/" (proc/..., sys/...)
tests/fixtures/<case>/expected.json
    {"description": "...", "source": "where the layout comes from",
     "args": {"budget": "...", "margin": "..."},          (optional, as the CLI flags)
     "fields": {"memory.effective_bytes": 536870912, ...}, (dotted paths into the report)
     "warnings": ["limit-may-be-hidden"]}                 (the exact set of warning codes)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oomguard import probe
from oomguard.sources.root import DirRoot

FIXTURES = Path(__file__).parent / "fixtures"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").is_file())


def lookup(report: dict[str, Any], dotted: str) -> Any:
    node: Any = report
    for part in dotted.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 25, CASES


@pytest.mark.parametrize("case", CASES)
def test_fixture(case: str) -> None:
    expected = json.loads((FIXTURES / case / "expected.json").read_text())
    args = expected.get("args", {})
    report = probe(root=DirRoot(str(FIXTURES / case / "root")), **args)
    for dotted, want in expected["fields"].items():
        assert lookup(report, dotted) == want, f"{case}: {dotted}"
    codes = sorted({w["code"] for w in report["warnings"]})
    assert codes == sorted(expected["warnings"]), f"{case}: {report['warnings']}"
