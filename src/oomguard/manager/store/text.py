"""Stored JSON read back as text that every encoder can hold.

A report is kept as the agent sent it, JSON text with ``ensure_ascii`` (``\\uXXXX`` escapes for
anything outside ASCII), so both databases hold any string in it. One kind of string they hold
but nothing downstream can write: a lone surrogate (U+D800-U+DFFF), the JSON escape ``"\\ud800"``
with no partner. RFC 8259 section 8.2 lets JSON carry one ("the ABNF in this specification
allows member names and string values to contain bit sequences that cannot encode Unicode
characters; for example, "\\uDEAD""), and an honest agent sends one where a path held a byte that
is not UTF-8 (``oomguard.sources.root`` reads with ``surrogateescape``). Python's ``json.loads``
returns it as a ``str`` holding the surrogate, which UTF-8 cannot encode ("surrogates not
allowed", Python docs, "Error Handlers"): a JSON response or a page holding it would be a 500.

So every stored JSON text the manager shows is read through ``loads``: each lone surrogate
becomes its escape as text (``\\ud800``, six characters: the ``backslashreplace`` error handler),
keys too. The same holds for rows an older manager wrote. A NUL character never gets this far:
``oomguard.manager.bodies`` refuses it at the door (422), as PostgreSQL text cannot hold one.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A JSON escape of a UTF-16 surrogate (high D800-DBFF or low DC00-DFFF): only a text holding one
# can decode to a lone surrogate, so any other text is returned as json.loads gives it.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def safe(text: str) -> str:
    """*text* with each lone surrogate written as its escape (``\\ud800``); any other text as it is."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def clean(value: Any) -> Any:
    """*value* (a decoded JSON value) with every string and key ``safe``."""
    if isinstance(value, str):
        return safe(value)
    if isinstance(value, list):
        return [clean(item) for item in value]
    if isinstance(value, dict):
        return {safe(key): clean(item) for key, item in value.items()}
    return value


def loads(text: str) -> Any:
    """``json.loads(text)``, every string in it ``safe``: what a response or a page can encode."""
    value = json.loads(text)
    return clean(value) if _SURROGATE_ESCAPE.search(text) else value


__all__ = ["clean", "loads", "safe"]
