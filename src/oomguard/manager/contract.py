"""The report as the manager takes it. ``schema.json`` is the contract, applied by ``reportschema``
(the one validator); this module adds only what the manager itself needs of a report, and names
the fields it keeps in columns.

``problem(report)`` says why a report is refused (422), or None:

1. the manager's own needs, whatever the schema version (``needs()``, JSON Schema too, from the
   tables below): an object with a ``schema_version`` of 1 to 1000 and a ``memory`` section;
   what the columns can hold (``COLUMNS``: integers within BIGINT, the plan's jobs within
   1,000,000); at most 64 GPUs, each with an ``index``, and 200 warnings, each with a ``code`` of
   ``[A-Za-z0-9._-]``, which the alert policy matches alike in SQL and Python (``alerts``);
2. a report of schema.json's version: the whole report against schema.json, relaxed for a mixed
   fleet (``reportschema``): a field an older agent lacks may be missing (``plan.shape.pin_method``,
   ``memlock.probe.charged``, ...), a field the schema does not know (a newer agent) may be there;
3. a report of another version (a newer agent: kept as sent): only the fields the manager keeps
   (``kept``) against schema.json's rules for them, so that every column holds what it says.

``columns(report)`` gives the writer those fields' values (``COLUMNS``, and the ``gpus`` and
``warnings`` lists of ``LISTS``). A new column is one entry in ``COLUMNS`` (and the column itself
in ``db/tables.py``, with its Alembic revision).
"""

from __future__ import annotations

import functools
from typing import Any

from oomguard.manager import reportschema

BIG = 2**63 - 1  # what a BIGINT column holds
BIGINT: dict[str, Any] = {"maximum": BIG}
LABEL = r"^[A-Za-z0-9._-]{0,32}$"
SCHEMA_VERSION = reportschema.schema()["properties"]["schema_version"]["const"]

COLUMNS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # column of ``nodes`` (the first four also of ``reports``): the report's section and field, and
    # what the column adds to schema.json's rule for it
    "effective_bytes": ("memory", "effective_bytes", BIGINT),
    "host_total_bytes": ("memory", "host_total_bytes", BIGINT),
    "usage_bytes": ("memory", "usage_bytes", BIGINT),
    "working_set_bytes": ("memory", "working_set_bytes", BIGINT),
    "limited_by": ("memory", "limited_by", {}),
    "budget_bytes": ("budget", "bytes", BIGINT),
    "memlock_soft_bytes": ("memlock", "soft_bytes", BIGINT),
    "cap_ipc_lock": ("memlock", "cap_ipc_lock", {}),  # revision 0006: CAP_IPC_LOCK lifts RLIMIT_MEMLOCK
    "runtime": ("container", "runtime", {"pattern": LABEL}),
    "concurrency": ("plan", "concurrency", {"maximum": 1_000_000}),
}
LISTS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    # JSON column of ``nodes``: the fields kept of each item, and the manager's limits on the list
    "gpus": (
        ("index", "name", "memory_total_bytes", "memory_free_bytes"),
        {
            "maxItems": 64,
            "items": {
                "required": ["index"],
                "properties": {
                    "index": {"maximum": 2**31 - 1},
                    "name": {"maxLength": 200},
                    "memory_total_bytes": BIGINT,
                    "memory_free_bytes": BIGINT,
                },
            },
        },
    ),
    "warnings": (
        ("code",),
        {
            "maxItems": 200,
            "items": {"required": ["code"], "properties": {"code": {"pattern": LABEL}, "message": {"maxLength": 4000}}},
        },
    ),
    # Revision 0009: what consumers with a budget of their own say of it (agent --cuzk-status);
    # None (NULL) when the report has no such list, as an older agent's.
    "consumers": (
        ("name", "budget_bytes", "used_bytes", "available_bytes"),
        {
            "maxItems": 16,
            "items": {
                "required": ["name"],
                "properties": {
                    "name": {"pattern": LABEL},
                    "url": {"maxLength": 2048},
                    "budget_bytes": BIGINT,
                    "used_bytes": BIGINT,
                    "available_bytes": BIGINT,
                    "error": {"maxLength": 1000},
                },
            },
        },
    ),
}


@functools.cache
def needs() -> dict[str, Any]:
    """The manager's own needs of every report, as a JSON Schema (applied strictly: ``required`` holds)."""
    props: dict[str, Any] = {
        "schema_version": {"type": "integer", "minimum": 1, "maximum": 1000},
        "memory": {"type": "object"},
    }
    for section, field, rule in COLUMNS.values():
        props.setdefault(section, {}).setdefault("properties", {})[field] = rule
    for name, (_, rule) in LISTS.items():
        props[name] = rule
    return {"type": "object", "required": ["schema_version", "memory"], "properties": props}


def kept(report: dict[str, Any]) -> dict[str, Any]:
    """The part of *report* the manager keeps in columns, in the report's shape (a section or an
    item that is not an object is kept as it is, for the schema to refuse)."""
    out: dict[str, Any] = {}
    for section, field, _ in COLUMNS.values():
        value = report.get(section)
        if isinstance(value, dict):
            if field in value:
                out.setdefault(section, {})[field] = value[field]
        elif section in report:
            out[section] = value
    for name, (fields, _) in LISTS.items():
        if name in report:
            items = report[name]
            out[name] = (
                [{f: i[f] for f in fields if f in i} if isinstance(i, dict) else i for i in items]
                if isinstance(items, list)
                else items
            )
    return out


def problem(report: dict[str, Any]) -> str | None:
    """Why the manager refuses *report* (a line naming the place and the rule), or None."""
    bad = reportschema.problem(report, needs(), relaxed=False)
    if bad is not None:
        return f"the report does not fit what the manager stores: {bad}"
    if report.get("schema_version") == SCHEMA_VERSION:
        bad = reportschema.problem(report)
    else:  # a newer agent's report is kept as sent; the fields in columns must still mean what they say
        bad = reportschema.problem(kept(report))
    return None if bad is None else f"the report does not fit its JSON Schema: {bad}"


def _plain(value: Any) -> Any:
    """A number the schema calls an integer, as an int (JSON's ``1.0`` is one)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def columns(report: dict[str, Any]) -> dict[str, Any]:
    """The values of ``COLUMNS`` (None where the report has none), ``gpus`` and ``consumers`` (the
    items' kept fields; ``consumers`` None where the report has no such list) and ``warnings`` (the
    codes), of a report that ``problem`` accepted."""
    k = kept(report)
    out = {name: _plain(k.get(section, {}).get(field)) for name, (section, field, _) in COLUMNS.items()}
    out["gpus"] = [
        {f: _plain(g.get(f, "" if f == "name" else None)) for f in LISTS["gpus"][0]} for g in k.get("gpus", [])
    ]
    out["warnings"] = [w["code"] for w in k.get("warnings", [])]
    fields = LISTS["consumers"][0]
    out["consumers"] = [{f: _plain(c.get(f)) for f in fields} for c in k["consumers"]] if "consumers" in k else None
    return out


__all__ = ["COLUMNS", "LISTS", "SCHEMA_VERSION", "columns", "kept", "needs", "problem"]
