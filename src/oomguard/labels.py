"""Node labels: the one rule the agent and the manager share (like ``nodes.py`` for names).

A label is a ``KEY=VALUE`` pair an agent or ``run --manager`` puts on its envelopes; the manager
keeps the latest per node and exports them on one ``oomguard_node_info`` series, so they follow
Prometheus' rules (https://prometheus.io/docs/concepts/data_model/#metric-names-and-labels):

- "Label names may contain ASCII letters, numbers, as well as underscores. They must match the
  regex ``[a-zA-Z_][a-zA-Z0-9_]*``. Label names beginning with ``__`` (two "_") are reserved for
  internal use." Here at most 63 characters as well.
- "A label with an empty label value is considered equivalent to a label that does not exist":
  a value is 1 to ``VALUE_MAX`` characters, every one printable (``str.isprintable``: no control,
  format, surrogate or unassigned code point, so nothing that could not be stored or shown).
- At most ``LABELS_MAX`` labels: they describe a node (its provider, instance, Kubernetes node),
  not a series' every dimension, and each is stored on every node.

``KEY_PATTERN`` is the key rule as regex text without a lookahead, which the manager's request
models run with pydantic's (Rust) regex engine; ``label_problem`` is the whole rule in Python.
Core module: imports nothing from oomguard.
"""

from __future__ import annotations

import re

KEY_PATTERN = r"^(?:[a-zA-Z][a-zA-Z0-9_]{0,62}|_[a-zA-Z0-9][a-zA-Z0-9_]{0,61}|_)$"  # no leading __
KEY_MAX = 63
VALUE_MAX = 256
LABELS_MAX = 16
CLASS_LABEL = "node_class"  # the operator's class of node (--node-class), for the fleet's recommender

# Python's "$" also matches before a trailing newline: fullmatch without the anchors is the same rule.
_KEY_RE = re.compile(KEY_PATTERN[1:-1], re.ASCII)


def shown(text: str) -> str:
    """*text* quoted for a one-line message, cut at 80 characters."""
    return repr(text if len(text) <= 80 else text[:77] + "...")


def label_problem(key: str, value: str) -> str | None:
    """Why *key* = *value* breaks the rule (one line), or None."""
    if key.startswith("__"):
        return f"label name {shown(key)} must not start with __ (reserved by Prometheus)"
    if _KEY_RE.fullmatch(key) is None:
        rule = f"1-{KEY_MAX} of [a-zA-Z0-9_], not starting with a digit"
        return f"label name {shown(key)} must be {rule} (Prometheus' rule)"
    if not value:
        return f"label {key} has an empty value (Prometheus treats that as no label)"
    if len(value) > VALUE_MAX:
        return f"label {key}'s value is {len(value)} characters long, more than {VALUE_MAX}"
    if not value.isprintable():
        return f"label {key}'s value holds a character that cannot be printed (a control character?)"
    return None


def labels_problem(labels: dict[str, str]) -> str | None:
    """The first problem of a whole set of labels (too many, or one that breaks the rule), or None."""
    if len(labels) > LABELS_MAX:
        return f"labels: {len(labels)}, at most {LABELS_MAX} ({', '.join(sorted(labels)[: LABELS_MAX + 4])})"
    for key, value in labels.items():
        problem = label_problem(key, value)
        if problem:
            return problem
    return None
