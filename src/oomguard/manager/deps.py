"""What routes depend on (FastAPI ``Depends``): the store, the settings, and the token checks.

Agents write with ``Authorization: Bearer <agent token>``, readers with the viewer token, in the
header or in the ``oomguard_viewer`` cookie that ``/login`` sets (the dashboard, and the raw JSON
links it shows). A role without a token is open (allowed only on loopback, see Settings.check).
Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Cookie, Depends, Header, HTTPException, Request

from oomguard.manager.settings import Settings
from oomguard.manager.store import Store

COOKIE = "oomguard_viewer"


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for any other header."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None


def token_ok(expected: str | None, given: str | None) -> bool:
    """True when no token is required, or *given* is it (constant time)."""
    if expected is None:
        return True
    if not given:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def viewer_ok(settings: Settings, authorization: str | None, cookie: str | None) -> bool:
    """A reader: the bearer token of the header, else (no bearer header) the dashboard's cookie."""
    given = bearer(authorization)
    return token_ok(settings.viewer_token, cookie if given is None else given)


def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def _unauthorized() -> HTTPException:
    return HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})


def require_agent(settings: SettingsDep, authorization: Annotated[str | None, Header()] = None) -> None:
    """API writes: the agent token."""
    if not token_ok(settings.agent_token, bearer(authorization)):
        raise _unauthorized()


def require_viewer(
    settings: SettingsDep,
    authorization: Annotated[str | None, Header()] = None,
    oomguard_viewer: Annotated[str | None, Cookie()] = None,
) -> None:
    """API reads: the viewer token (header or cookie)."""
    if not viewer_ok(settings, authorization, oomguard_viewer):
        raise _unauthorized()
