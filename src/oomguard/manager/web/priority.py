"""Which requests the connection limits protect (issue 37, item 4): ``/healthz``, and a request that
carries a valid credential, a token of any role that has one (the fleet-wide agent token, a node's
own token, the viewer's, the operator's) or a valid dashboard session. Judged on the request's
headers, before the app runs (``protocol.GuardedH11Protocol``): such a request is served above
``--max-connections`` where others get 503, and its connection is not evicted while it is served
(``connections.Admission``). A guess is no credential: nothing is counted here (the app counts
failed tokens against the client, ``deps.checked``). A role without a token (open, loopback only)
protects nothing: every client could claim it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from http.cookies import CookieError, SimpleCookie
from typing import Any

from oomguard.manager.web.credentials import is_node_token, token_node
from oomguard.manager.web.deps import bearer, token_ok
from oomguard.manager.web.sessions import COOKIE, Sessions

HEALTH = b"/healthz"
Classifier = Callable[[bytes, bytes, Sequence[tuple[bytes, bytes]]], bool]  # (method, target, headers)


def _session(header: bytes) -> str | None:
    """The session cookie's value in a ``Cookie`` header, or None."""
    try:
        jar: SimpleCookie = SimpleCookie(header.decode("latin-1"))
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None else None


def classifier(app: Any) -> Classifier:
    """*app*'s rule (its ``state.settings`` and ``state.sessions``); ``/healthz`` only for an app
    without them."""
    state = getattr(app, "state", None)
    settings = getattr(state, "settings", None)
    sessions: Sessions | None = getattr(state, "sessions", None)
    tokens = tuple(
        t for t in (getattr(settings, name, None) for name in ("agent_token", "viewer_token", "admin_token")) if t
    )
    secrets = tuple(getattr(settings, "fleet_secrets", ()) or ())
    viewer = getattr(settings, "viewer_token", None)

    def credential(name: bytes, value: bytes) -> bool:
        if name == b"authorization":
            given = bearer(value.decode("latin-1"))
            if not given:
                return False
            if any(token_ok(t, given) for t in tokens):
                return True
            return bool(secrets) and is_node_token(given) and token_node(given, secrets) is not None
        if name == b"cookie" and sessions is not None and viewer is not None:
            return sessions.valid(_session(value))
        return False

    def protected(method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]]) -> bool:
        if target.split(b"?", 1)[0] == HEALTH:
            return True
        return any(credential(name.lower(), value) for name, value in headers)

    return protected
