"""What routes depend on (FastAPI ``Depends``): the store, the settings, the token checks, and
``db_read``/``db_write``, the one way a route waits on the database.

Agents write with ``Authorization: Bearer <agent token>``, readers with the viewer token in the
header, or with the session cookie that ``/login`` sets (``oomguard.manager.web.sessions``). A role
without a token is open (allowed only on loopback, see Settings.check). The operator's admin
token (forgetting a node) is the exception: without one configured, nothing may do it (403).
Tokens are compared in constant time; a client's failed tokens are limited (429 once its bucket
is empty), the admin token's with the others.

Every database wait is bounded by ``request_timeout_s``: a hung database gets a 503 in time,
while the stuck thread is left to finish on its own (a write that commits after its 503 is
stored once anyway: the agent retries with the same id).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Cookie, Depends, Header, HTTPException, Request
from sqlalchemy.exc import DataError, DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from oomguard.manager.settings import Settings
from oomguard.manager.store import Store
from oomguard.manager.store.health import DbHealth
from oomguard.manager.web.sessions import COOKIE, FailureLimiter, Sessions

T = TypeVar("T")
DB_FAILURES = (DBAPIError, PoolTimeout, TimeoutError, asyncio.TimeoutError)


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


def client_of(request: Request) -> str:
    return request.client.host if request.client else "?"


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


def too_many(retry_after: int) -> HTTPException:
    return HTTPException(429, "too many failed attempts; try again later", headers={"Retry-After": str(retry_after)})


def checked(request: Request, ok: Callable[[], bool]) -> bool:
    """Run the credential check *ok* under the client's failure limit: 429 while it is spent."""
    limiter: FailureLimiter = request.app.state.limiter
    client = client_of(request)
    wait = limiter.retry_after(client)
    if wait:
        raise too_many(wait)
    if ok():
        return True
    limiter.failed(client)
    return False


def viewer_ok(request: Request, authorization: str | None, cookie: str | None) -> bool:
    """A reader: the bearer token of the header, else (no bearer header) a valid session cookie.
    Only tokens count as guesses: a cookie's HMAC cannot be guessed, and an expired one is no attack."""
    settings = get_settings(request)
    if settings.viewer_token is None:
        return True
    given = bearer(authorization)
    if given is not None:
        return checked(request, lambda: token_ok(settings.viewer_token, given))
    sessions: Sessions = request.app.state.sessions
    return sessions.valid(cookie)


def admin_ok(request: Request, token: str | None) -> bool:
    """True when *token* is the manager's admin token (constant time, under the client's failure
    limit: 429 while it is spent); False when it is not, or when the manager has none."""
    expected = get_settings(request).admin_token
    if expected is None:
        return False
    return checked(request, lambda: token_ok(expected, token))


NO_ADMIN_TOKEN = (
    "this manager has no admin token: forgetting nodes is disabled (start it with --admin-token "
    "or OOMGUARD_ADMIN_TOKEN)"
)


def require_admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """Operator actions (forgetting a node): the admin token; 403 when the manager has none."""
    if get_settings(request).admin_token is None:
        raise HTTPException(403, NO_ADMIN_TOKEN)
    if not admin_ok(request, bearer(authorization)):
        raise _unauthorized()


def require_agent(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """API writes: the agent token."""
    expected = get_settings(request).agent_token
    if expected is not None and not checked(request, lambda: token_ok(expected, bearer(authorization))):
        raise _unauthorized()


def require_viewer(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    oomguard_session: Annotated[str | None, Cookie(alias=COOKIE)] = None,
) -> None:
    """API reads: the viewer token (header) or the dashboard's session (cookie)."""
    if not viewer_ok(request, authorization, oomguard_session):
        raise _unauthorized()


async def _bounded(request: Request, direction: str, work: Awaitable[T]) -> T:
    health: DbHealth = request.app.state.health
    timeout = get_settings(request).request_timeout_s
    try:
        result = await asyncio.wait_for(work, timeout)
    except DataError as exc:  # a value the database refuses: the client's input
        raise HTTPException(422, "the database refused a value of this request") from exc
    except (TimeoutError, asyncio.TimeoutError) as exc:
        raise health.failure(direction, TimeoutError(f"no answer from the database within {timeout:g}s")) from exc
    except DB_FAILURES as exc:
        raise health.failure(direction, exc) from exc
    health.success(direction)
    return result


async def db_read(request: Request, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a worker thread, within the request's time on the database."""
    work = anyio.to_thread.run_sync(lambda: fn(*args, **kwargs), abandon_on_cancel=True)
    return await _bounded(request, "reads", work)


async def db_write(request: Request, work: Awaitable[T]) -> T:
    """An awaitable write (the store's group commit), within the request's time on the database."""
    return await _bounded(request, "writes", work)
