"""What routes depend on (FastAPI ``Depends``): the store, the settings, the token checks, and
``db_read``/``db_write``, the one way a route waits on the database.

Agents write with ``Authorization: Bearer <token>``: their own node's token (``ogn1.<node>.<mac>``,
signed by a ``--fleet-secret``: ``web.credentials``), which writes that node only (403 for
another), or the fleet-wide ``--agent-token`` (an opt-in: any node, under the new-node cap).
Readers use the viewer token in the header, or the session cookie that ``/login`` sets
(``oomguard.manager.web.sessions``). A role without a token is open (allowed only on loopback, see
Settings.check). The operator's admin token (forgetting a node) is the exception: without one
configured, nothing may do it (403). Tokens are compared in constant time. A token is checked
first: a valid one always passes; a failed one counts against its client's allowance and the
global one (``sessions.FailureLimiter``) and is answered 429 instead of 401 once either is spent.
The client is the peer's address, or what a trusted proxy forwarded (``web.proxies``).

Every database wait is bounded by ``request_timeout_s``: a hung database gets a 503 in time,
while the stuck thread is left to finish on its own (a write that commits after its 503 is
stored once anyway: the agent retries with the same id).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Cookie, Depends, Header, HTTPException, Request
from sqlalchemy.exc import DataError, DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from oomguard.manager.settings import Settings
from oomguard.manager.store import Store
from oomguard.manager.store.growth import growth
from oomguard.manager.store.health import DbHealth
from oomguard.manager.web.credentials import WINDOW_MS, AgentCredential, NewNodes, is_node_token, token_node
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
    """The client's address: the peer's, or the one a trusted proxy forwarded. ``TrustedProxies``
    (``web.proxies``, outermost in ``app.create_app``) has already put it in the scope."""
    return request.client.host if request.client else "?"


def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


# The dependencies are ``async def`` though they never await. FastAPI's docs, "Concurrency and
# async / await", "Dependencies": "If a dependency is a standard def function instead of async
# def, it is run in the external threadpool": a hand-off to a worker thread and back, for each
# dependency of each request. These only read the app's state and compare tokens in memory.
async def _store(request: Request) -> Store:
    return get_store(request)


async def _settings(request: Request) -> Settings:
    return get_settings(request)


StoreDep = Annotated[Store, Depends(_store)]
SettingsDep = Annotated[Settings, Depends(_settings)]


def _unauthorized() -> HTTPException:
    return HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})


def too_many(retry_after: int) -> HTTPException:
    return HTTPException(429, "too many failed attempts; try again later", headers={"Retry-After": str(retry_after)})


def checked(request: Request, ok: Callable[[], bool], role: str = "agent", token: str | None = None) -> bool:
    """Run the credential check *ok*: True when it passes, whatever the limits say; a failure
    counts against the client's and the global allowance (``FailureLimiter``): False within
    both, else 429. A failure is counted and logged by *role* (``web.observed.AuthFailures``:
    the client, the node *token* claims, never the token)."""
    if ok():
        return True
    request.app.state.observed.auth.failed(role, client_of(request), token)
    limiter: FailureLimiter = request.app.state.limiter
    wait = limiter.failed(client_of(request))
    if wait:
        raise too_many(wait)
    return False


def viewer_ok(request: Request, authorization: str | None, cookie: str | None) -> bool:
    """A reader: the bearer token of the header, else (no bearer header) a valid session cookie.
    Only tokens count as guesses: a cookie's HMAC cannot be guessed, and an expired one is no attack."""
    settings = get_settings(request)
    if settings.viewer_token is None:
        return True
    given = bearer(authorization)
    if given is not None:
        return checked(request, lambda: token_ok(settings.viewer_token, given), "viewer", given)
    sessions: Sessions = request.app.state.sessions
    return sessions.valid(cookie)


def admin_ok(request: Request, token: str | None) -> bool:
    """True when *token* is the manager's admin token (constant time, under the client's failure
    limit: 429 while it is spent); False when it is not, or when the manager has none."""
    expected = get_settings(request).admin_token
    if expected is None:
        return False
    return checked(request, lambda: token_ok(expected, token), "admin", token)


NO_ADMIN_TOKEN = (
    "this manager has no admin token: forgetting nodes is disabled (start it with --admin-token "
    "or OOMGUARD_ADMIN_TOKEN)"
)


async def require_admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """Operator actions (forgetting a node): the admin token; 403 when the manager has none."""
    if get_settings(request).admin_token is None:
        raise HTTPException(403, NO_ADMIN_TOKEN)
    if not admin_ok(request, bearer(authorization)):
        raise _unauthorized()


def agent_credential(settings: Settings, given: str | None) -> AgentCredential | None:
    """What *given* (a bearer token, or None) proves for an agent's write; None: nothing."""
    if settings.agent_token is None and not settings.fleet_secrets:
        return AgentCredential(None, "open")  # loopback only (Settings.check)
    if settings.agent_token is not None and token_ok(settings.agent_token, given):
        return AgentCredential(None, "fleet")
    if is_node_token(given):
        node = token_node(given, settings.fleet_secrets)
        return AgentCredential(node, "node") if node is not None else None
    return None


async def require_agent(request: Request, authorization: Annotated[str | None, Header()] = None) -> AgentCredential:
    """API writes: the node's own token or the fleet-wide agent token (401; 429 past the limits)."""
    found: list[AgentCredential] = []

    def ok() -> bool:
        credential = agent_credential(get_settings(request), bearer(authorization))
        found.extend([credential] if credential is not None else [])
        return credential is not None

    if not checked(request, ok, "agent", bearer(authorization)):
        raise _unauthorized()
    return found[0]


AgentDep = Annotated[AgentCredential, Depends(require_agent)]
OTHER_NODE = "this token is another node's: a node's token writes that node's reports and events only"


class Revoked:
    """The revoked nodes (``store/revoked.py``) as this replica last read them: read again when a
    second has passed (``REFRESH_S``), so a revocation made on any replica, or by ``oomguard manager
    revoke`` on the database, holds on every replica within a second, at one small read a second,
    not one a request. A read that fails keeps the last list: the request's own write then meets
    the database's state and says it (a 503 of writes, not of this check)."""

    REFRESH_S = 1.0
    READ_TIMEOUT_S = 2.0

    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # node -> since when (ISO 8601)
        self._at = -float("inf")

    def changed(self) -> None:
        """This replica changed the list: read it again at the next request."""
        self._at = -float("inf")

    async def since(self, store: Store, node: str) -> str | None:
        """When *node* was revoked, or None."""
        if time.monotonic() - self._at >= self.REFRESH_S:
            # No lock (an asyncio lock is its event loop's): requests that find the list stale
            # together each read it, a few small reads a second at most.
            read = anyio.to_thread.run_sync(store.revoked_nodes, abandon_on_cancel=True)
            try:
                rows = await asyncio.wait_for(read, self.READ_TIMEOUT_S)
                self.names = {r["node"]: r["revoked"] for r in rows}
            except Exception:  # any failure: the last list stands (the class's doc)
                pass
            self._at = time.monotonic()
        return self.names.get(node)


async def not_revoked(request: Request, node: str) -> None:
    """403 when *node* is revoked (``Revoked``: as this replica read the list within the second)."""
    revoked: Revoked = request.app.state.revoked
    since = await revoked.since(get_store(request), node)
    if since is not None:
        raise HTTPException(403, f"node {node!r} is revoked (since {since}): its writes and its token are refused")


async def may_write(request: Request, credential: AgentCredential, node: str) -> None:
    """403 when *credential* is another node's, or *node* is revoked (``not_revoked``); for one not
    bound to a node, 429 when *node* would be a new node beyond the new-node cap
    (``credentials.NewNodes``)."""
    if not credential.may_write(node):
        raise HTTPException(403, OTHER_NODE)
    await not_revoked(request, node)
    if credential.node is not None:
        return
    new_nodes: NewNodes = request.app.state.new_nodes
    if new_nodes.known(node):
        return
    store = get_store(request)
    now = store.clock()
    full = new_nodes.full(now)
    exists, count, oldest = await db_read(request, growth, store.engine, node, now - WINDOW_MS, not full)
    if exists:
        new_nodes.remember(node)
        return
    wait = new_nodes.refuse(now) if full else new_nodes.admit(node, now, count, oldest)
    if wait:
        raise HTTPException(
            429,
            f"this token may create at most {new_nodes.cap} new nodes an hour (--max-new-nodes); "
            "try again later, or give the node its own token",
            headers={"Retry-After": str(wait)},
        )


OTHER_ROLE = "this token is not the operator's: excluding or including an observation needs the admin token"
NO_OPERATOR = (
    "this manager has no admin token: excluding observations is disabled (start it with --admin-token "
    "or OOMGUARD_ADMIN_TOKEN)"
)


def _another_role(request: Request, given: str | None) -> bool:
    """Whether *given* is a valid token of a role other than the operator's: the viewer's, the
    fleet-wide agent token or a node's (not counted as a failed guess: it is no guess)."""
    settings = get_settings(request)
    if not given:
        return False
    if settings.viewer_token is not None and token_ok(settings.viewer_token, given):
        return True
    credential = agent_credential(settings, given)
    return credential is not None and credential.kind != "open"


async def require_operator(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """An operator's write on what the fleet learns: the admin token (``require_admin``); a valid
    token of another role is 403 (it is known, and not allowed), any other 401."""
    if get_settings(request).admin_token is None:
        raise HTTPException(403, NO_OPERATOR)
    if _another_role(request, bearer(authorization)):
        raise HTTPException(403, OTHER_ROLE)
    await require_admin(request, authorization)


async def require_viewer(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    oomguard_session: Annotated[str | None, Cookie(alias=COOKIE)] = None,
) -> None:
    """API reads: the viewer token (header) or the dashboard's session (cookie)."""
    if not viewer_ok(request, authorization, oomguard_session):
        raise _unauthorized()


async def require_reader_or_agent(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    oomguard_session: Annotated[str | None, Cookie(alias=COOKIE)] = None,
) -> AgentCredential | None:
    """A reader (``require_viewer``: None) or an agent (its credential): a worker asks for its own
    node's learned size with the token it reports with (``plan --learned``, ``run --learned``)."""
    settings = get_settings(request)
    given = bearer(authorization)
    if given is not None and settings.viewer_token is not None and token_ok(settings.viewer_token, given):
        return None
    if given is None and viewer_ok(request, authorization, oomguard_session):
        return None
    found: list[AgentCredential] = []

    def ok() -> bool:
        credential = agent_credential(settings, given)
        found.extend([credential] if credential is not None else [])
        return credential is not None or settings.viewer_token is None

    if not checked(request, ok, "reader", given):
        raise _unauthorized()
    return found[0] if found else None


ReaderOrAgentDep = Annotated[AgentCredential | None, Depends(require_reader_or_agent)]


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


async def compute_read(request: Request, fn: Callable[..., T], *args: Any) -> T | None:
    """``fn(*args)`` on a worker thread where most of the time is the manager's own CPU (the
    recommender's answers): None when it outlives the request's time on the database, which is
    then not counted as a database failure; a database failure is one, as for ``db_read``."""
    work = anyio.to_thread.run_sync(lambda: fn(*args), abandon_on_cancel=True)
    try:
        return await asyncio.wait_for(work, get_settings(request).request_timeout_s)
    except (TimeoutError, asyncio.TimeoutError):
        return None  # its thread goes on (abandoned), and keeps its answer for the next read (store/kept.py)
    except DB_FAILURES as exc:
        raise request.app.state.health.failure("reads", exc) from exc


async def db_write(request: Request, work: Awaitable[T]) -> T:
    """An awaitable write (the store's group commit), within the request's time on the database."""
    return await _bounded(request, "writes", work)
