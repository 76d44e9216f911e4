"""README's example ``oomguard check`` output is what the renderer prints (issue 38, item 8).

The example showed the soft limit as ``-`` while ``check`` prints ``none``. Here the same
situation is rebuilt from a real capture (``tests/fixtures/firecracker_hybrid_v1_memory_real_capture``:
a Firecracker VM with 23.54 GiB, cgroup v1, no swap), its group limited to 1.5 GiB as in the
example, and rendered. The example must show the same lines: the same sections and labels in the
same order, and the same words, only the numbers and the paths (which are the machine's) aside.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import oomguard
from oomguard.commands.render import format_human
from oomguard.sources.root import DirRoot
from tests.conftest import FIXTURES, REPO

CASE = "firecracker_hybrid_v1_memory_real_capture"
GROUP = "sys/fs/cgroup/memory/process_api/bbfdd99c3afc646711bb070c9faaad80"
LIMIT = 1536 * 1024**2  # the example's 1.5 GiB
EXAMPLE = re.compile(r"^Example, in a cgroup v1 group limited to 1\.5 GiB[^\n]*\n\n```\n(.*?)^```$", re.M | re.S)


def readme_example() -> list[str]:
    """The lines of README's example output block."""
    found = EXAMPLE.search((REPO / "README.md").read_text())
    assert found, "README.md has no example block after 'Example, in a cgroup v1 group limited to 1.5 GiB'"
    return found.group(1).splitlines()


def rendered(tmp_path: Path) -> list[str]:
    """``check``'s text for the capture with its group limited to 1.5 GiB, as the live system."""
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / CASE / "root", root, symlinks=True)
    (root / GROUP / "memory.limit_in_bytes").write_text(f"{LIMIT}\n")
    stat = root / GROUP / "memory.stat"
    stat.write_text(re.sub(r"^hierarchical_memory_limit \d+$", f"hierarchical_memory_limit {LIMIT}",
                           stat.read_text(), flags=re.M))  # fmt: skip
    report = oomguard.probe(root=DirRoot(str(root)))
    assert report["memory"]["effective_bytes"] == LIMIT  # the example's situation, rebuilt
    return format_human({**report, "root": "/"}).splitlines()


def label(line: str) -> str:
    """A row's label (its first 16 columns after the indent), or a section's whole line."""
    return line[2:18].strip() if line.startswith("  ") else line


def words(line: str) -> str:
    """The line with what is the machine's masked: paths (``/sys/...``, ``/process_api/<id>``), then
    numbers; whitespace collapsed, since a number's width moves the columns after it."""
    line = re.sub(r"/\S+", "PATH", line)
    line = re.sub(r"\d+(?:\.\d+)?", "N", line)
    return " ".join(line.split())


def test_the_readme_example_has_the_renderer_s_rows_and_words(tmp_path: Path) -> None:
    example, text = readme_example(), rendered(tmp_path)
    assert [label(line) for line in example] == [label(line) for line in text]
    assert [words(line) for line in example] == [words(line) for line in text]


def test_the_check_sees_a_value_word_that_drifted(tmp_path: Path) -> None:
    """What this file guards against: the old example's ``-`` for the soft limit the renderer calls ``none``."""
    text = rendered(tmp_path)
    assert "  soft limit       none" in text  # cgroup v1 without memory.soft_limit_in_bytes: "none"
    drifted = [line.replace("soft limit       none", "soft limit       -") for line in text]
    assert [words(line) for line in drifted] != [words(line) for line in text]
