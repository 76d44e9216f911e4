"""The Report contract: the JSON Schema shipped in the package, the encoder, the public API."""

from __future__ import annotations

import json
import math
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


def test_public_api_is_exactly_all() -> None:
    public = {name for name in dir(oomguard) if not name.startswith("_")} | {"__version__"}
    assert public == set(oomguard.__all__)
    for name in oomguard.__all__:
        assert getattr(oomguard, name) is not None, name
    with pytest.raises(AttributeError):
        oomguard.no_such_thing  # noqa: B018


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
