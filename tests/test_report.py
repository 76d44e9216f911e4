"""The Report contract: the JSON Schema shipped in the package, the encoder, the public API."""

from __future__ import annotations

import ast
import importlib
import json
import math
import os
import types
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

import oomguard
from oomguard.commands.render import format_human, to_json
from oomguard.report import WARNING_CODES
from oomguard.sources.root import DirRoot
from tests.conftest import FIXTURES, REPO

SCHEMA = json.loads(resources.files("oomguard").joinpath("schema.json").read_text())
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "root").is_dir())


def test_live_report_matches_schema() -> None:
    jsonschema.validate(oomguard.probe(), SCHEMA)


@pytest.mark.parametrize("case", CASES)
def test_fixture_reports_match_schema_and_render(case: str) -> None:
    report = oomguard.probe(root=DirRoot(str(FIXTURES / case / "root")))
    jsonschema.validate(report, SCHEMA)
    text = format_human(report)
    assert text.startswith("oomguard check (snapshot ")
    assert f"Warnings ({len(report['warnings'])})" in text


# --- golden human output of `check` ------------------------------------------------------------------
GOLDEN = Path(__file__).parent / "golden"
GOLDEN_CASES = [
    "k8s_v2_memory_high_memoryqos",  # soft limit (memory.high), OOM kills, pressure, protection
    "docker_v2_swap_max",  # a swap limit
    "memlock_soft_64kib_below_hard_8mib",  # memlock soft below hard, memlock-low
    "budget_env_above_memory_high",  # budget from the environment above the soft limit: a warning
    "proc_self_files_missing_snap_confined",  # four warnings, unknown memlock and cgroup
    "original_503g_host_342g_v2_container",  # the incident: host RAM vs the container's limit
]


def render_case(case: str) -> str:
    """``format_human`` of the fixture's probe, with the fixture path written relative to the repo."""
    root = FIXTURES / case / "root"
    args = json.loads((FIXTURES / case / "expected.json").read_text()).get("args", {})
    text = format_human(oomguard.probe(root=DirRoot(str(root)), **args))
    return text.replace(str(root), f"tests/fixtures/{case}/root")


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_human_output_matches_golden(case: str) -> None:
    """The whole human report, byte for byte, against tests/golden/<case>.txt.

    A deliberate change of the human output: regenerate with
    ``OOMGUARD_UPDATE_GOLDEN=1 pytest tests/test_report.py -k golden`` and review the diff.
    """
    golden = GOLDEN / f"{case}.txt"
    text = render_case(case)
    if os.environ.get("OOMGUARD_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"no golden file: run OOMGUARD_UPDATE_GOLDEN=1 pytest {__file__} -k golden"
    assert text == golden.read_text(), f"{case}: human output changed (diff it against {golden})"


def test_golden_files_pin_what_they_claim() -> None:
    """The goldens are the ones listed, and each shows the row it was chosen for."""
    assert sorted(p.stem for p in GOLDEN.glob("*.txt")) == sorted(GOLDEN_CASES)
    read = {case: (GOLDEN / f"{case}.txt").read_text() for case in GOLDEN_CASES}
    assert "memory.high" in read["k8s_v2_memory_high_memoryqos"]
    assert "OOM kills        20" in read["k8s_v2_memory_high_memoryqos"]
    assert "swap limit       1 GiB" in read["docker_v2_swap_max"]
    assert "64 KiB / 8 MiB" in read["memlock_soft_64kib_below_hard_8mib"]
    assert "Warnings (4)" in read["proc_self_files_missing_snap_confined"]


def test_warning_codes_are_documented() -> None:
    doc = (REPO / "docs" / "report.md").read_text()
    for code in WARNING_CODES:
        assert f"`{code}`" in doc, code


def test_report_fields_are_documented() -> None:
    doc = (REPO / "docs" / "report.md").read_text()

    def walk(schema: dict, prefix: str) -> list[str]:  # type: ignore[type-arg]
        out = []
        for name, sub in schema.get("properties", {}).items():
            out.append(prefix + name)
            out += walk(sub, prefix + name + ".")
        return out

    for field in walk(SCHEMA, ""):
        assert f"`{field}`" in doc, field


json_data = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_data)
def test_encoder_matches_json_dumps(data: object) -> None:
    def finite(x: object) -> object:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, list):
            return [finite(v) for v in x]
        if isinstance(x, dict):
            return {k: finite(v) for k, v in x.items()}
        return x

    assert to_json(data) == json.dumps(finite(data), indent=2)


# --- the public surface (httpx's test_exported_members, adapted to a lazy package) -------------------
# dir(oomguard) returns __all__, so comparing the two proves nothing. Instead read what the package
# really defines from its source (the _LAZY map, the TYPE_CHECKING imports, the eager module-level
# names) and what it really hands out at run time (getattr, vars).

INIT = REPO / "src" / "oomguard" / "__init__.py"
NOT_EXPORTS = {"TYPE_CHECKING", "__all__", "_LAZY", "__getattr__", "__dir__", "annotations"}


def _init_surface() -> tuple[dict[str, str], dict[str, str], set[str]]:
    """(the _LAZY map, TYPE_CHECKING name -> module, eagerly bound module-level names) of __init__.py."""
    tree = ast.parse(INIT.read_text())
    lazy: dict[str, str] = {}
    typed: dict[str, str] = {}
    eager: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in stmt.targets):
            lazy = ast.literal_eval(stmt.value)
        elif isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Name) and stmt.test.id == "TYPE_CHECKING":
            for sub in stmt.body:
                assert isinstance(sub, ast.ImportFrom) and sub.module, ast.dump(sub)
                for alias in sub.names:
                    typed[alias.asname or alias.name] = sub.module
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            eager |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            eager |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            eager.add(stmt.name)
    return lazy, typed, eager - NOT_EXPORTS


def test_all_is_exactly_what_the_package_defines() -> None:
    lazy, typed, eager = _init_surface()
    assert lazy, "no _LAZY map found in oomguard/__init__.py"
    assert oomguard.__all__ == sorted(set(oomguard.__all__)), "__all__: sorted, no duplicates"
    assert set(lazy) - set(oomguard.__all__) == set(), "loadable by name but not in __all__"
    assert set(oomguard.__all__) - set(lazy) - eager == set(), "in __all__ but defined nowhere"
    assert set(oomguard.__all__) == set(lazy) | eager, "a public module-level name missing from __all__"
    # What a type checker sees is what the lazy loader returns.
    assert typed == {name: f"oomguard.{mod}" for name, mod in lazy.items()}, "TYPE_CHECKING imports != _LAZY"


@pytest.mark.parametrize("name", oomguard.__all__)
def test_every_export_resolves_to_the_package_own_object(name: str) -> None:
    lazy, _, _ = _init_surface()
    value = getattr(oomguard, name)
    if name in lazy:
        home = f"oomguard.{lazy[name]}"
        assert value is getattr(importlib.import_module(home), name)
        if isinstance(value, type) or callable(value):
            assert value.__module__ == home, f"{name} is re-exported from {value.__module__}, not defined in {home}"
    else:
        assert name == "__version__" and isinstance(value, str) and value, value
    assert vars(oomguard)[name] is value  # cached after the first lookup


def test_no_stray_public_names_after_loading_everything() -> None:
    for name in oomguard.__all__:
        getattr(oomguard, name)
    stray = {
        name
        for name, value in vars(oomguard).items()
        if not name.startswith("_")
        and name not in NOT_EXPORTS
        and not (isinstance(value, types.ModuleType) and value.__name__ == f"oomguard.{name}")  # loaded subpackages
    }
    assert stray <= set(oomguard.__all__), stray - set(oomguard.__all__)
    assert dir(oomguard) == sorted(oomguard.__all__)


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="'nope'"):
        getattr(oomguard, "nope")  # noqa: B009
    with pytest.raises(AttributeError):
        oomguard.no_such_thing  # noqa: B018
    assert not hasattr(oomguard, "_LAZY_missing")


def test_probe_accepts_a_snapshot_path(tmp_path: Path) -> None:
    snap = tmp_path / "s.tar.gz"
    oomguard.capture(str(snap))
    report = oomguard.probe(root=str(snap), budget="1GiB")
    assert report["root"] == str(snap)
    assert report["budget"]["bytes"] == 2**30 and report["budget"]["source"] == "explicit"


def test_report_doc_is_generated_from_the_schema() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(REPO / "tools" / "report_doc.py"), "--check"])
    assert proc.returncode == 0, "docs/report.md is out of date: run python tools/report_doc.py"
