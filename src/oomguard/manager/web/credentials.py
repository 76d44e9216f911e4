"""Who may write for which node: per-node tokens, the fleet-wide token, and the new-node cap.

A **per-node token** is ``ogn1.<node>.<mac>``: the node's name and an HMAC-SHA256 (RFC 2104) of
it, keyed by a fleet secret (``--fleet-secret`` or ``OOMGUARD_FLEET_SECRETS``), base64url without
padding (RFC 4648 section 5). The manager keeps no table of tokens: it recomputes the MAC from the
name the token carries, so any replica with the secret checks any node's token, and a worker
holding node A's token can write node A only (the route compares the body's ``node``: 403
otherwise). ``oomguard manager token NODE`` prints one, signed with the first fleet secret; every
fleet secret given verifies, so a rotation runs with the new secret first and the old one second
until every node has its new token.

The **fleet-wide token** (``--agent-token``) is the explicit opt-in for fleets whose node names are
not known in advance: whoever holds it may write any node, and create nodes. What a credential not
bound to one node may create is capped (``NewNodes``): at most ``--max-new-nodes`` nodes first
seen in the last hour, counted in the database (``store.growth``: every node first seen in that
hour, whichever credential sent it, so replicas agree) and, for the requests in flight on this
replica, in memory; beyond it a new node's write gets 429 and the agent keeps it in its spool.

The module is standard library only: ``oomguard manager token`` needs no FastAPI.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from oomguard.nodes import is_valid_node_name

PREFIX = "ogn1."  # a per-node token, version 1
_CONTEXT = b"oomguard-node-token-v1\x00"  # the MAC says what it is for: never a session's or a form's
_MAC_CHARS = 43  # 32 bytes in base64url without padding
WINDOW_MS = 3_600_000  # the new-node cap's hour
FULL_MEMO_MS = 10_000  # a refusal is remembered this long (another replica may forget nodes meanwhile)
MAX_KNOWN = 200_000  # node names remembered as existing (an LRU would be no better: a miss costs one read)


def _mac(secret: str, node: str) -> str:
    digest = hmac.new(secret.encode(), _CONTEXT + node.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def node_token(secret: str, node: str) -> str:
    """The per-node token of *node* under the fleet secret *secret*; ValueError for a name the
    manager would refuse (``oomguard.nodes``)."""
    if not is_valid_node_name(node):
        raise ValueError("not a node name: 1 to 128 characters of [A-Za-z0-9._-], the first a letter or digit")
    return f"{PREFIX}{node}.{_mac(secret, node)}"


def is_node_token(token: str | None) -> bool:
    """True when *token* has a per-node token's shape (whatever its MAC)."""
    return bool(token) and str(token).startswith(PREFIX)


def token_node(token: str | None, secrets: Sequence[str]) -> str | None:
    """The node *token* was made for, when one of *secrets* signed it; None otherwise. Every
    secret is tried (constant time per secret, ``hmac.compare_digest``)."""
    if not secrets or not token or not token.startswith(PREFIX) or len(token) > len(PREFIX) + 129 + _MAC_CHARS:
        return None
    node, _, mac = token[len(PREFIX) :].rpartition(".")
    if len(mac) != _MAC_CHARS or not is_valid_node_name(node):
        return None
    matched = False
    for secret in secrets:
        matched |= hmac.compare_digest(mac.encode(), _mac(secret, node).encode())
    return node if matched else None


@dataclass(frozen=True)
class AgentCredential:
    """What an agent's request proved: *node*, the one node it may write (a per-node token), or
    None: any node (the fleet-wide token, or no token at all on loopback), under the new-node cap."""

    node: str | None
    kind: str  # "node", "fleet" or "open"

    def may_write(self, node: str) -> bool:
        return self.node is None or hmac.compare_digest(self.node.encode(), node.encode())


class NewNodes:
    """The new-node cap of the credentials not bound to a node: *cap* nodes first seen an hour.

    ``known`` remembers names seen to exist (no database read for them again); ``admit`` decides
    for a name that did not exist, from the database's count of the last hour (``db_count``) and
    this replica's own admissions of the hour, which also cover the requests still in flight
    (their nodes are not in the database yet). Thread-safe; memory bounded by *cap* admissions
    and ``MAX_KNOWN`` names."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._known: set[str] = set()
        self._admitted: dict[str, int] = {}  # name -> when (ms), this replica's, the last hour
        self._full_until = 0  # ms: refused lately, so new names need no count until then
        self._lock = threading.Lock()

    def full(self, now_ms: int) -> bool:
        """True for a while (``FULL_MEMO_MS`` at most) after a refusal: a flood of new names then
        costs one indexed read each (does the node exist?), not a count of the table."""
        return now_ms < self._full_until

    def known(self, name: str) -> bool:
        with self._lock:
            return name in self._known or name in self._admitted

    def remember(self, name: str) -> None:
        with self._lock:
            if len(self._known) >= MAX_KNOWN:
                self._known.clear()
            self._known.add(name)

    def seed(self, names: list[str]) -> None:
        """Remember *names* as existing (the nodes read at start), up to ``MAX_KNOWN``."""
        with self._lock:
            self._known.update(names[: max(0, MAX_KNOWN - len(self._known))])

    def admit(self, name: str, now_ms: int, db_count: int, db_oldest_ms: int | None) -> int:
        """0 when *name* may be created now (and it is counted); else the seconds to wait."""
        since = now_ms - WINDOW_MS
        with self._lock:
            self._admitted = {n: t for n, t in self._admitted.items() if t > since}
            if name in self._admitted:
                return 0
            if max(db_count, len(self._admitted)) < self.cap:
                self._admitted[name] = now_ms
                return 0
            times = [*self._admitted.values(), *([] if db_oldest_ms is None else [db_oldest_ms])]
            wait = max(1, (min(times, default=now_ms) + WINDOW_MS - now_ms + 999) // 1000)
            self._full_until = now_ms + min(wait * 1000, FULL_MEMO_MS)
        return wait

    def refuse(self, now_ms: int) -> int:
        """The seconds to wait for a new name while ``full``."""
        return max(1, (self._full_until - now_ms + 999) // 1000)
