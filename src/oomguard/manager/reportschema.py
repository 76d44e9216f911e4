"""The report's JSON Schema (``oomguard/schema.json``, draft 2020-12) applied by the manager, with
no dependency beyond the standard library: the manager's one validator of a report (at ingest,
through ``contract``, which adds the manager's own needs, written as JSON Schema too).

- ``problem(report)``: the first place a report breaks the schema, at ingest (422), named by the
  schema's own field names, a field the schema does not name by its position (``<field 3>``: the
  third of its object), so that no key of the client's is echoed. Relaxed for a
  mixed fleet: a field the schema does not know is kept (a newer agent) and a missing one is
  allowed (an older agent); every field that is there must have the schema's type and bounds.
  ``relaxed=False`` is the schema as written (``required``, no unknown fields): the tests compare
  both modes with the ``jsonschema`` package (tests/manager/test_manager_contract.py).
- ``conform(report)``: the report with every part that breaks the schema left out, for the
  templates: they never meet a type the schema did not check, even in rows stored before.

Only the keywords below are implemented, after JSON Schema 2020-12 (json-schema.org, "JSON
Schema Validation", sections 6.1-6.5, and "Core", 10.2-10.3); ``keywords_used`` lets a test
fail when schema.json starts using another one.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "title", "description", "default", "examples", "deprecated", "format"}
)
KEYWORDS = frozenset(
    {
        *("type", "enum", "const", "properties", "required", "additionalProperties", "items", "$ref", "$defs"),
        *("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern"),
        *("minItems", "maxItems", "anyOf", "oneOf", "allOf"),
    }
)
MISSING = object()


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_type(v: Any, name: str) -> bool:
    """JSON Schema's types (Validation, 6.1.1); an integer is a number with no fraction."""
    if name == "integer":
        return _is_number(v) and (isinstance(v, int) or float(v).is_integer())
    if name == "number":
        return _is_number(v)
    kinds: dict[str, Any] = {"null": type(None), "boolean": bool, "object": dict, "array": list, "string": str}
    return isinstance(v, kinds[name])


def _out_of_bounds(v: float, s: dict[str, Any]) -> str | None:
    checks = (
        ("minimum", v >= s.get("minimum", v)),
        ("maximum", v <= s.get("maximum", v)),
        ("exclusiveMinimum", "exclusiveMinimum" not in s or v > s["exclusiveMinimum"]),
        ("exclusiveMaximum", "exclusiveMaximum" not in s or v < s["exclusiveMaximum"]),
    )
    for key, inside in checks:
        if not inside:
            return f"{key} {s[key]}"
    return None


@functools.cache
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(resources.files("oomguard").joinpath("schema.json").read_text("utf-8"))
    return loaded


def keywords_used(node: Any = MISSING) -> set[str]:
    """Every keyword schema.json uses (property names under ``properties`` and ``$defs`` excluded)."""
    node = schema() if node is MISSING else node
    found: set[str] = set()
    if isinstance(node, dict):
        for key, sub in node.items():
            found.add(key)
            subs = sub.values() if key in ("properties", "$defs") and isinstance(sub, dict) else [sub]
            for s in subs:
                found |= keywords_used(s)
    elif isinstance(node, list):
        for s in node:
            found |= keywords_used(s)
    return found


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _resolve(s: dict[str, Any]) -> dict[str, Any]:
    ref = s.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return s
    node: Any = schema()
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return {**node, **{k: v for k, v in s.items() if k != "$ref"}}


def _shallow(v: Any, s: dict[str, Any]) -> str | None:
    """What is wrong with *v* itself (type, const, enum, bounds), not with its members."""
    t = s.get("type")
    if t is not None and not any(_is_type(v, x) for x in (t if isinstance(t, list) else [t])):
        return f"expected {t if isinstance(t, str) else ' or '.join(t)}"
    if "const" in s and not _equal(v, s["const"]):
        return f"expected {json.dumps(s['const'])}"
    if "enum" in s and not any(_equal(v, e) for e in s["enum"]):
        return "not one of " + ", ".join(json.dumps(e) for e in s["enum"])
    if _is_number(v) and (bounds := _out_of_bounds(v, s)) is not None:
        return bounds
    if isinstance(v, str):
        if len(v) < s.get("minLength", 0) or len(v) > s.get("maxLength", len(v)):
            return "length out of bounds"
        if "pattern" in s and not re.search(s["pattern"], v):
            return f"does not match {s['pattern']}"
    if isinstance(v, list) and not s.get("minItems", 0) <= len(v) <= s.get("maxItems", len(v)):
        return "number of items out of bounds"
    return None


def problem(v: Any, s: dict[str, Any] | None = None, where: str = "report", relaxed: bool = True) -> str | None:
    """The first place *v* breaks schema *s* (default: the report's), or None."""
    s = _resolve(schema() if s is None else s)
    bad = _shallow(v, s)
    if bad:
        return f"{where}: {bad}"
    for sub in s.get("allOf", []):
        if (bad := problem(v, sub, where, relaxed)) is not None:
            return bad
    for key in ("anyOf", "oneOf"):
        if key in s:
            fits = sum(problem(v, sub, where, relaxed) is None for sub in s[key])
            if fits == 0 or (key == "oneOf" and fits > 1):
                return f"{where}: does not fit {key}"
    if isinstance(v, list) and isinstance(s.get("items"), dict):
        for i, item in enumerate(v):
            if (bad := problem(item, s["items"], f"{where}[{i}]", relaxed)) is not None:
                return bad
    if isinstance(v, dict):
        return _object_problem(v, s, where, relaxed)
    return None


def _object_problem(v: dict[str, Any], s: dict[str, Any], where: str, relaxed: bool) -> str | None:
    props = s.get("properties", {})
    if not relaxed:
        for name in s.get("required", []):
            if name not in v:
                return f"{where}: {name} is missing"
    extra = s.get("additionalProperties", True)
    for position, (key, sub) in enumerate(v.items(), 1):
        if key in props:  # a name of the schema's own: named
            bad = problem(sub, props[key], f"{where}.{key}", relaxed)
        elif extra is False:  # a key of the client's: by its position, never echoed
            bad = None if relaxed else f"{where}: unknown field <field {position}>"
        else:
            bad = problem(sub, extra, f"{where}.<field {position}>", relaxed) if isinstance(extra, dict) else None
        if bad is not None:
            return bad
    return None


def conform(v: Any, s: dict[str, Any] | None = None) -> Any:
    """*v* with each part that breaks the schema left out (``MISSING`` when *v* itself does)."""
    s = _resolve(schema() if s is None else s)
    if _shallow(v, s) is not None:
        return MISSING
    if any(k in s for k in ("allOf", "anyOf", "oneOf")):
        return v if problem(v, s) is None else MISSING
    if isinstance(v, list) and isinstance(s.get("items"), dict):
        kept = [conform(item, s["items"]) for item in v]
        return [item for item in kept if item is not MISSING]
    if isinstance(v, dict):
        props, extra = s.get("properties", {}), s.get("additionalProperties", True)
        out = {}
        for key, sub in v.items():
            rule = props.get(key, extra if isinstance(extra, dict) else None)
            kept = sub if rule is None else conform(sub, rule)
            if kept is not MISSING:
                out[key] = kept
        return out
    return v


def conform_report(report: Any) -> dict[str, Any]:
    """The part of a stored report the templates may show: always a dict."""
    kept = conform(report)
    return kept if isinstance(kept, dict) else {}
