"""Node names: what the manager files a node's reports and events under.

A node name is at most 128 characters from ``NODE_NAME_CHARS`` (safe in a URL path, a file
name and a Prometheus label), never empty and never only dots.
"""

from __future__ import annotations

import socket

NODE_NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"
NODE_NAME_MAX = 128
_NODE_NAME_SET = frozenset(NODE_NAME_CHARS)


def sanitize_node_name(name: str) -> str:
    """*name* with every character outside ``NODE_NAME_CHARS`` replaced by ``-``, at most
    128 characters; never empty, never only dots (fallback ``node``)."""
    clean = "".join(c if c in _NODE_NAME_SET else "-" for c in name[:NODE_NAME_MAX])
    return clean if clean.strip(".") else "node"


def default_node_name(env: dict[str, str]) -> str:
    """``VAST_CONTAINERLABEL`` (the instance label on vast.ai), else the host name; sanitized."""
    label = env.get("VAST_CONTAINERLABEL", "").strip()
    if label:
        return sanitize_node_name(label)
    try:
        host = socket.gethostname()
    except OSError:
        host = ""
    return sanitize_node_name(host)
