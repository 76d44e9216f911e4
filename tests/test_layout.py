"""The tests are shaped like the code (issue 35, item 4; CONTRIBUTING.md, "Where a test goes"):

- a unit test module lives in the folder of ``tests/`` that mirrors the ``src/oomguard/`` folder it
  tests (``tests/manager/`` for ``oomguard/manager/``); tests of the package's top-level modules
  (report, units, nodes, the layout itself) stay at ``tests/``;
- a test that needs the machine (a real cgroup, a container runtime, the v2 VM, Chromium, a
  Prometheus, nginx or Caddy server, several real managers at once) is in ``tests/integration/``;
- every helper is in ``tests/helpers/``; ``tests/fakes/`` holds stand-in programs, ``tests/fixtures/``
  and ``tests/golden/`` data; nothing else beside the tests.

``misplaced`` says what breaks those rules in a tree; the real tree has nothing, and planted trees
show that each rule is seen.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.paths import SRC, TESTS

PACKAGE = SRC / "oomguard"
# Folders of tests/ that are not a mirror of the package: what each holds.
NOT_MIRRORS = {
    "helpers": "shared test code",
    "integration": "tests that need the machine",
    "fakes": "stand-in programs",
    "fixtures": "captured file trees",
    "golden": "expected outputs",
}
# What makes a unit test module one that needs the machine: a real cgroup, a runtime, Chromium.
NEEDS_MACHINE = re.compile(
    r"^\s*from tests\.helpers\.(?:realcgroup|runtimes) import|^def test_\w+\([^)]*\bbrowser\b",
    re.MULTILINE,
)


def _mirrors(package: Path) -> set[str]:
    return {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}


def misplaced(tests: Path, package: Path) -> list[str]:
    """Each file or folder of *tests* that breaks the layout, with the rule it breaks."""
    found = []
    mirrors = _mirrors(package)
    for path in sorted(tests.rglob("*")):
        rel = path.relative_to(tests)
        if "__pycache__" in rel.parts or rel.parts[0] in ("fakes", "fixtures", "golden"):
            continue
        top = rel.parts[0]
        if path.is_dir():
            if len(rel.parts) == 1 and top not in NOT_MIRRORS and top not in mirrors:
                found.append(f"{rel}/: no src/oomguard/{top}/ to mirror")
            elif top not in ("helpers",) and not (path / "__init__.py").is_file() and top != "integration":
                found.append(f"{rel}/: no __init__.py (two test modules of one name would collide)")
            continue
        if path.suffix != ".py" or top in ("helpers",) or rel.parts[:2] == ("integration", "vm"):
            continue
        if path.name not in ("__init__.py", "conftest.py") and not path.name.startswith("test_"):
            found.append(f"{rel}: a helper outside tests/helpers/")
        elif (
            top != "integration"
            and path.name.startswith("test_")
            and NEEDS_MACHINE.search(path.read_text(encoding="utf-8"))
        ):
            found.append(f"{rel}: needs the machine (a real cgroup, a runtime, Chromium): tests/integration/")
    return found


def test_the_tests_are_shaped_like_the_code() -> None:
    assert misplaced(TESTS, PACKAGE) == []


def test_every_folder_of_the_package_with_tests_has_its_mirror() -> None:
    mirrored = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name in _mirrors(PACKAGE)}
    # The folders tested by their own modules; runtime/ and verify/ are tested through the
    # machine (tests/integration/) and the CLI, so they have no unit folder yet.
    assert {"agent", "commands", "manager", "policy", "probes", "sources", "supervisor"} <= mirrored


def _plant(tmp_path: Path, files: dict[str, str]) -> tuple[Path, Path]:
    package = tmp_path / "src" / "oomguard"
    for name in ("agent", "manager"):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
    tests = tmp_path / "tests"
    for rel, text in files.items():
        (tests / rel).parent.mkdir(parents=True, exist_ok=True)
        (tests / rel).write_text(text)
    return tests, package


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"__init__.py": "", "stray.py": ""}, "stray.py: a helper outside tests/helpers/"),
        ({"__init__.py": "", "gui/__init__.py": "", "gui/test_x.py": ""}, "gui/: no src/oomguard/gui/ to mirror"),
        ({"__init__.py": "", "agent/test_x.py": ""}, "agent/: no __init__.py"),
        (
            {"__init__.py": "", "agent/__init__.py": "", "agent/test_x.py": "from tests.helpers.realcgroup import G\n"},
            "agent/test_x.py: needs the machine",
        ),
        (
            {"__init__.py": "", "manager/__init__.py": "", "manager/test_x.py": "def test_a(browser: Browser): ...\n"},
            "manager/test_x.py: needs the machine",
        ),
    ],
)
def test_a_planted_tree_is_caught(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    tests, package = _plant(tmp_path, files)
    found = misplaced(tests, package)
    assert any(line.startswith(expected) for line in found), found


def test_a_planted_tree_in_its_places_passes(tmp_path: Path) -> None:
    tests, package = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "conftest.py": "",
            "test_top.py": "",
            "helpers/realcgroup.py": "",
            "agent/__init__.py": "",
            "agent/test_a.py": "",
            "integration/__init__.py": "",
            "integration/test_b.py": "from tests.helpers.realcgroup import G\n",
            "integration/vm/harness.py": "",
            "fixtures/case/root/proc/meminfo": "",
        },
    )
    assert misplaced(tests, package) == []
