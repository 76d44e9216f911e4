"""Request bodies held to strict JSON before any route sees them (``check_body``): a problem is a
one-line reason, which the middleware answers with 422.

- RFC 8259 JSON only: ``NaN``, ``Infinity`` and ``-Infinity`` are not JSON (section 6), though
  Python's ``json`` accepts them; bytes must be UTF-8 (section 8.1).
- At most ``MAX_DEPTH`` levels of arrays and objects (a report is 4 deep; section 9 lets a parser
  limit nesting), so nothing downstream recurses without bound.
- No NUL character in any string or key: PostgreSQL text cannot hold one ("PostgreSQL text
  fields cannot contain NUL (0x00) bytes"), and no field of a report needs one.
- Integers within a signed 64-bit range (what a BIGINT column holds); a longer run of digits is
  refused whole (CPython caps int parsing at 4300 digits anyway: sys.set_int_max_str_digits).
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 32
INT_LIMIT = 2**63 - 1


class _NotJson(ValueError):
    pass


def _no_constants(name: str) -> Any:
    raise _NotJson(f"{name} is not JSON (RFC 8259)")


def _strict_loads(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constants)


def parse_strict(body: bytes) -> tuple[Any, str | None]:
    """(value, None) for a strict JSON body, else (None, the reason)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"the body is not UTF-8 (byte {exc.start})"
    try:
        value = _strict_loads(text)
    except _NotJson as exc:
        return None, str(exc)
    except RecursionError:
        return None, f"the body is nested more than {MAX_DEPTH} levels deep"
    except ValueError as exc:  # JSONDecodeError, and the int digit cap
        return None, f"invalid JSON: {str(exc).splitlines()[0][:200]}"
    problem = check_value(value)
    return (None, problem) if problem else (value, None)


def check_value(value: Any) -> str | None:
    """The first problem of a parsed JSON value (depth, NUL, integer range), or None. Iterative."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "$")]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, dict | list) and depth > MAX_DEPTH:
            return f"{where}: nested more than {MAX_DEPTH} levels deep"
        if isinstance(item, dict):
            for key, sub in item.items():
                if "\x00" in key:
                    return f"{where}: a key contains a NUL character"
                stack.append((sub, depth + 1, f"{where}.{key[:40]}"))
        elif isinstance(item, list):
            stack.extend((sub, depth + 1, f"{where}[{i}]") for i, sub in enumerate(item))
        elif isinstance(item, str) and "\x00" in item:
            return f"{where}: a string contains a NUL character"
        elif isinstance(item, int) and not isinstance(item, bool) and not -INT_LIMIT <= item <= INT_LIMIT:
            return f"{where}: an integer outside the signed 64-bit range"
    return None
