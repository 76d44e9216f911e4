"""The agent's default node name; the rule itself is ``oomguard.nodes`` (shared with the manager)."""

from __future__ import annotations

import socket

from oomguard.nodes import NODE_NAME_CHARS, sanitize_node_name

__all__ = ["NODE_NAME_CHARS", "default_node_name", "sanitize_node_name"]


def default_node_name(env: dict[str, str]) -> str:
    """``VAST_CONTAINERLABEL`` (the instance label on vast.ai), else the host name; sanitized
    (``oomguard.nodes.sanitize_node_name``), so the manager always accepts it."""
    label = env.get("VAST_CONTAINERLABEL", "").strip()
    if label:
        return sanitize_node_name(label)
    try:
        host = socket.gethostname()
    except OSError:
        host = ""
    return sanitize_node_name(host)
