"""Node names: the one rule the agent and the manager share.

A node name is what the manager files a node's reports and events under: it ends up in URL
paths, HTML, file names and Prometheus labels. The rule: 1 to 128 characters from
``[A-Za-z0-9._-]``, the first a letter or digit (so never empty, never ``.``/``..``, never a
leading ``-`` that a command line would read as an option, never a hidden ``.name``).

``NODE_PATTERN`` is the rule as regex text for the manager's request models (pydantic runs it
with the Rust ``regex`` crate, where ``$`` is the end of the text); ``is_valid_node_name`` is the
same rule in Python; ``sanitize_node_name`` turns any text into a name the rule accepts.
Core module: imports nothing from oomguard.
"""

from __future__ import annotations

import re
import unicodedata
import zlib

NODE_NAME_MAX = 128
NODE_NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"
NODE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
NODE_NAME_FALLBACK = "node"
# A profile's name (as ``plan --profile`` names it), and a class of node: an operator's
# (``--node-class``, ``OOMGUARD_NODE_CLASS``, the ``node_class`` label) or one the manager derives
# (``manager/learning.py``: ``gpu:NVIDIA-H100-80GB-HBM3/ram:512GiB``).
PROFILE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
NODE_CLASS_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/+-]{0,63}$"

# Python's "$" also matches before a trailing newline: fullmatch without anchors is the same rule.
_NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)
_ALLOWED = frozenset(NODE_NAME_CHARS)
_LEADING_JUNK = "._-"


def is_valid_node_name(name: object) -> bool:
    """True when the manager accepts *name* as a node name."""
    return isinstance(name, str) and _NODE_RE.fullmatch(name) is not None


def _ascii_fold(text: str) -> str:
    """``Ünïcode`` -> ``Unicode``, ``ﬁ`` -> ``fi``, full-width ``Ａ`` -> ``A``: compatibility
    decomposition (NFKD, Unicode Standard Annex #15), combining marks dropped."""
    if text.isascii():
        return text
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def sanitize_node_name(name: str) -> str:
    """A name the manager accepts, as close to *name* as the rule allows.

    Accents are folded to ASCII, every other character outside ``[A-Za-z0-9._-]`` becomes
    ``-``, leading ``.``, ``_`` and ``-`` are dropped, and the result is cut at 128
    characters. A valid name is returned unchanged. Empty text gives ``node``; text with no
    usable character at all (``日本``, ``...``) gives ``node-<crc32 of the text>``, so that two
    such hosts still get two names.
    """
    if is_valid_node_name(name):
        return name
    folded = "".join(c if c in _ALLOWED else "-" for c in _ascii_fold(name[: NODE_NAME_MAX * 4]))
    clean = folded.lstrip(_LEADING_JUNK)[:NODE_NAME_MAX]
    if clean:
        return clean
    if not name:
        return NODE_NAME_FALLBACK
    digest = zlib.crc32(name.encode("utf-8", "surrogatepass"))
    return f"{NODE_NAME_FALLBACK}-{digest:08x}"


_CLASS_RE = re.compile(NODE_CLASS_PATTERN[1:-1], re.ASCII)
_PROFILE_RE = re.compile(PROFILE_PATTERN[1:-1], re.ASCII)


def is_valid_profile_name(name: object) -> bool:
    """True when the manager accepts *name* as a profile's name."""
    return isinstance(name, str) and _PROFILE_RE.fullmatch(name) is not None


def node_class_problem(value: str) -> str | None:
    """Why *value* is not a class of node the manager takes (one line), or None."""
    if _CLASS_RE.fullmatch(value) is None:
        shown = repr(value if len(value) <= 80 else value[:77] + "...")
        return f"a class of node is 1-64 of [A-Za-z0-9._:/+-], the first a letter or digit; got {shown}"
    return None
