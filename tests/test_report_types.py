"""``_types.py`` spells the report that ``schema.json`` describes: the test walks the schema and the
``TypedDict``s side by side (``typing.get_type_hints``) and fails when an object's property is on one
side only. schema.json is the source; the TypedDicts are mypy's copy of it.
"""

from __future__ import annotations

import json
import types
import typing
from importlib import resources
from typing import Any

from oomguard import _types

SCHEMA = json.loads(resources.files("oomguard").joinpath("schema.json").read_text())
# Objects the TypedDicts type as a plain mapping (``dict[str, object]``) rather than field by field.
OPAQUE = {"report.memory.pressure", "report.memlock.probe", "report.memlock.pinned_probe"}


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = SCHEMA
        for part in ref[2:].split("/"):
            target = target[part]
        return {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _without_none(tp: Any) -> Any:
    """``X | None`` -> ``X``; anything else as it is."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        kept = [a for a in typing.get_args(tp) if a is not type(None)]
        return kept[0] if len(kept) == 1 else tp
    return tp


def mismatches(node: dict[str, Any], tp: Any, where: str = "report") -> tuple[list[str], set[str]]:
    """(a line for each property on one side only, the opaque places met), walking *node* (schema)
    and *tp* (annotation) together."""
    node, tp = _resolve(node), _without_none(tp)
    out: list[str] = []
    opaque: set[str] = set()
    if "properties" in node:
        if not typing.is_typeddict(tp):
            opaque.add(where)
            return out, opaque
        hints = typing.get_type_hints(tp)
        schema_side, typed_side = set(node["properties"]), set(hints)
        out += [f"{where}.{name}: in schema.json, not in {tp.__name__}" for name in sorted(schema_side - typed_side)]
        out += [f"{where}.{name}: in {tp.__name__}, not in schema.json" for name in sorted(typed_side - schema_side)]
        for name in sorted(schema_side & typed_side):
            more, seen = mismatches(node["properties"][name], hints[name], f"{where}.{name}")
            out += more
            opaque |= seen
    elif isinstance(node.get("items"), dict) and typing.get_origin(tp) is list:
        return mismatches(node["items"], typing.get_args(tp)[0], f"{where}[]")
    return out, opaque


def test_every_property_of_schema_json_is_typed_and_every_typed_field_is_in_the_schema() -> None:
    bad, opaque = mismatches(SCHEMA, _types.Report)
    assert bad == [], "schema.json and _types.py disagree:\n" + "\n".join(bad)
    assert opaque == OPAQUE, "an object of schema.json typed as a plain dict (or no longer): update OPAQUE"


class Inner(typing.TypedDict):
    a: int
    b: str | None


class Outer(typing.TypedDict):
    inner: Inner | None
    items: list[Inner]
    extra: int


def test_the_walk_catches_a_property_missing_on_either_side() -> None:
    schema = {
        "properties": {
            "inner": {"type": ["object", "null"], "properties": {"a": {}, "c": {}}},
            "items": {"type": "array", "items": {"properties": {"a": {}, "b": {}}}},
            "missing": {"type": "integer"},
        }
    }
    bad, opaque = mismatches(schema, Outer)
    assert bad == [
        "report.missing: in schema.json, not in Outer",
        "report.extra: in Outer, not in schema.json",
        "report.inner.c: in schema.json, not in Inner",
        "report.inner.b: in Inner, not in schema.json",
    ]
    assert opaque == set()
    assert mismatches({"properties": {"x": {}}}, dict[str, object]) == ([], {"report"})
