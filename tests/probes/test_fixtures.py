"""The fixture corpus: one real-world layout per folder, probed offline, checked against expected.json.

tests/fixtures/<case>/root/      the file tree as under "/" (proc/..., sys/...)
tests/fixtures/<case>/expected.json
    {"description": "...", "source": "where the layout comes from (an upstream issue, a man page,
                                      a kernel doc, or a named machine)",
     "args": {"budget": "...", "margin": "..."},          (optional, as the CLI flags)
     "fields": {"memory.effective_bytes": 536870912, ...}, (dotted paths into the report)
     "warnings": [{"code": "memlock-low", "facts": ["soft limit", "65536"]}, ...]}
                  (every warning in the report's order; each fact is a substring of its message)
tests/fixtures/_shared/          boilerplate files several cases link to (tests/fixtures/README.md)

A case is a folder with an expected.json; tools/new_fixture.py makes one from `oomguard capture`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from oomguard.sources.root import DirRoot
from tests.helpers.corpus import CASES, FIXTURES, REPO, SHARED, check_case, warning_mismatches


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 25, CASES
    assert "_shared" not in CASES


@pytest.mark.parametrize("case", CASES)
def test_fixture(case: str) -> None:
    problems = check_case(FIXTURES / case)
    assert problems == [], f"{case}:\n" + "\n".join(problems)


# --- the comparison itself can fail ------------------------------------------------------------------


def test_warning_comparison_is_ordered_counts_duplicates_and_checks_facts() -> None:
    got = [
        {"code": "missing", "message": "/proc/self/cgroup does not exist"},
        {"code": "missing", "message": "/proc/self/status does not exist"},
        {"code": "memlock-low", "message": "RLIMIT_MEMLOCK soft limit is 65536 bytes"},
    ]
    want: list[dict[str, Any]] = [
        {"code": "missing", "facts": ["/proc/self/cgroup"]},
        {"code": "missing", "facts": ["/proc/self/status"]},
        {"code": "memlock-low", "facts": ["soft limit", "65536"]},
    ]
    assert warning_mismatches(got, want) == []
    assert warning_mismatches(got, want[::-1]) != []  # order matters
    assert warning_mismatches(got, want[1:]) != []  # a duplicate code matters
    hard = [*want[:2], {"code": "memlock-low", "facts": ["hard limit", "8388608"]}]
    assert warning_mismatches(got, hard) == [
        "warning 2 (memlock-low): fact 'hard limit' not in 'RLIMIT_MEMLOCK soft limit is 65536 bytes'",
        "warning 2 (memlock-low): fact '8388608' not in 'RLIMIT_MEMLOCK soft limit is 65536 bytes'",
    ]


def test_a_wrong_field_is_reported(tmp_path: Path) -> None:
    case = FIXTURES / "k8s_v2_private_ns"
    expected = json.loads((case / "expected.json").read_text())
    expected["fields"]["memory.effective_bytes"] += 1
    expected["fields"]["memory.no_such_field"] = 1
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    (tmp_path / "root").symlink_to(case / "root")
    assert check_case(tmp_path) == [
        f"memory.effective_bytes: 2147483648 != expected {2147483648 + 1}",
        "memory.no_such_field: not in the report",
    ]


# --- expected.json: facts and sources -----------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_expected_json_is_complete(case: str) -> None:
    expected = json.loads((FIXTURES / case / "expected.json").read_text())
    assert set(expected) <= {"description", "source", "args", "fields", "warnings"}, case
    assert expected["description"].strip() and expected["source"].strip()
    assert "TODO" not in expected["description"] + expected["source"], "fill in the new_fixture.py placeholders"
    assert expected["fields"], "pin at least the effective limit"
    for w in expected["warnings"]:
        assert set(w) == {"code", "facts"} and isinstance(w["facts"], list), w
        assert all(isinstance(f, str) and f for f in w["facts"]), w


NOT_PUBLIC = re.compile(r"research\s*C\d|research/|anchors_|DESIGN\.md|edge-cases|project brief", re.IGNORECASE)
REPO_PATH = re.compile(r"(?<![\w/])(src/oomguard/[\w./-]+\w)")  # this repository's files (upstream paths differ)


@pytest.mark.parametrize("case", CASES)
def test_source_resolves(case: str) -> None:
    """A source is public: an upstream issue, a man page, a kernel doc, a named layout, or a file of
    this repository that exists; never the private research notes (``research C<n>``)."""
    source = json.loads((FIXTURES / case / "expected.json").read_text())["source"]
    assert not NOT_PUBLIC.search(source), f"{case}: cites notes that are not in the repo: {source}"
    for rel in REPO_PATH.findall(source):
        assert (REPO / rel).exists(), f"{case}: cites {rel}, which is not in the repo"


def test_no_fixture_cites_research_notes() -> None:
    cited = [p.parent.name for p in sorted(FIXTURES.glob("*/expected.json")) if "research C" in p.read_text()]
    assert cited == []


# --- shared boilerplate (tests/fixtures/_shared) -------------------------------------------------------


def _links() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*") if p.is_symlink())


def test_links_are_relative_and_stay_in_shared() -> None:
    links = _links()
    assert len(links) >= 50, "the limits files are shared (README.md)"
    for link in links:
        target = os.readlink(link)
        assert not os.path.isabs(target), f"{link}: absolute link {target}"
        resolved = link.resolve()
        assert resolved.is_file(), f"{link}: dangling link {target}"
        assert SHARED in resolved.parents, f"{link}: points outside _shared: {target}"


def test_dir_root_reads_through_shared_links() -> None:
    for link in _links():
        rel = link.relative_to(next(p for p in link.parents if p.name == "root"))
        root = DirRoot(str(next(p for p in link.parents if p.name == "root")))
        assert root.read("/" + rel.as_posix()) == link.resolve().read_text(), link


def test_every_shared_variant_is_used_and_no_fixture_keeps_a_copy() -> None:
    variants = sorted(p for p in SHARED.rglob("*") if p.is_file() and p.name != "README.md")
    assert variants, "tests/fixtures/_shared is empty"
    used = {link.resolve() for link in _links()}
    assert [v for v in variants if v.resolve() not in used] == [], "unused shared variant"
    contents = {v.read_bytes(): v for v in variants}
    copies = [
        f"{p.relative_to(FIXTURES)} == {contents[p.read_bytes()].relative_to(FIXTURES)}"
        for p in sorted(FIXTURES.glob("*/root/**/*"))
        if p.is_file() and not p.is_symlink() and p.read_bytes() in contents
    ]
    assert copies == [], "link to the shared copy instead"
