"""Regenerate the field and warning tables of docs/report.md from schema.json and WARNING_CODES.

A field its object does not list in ``required`` is marked "(optional)" (the report's ``plan``).

Usage: python tools/report_doc.py [--check]   (--check: exit 1 when the doc is out of date)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from oomguard.report import WARNING_CODES  # noqa: E402

DOC = REPO / "docs" / "report.md"
BEGIN_FIELDS, END_FIELDS = "<!-- fields:begin -->", "<!-- fields:end -->"
BEGIN_CODES, END_CODES = "<!-- warnings:begin -->", "<!-- warnings:end -->"


def _type(sub: dict[str, Any]) -> str:
    if "enum" in sub:
        return " \\| ".join(
            "null" if v is None else f'`"{v}"`' if isinstance(v, str) else f"`{v}`" for v in sub["enum"]
        )
    if "const" in sub:
        return f"`{sub['const']}`"
    t = sub.get("type", "")
    return " or ".join(t) if isinstance(t, list) else t


def _walk(schema: dict[str, Any], prefix: str, rows: list[str]) -> None:
    required = schema.get("required", [])
    for name, sub in schema.get("properties", {}).items():
        optional = "" if name in required else " (optional)"
        rows.append(f"| `{prefix}{name}` | {_type(sub)}{optional} | {sub.get('description', '')} |")
        _walk(sub, f"{prefix}{name}.", rows)
        items = sub.get("items", {})
        if "properties" in items:
            _walk(items, f"{prefix}{name}[].", rows)


def render() -> str:
    schema = json.loads((REPO / "src" / "oomguard" / "schema.json").read_text())
    rows = ["| field | type | meaning |", "|---|---|---|"]
    _walk(schema, "", rows)
    codes = ["| code | meaning |", "|---|---|"] + [f"| `{c}` | {d} |" for c, d in WARNING_CODES.items()]
    text = DOC.read_text()
    for begin, end, body in ((BEGIN_FIELDS, END_FIELDS, rows), (BEGIN_CODES, END_CODES, codes)):
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + begin + "\n" + "\n".join(body) + "\n" + end + tail
    return text


if __name__ == "__main__":
    new = render()
    if "--check" in sys.argv:
        sys.exit(0 if new == DOC.read_text() else 1)
    DOC.write_text(new)
