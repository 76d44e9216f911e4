"""``oomguard manager``: check the settings, migrate the database (a line per revision applied; a
database ahead of this manager is refused), bind the port, print one start line (and a warning
when the fleet-wide agent token is on), serve. ``oomguard manager token NODE`` prints NODE's own
agent token instead (``web.credentials``; standard library only); ``oomguard manager migrate
[--check]`` migrates (or only checks) and exits (``db.steps``).

The options are defined with the other commands' (``oomguard.commands.manager``, the lazy bridge,
which imports this module only when the command runs); ``settings.settings_from`` turns them into
``Settings``. Every error is one line naming the flag, with the database password masked, and exit 2.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable

from oomguard.errors import EXIT_OK, EXIT_THRESHOLD, UsageError
from oomguard.manager import require_extra
from oomguard.manager.logs import sayer
from oomguard.manager.redact import Redactor, first_line
from oomguard.manager.settings import Settings, check_fleet_secrets, fleet_secrets_from, settings_from

FLEET_TOKEN_WARNING = (
    "oomguard: warning: the fleet-wide --agent-token is on: whoever holds it may write any node's "
    "reports and events (at most {cap} new nodes an hour); per-node tokens write their own node only "
    "(--fleet-secret, 'oomguard manager token NODE')"
)


BACKOFF_S = (1.0, 2.0, 4.0, 8.0)  # the waits between tries of an unreachable database; then 8 s each


def _migrate(
    settings: Settings,
    redact: Redactor,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] | None = None,
) -> None:
    """Apply the revisions the database is behind, a line each (``db.steps``). A database that
    cannot be reached (``OperationalError``: refused, no such host, a time-out) is tried again
    with backoff (``BACKOFF_S``), a line per try, for ``--db-wait`` (a database and its manager
    started together: the manager used to exit 2 at once); then, or for any other failure, or a
    database ahead of this manager, one line and exit 2."""
    from sqlalchemy.exc import OperationalError, SQLAlchemyError

    from oomguard.manager.db import steps

    say = say or sayer(settings.log_format, redact)
    deadline, tries = time.monotonic() + settings.db_wait_s, 0
    while True:
        tries += 1
        try:
            steps.upgrade(settings.db_url, say)
            return
        except RuntimeError as exc:  # ahead of this manager
            raise UsageError(str(exc)) from None
        except OperationalError as exc:
            wait = BACKOFF_S[min(tries, len(BACKOFF_S)) - 1]
            left = deadline - time.monotonic()
            if left <= 0:
                raise UsageError(
                    f"manager: cannot reach the database {settings.masked_db()} after {tries} tries "
                    f"(--db-wait {settings.db_wait_s:g}s): {redact(first_line(exc))}"
                ) from None
            pause = min(wait, left)
            say(
                f"oomguard manager: cannot reach the database {settings.masked_db()} (try {tries}): "
                f"{redact(first_line(exc))}; trying again in {pause:.1f} s (--db-wait {settings.db_wait_s:g}s)"
            )
            sleep(pause)
        except (SQLAlchemyError, OSError, ImportError) as exc:
            raise UsageError(
                f"manager: cannot open or migrate the database {settings.masked_db()}: {redact(first_line(exc))}"
            ) from None


def migrate_command(args: argparse.Namespace) -> int:
    """``oomguard manager migrate``: apply the revisions the database is behind, a line each, then
    say where it stands; ``--check``: only say it, exit 3 when it is behind (2 when ahead)."""
    from sqlalchemy.exc import SQLAlchemyError

    from oomguard.manager.db import steps

    settings = settings_from(args)
    redact = Redactor(settings.secrets())
    say = sayer(settings.log_format, redact)
    try:
        found = steps.state(settings.db_url)
    except (SQLAlchemyError, OSError) as exc:
        raise UsageError(
            f"manager migrate: cannot open the database {settings.masked_db()}: {redact(first_line(exc))}"
        ) from None
    if found.ahead:
        raise UsageError(steps.ahead_message(found))
    at = found.current or "none (an empty database)"
    if getattr(args, "check", False):
        if found.pending:
            say(
                f"oomguard manager: the database is at revision {at}, behind this manager's {found.head}: "
                f"{len(found.pending)} to apply ({', '.join(found.pending)}); run: oomguard manager migrate"
            )
            return EXIT_THRESHOLD
        say(f"oomguard manager: the database is at revision {found.head}, this manager's head")
        return EXIT_OK
    _migrate(settings, redact)
    done = "nothing to apply" if not found.pending else f"{len(found.pending)} applied"
    say(f"oomguard manager: the database is at revision {found.head}, this manager's head ({done})")
    return EXIT_OK


def start_line(settings: Settings, max_connections: int) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    hosts = ", ".join(settings.hosts())
    return (
        f"oomguard manager: serving http://{host}:{settings.port} (database {settings.masked_db()}; "
        f"Host allowed: {hosts}; at most {max_connections} connections)"
    )


def token_command(args: argparse.Namespace) -> int:
    """``oomguard manager token NODE``: NODE's agent token, signed with the first fleet secret, on stdout."""
    from oomguard.manager.web.credentials import node_token

    node = getattr(args, "node", None)
    if not node:
        raise UsageError("manager token: needs the node's name: oomguard manager token NODE")
    secrets = fleet_secrets_from(args)
    if not secrets:
        raise UsageError("manager token: needs the fleet secret: --fleet-secret or OOMGUARD_FLEET_SECRETS")
    check_fleet_secrets(secrets)
    try:
        token = node_token(secrets[0], node)
    except ValueError as exc:
        raise UsageError(f"manager token: NODE: {exc}") from None
    print(token)
    return EXIT_OK


def revoke_command(args: argparse.Namespace) -> int:
    """``oomguard manager revoke NODE [--reason TEXT]``, ``unrevoke NODE``, ``revoked``: the
    revoked-node list on the database itself (``store/revoked.py``), which every replica reads on
    each request. The database must be at this manager's head (``migrate`` first)."""
    import json

    from sqlalchemy.exc import SQLAlchemyError

    from oomguard.manager.db import make_engine, steps
    from oomguard.manager.store import revoked
    from oomguard.nodes import is_valid_node_name

    action, node, reason = args.action, flags_text(args, "node") or "", flags_text(args, "reason")
    if action != "revoked" and not is_valid_node_name(node):
        raise UsageError(f"manager {action}: needs a node's name: oomguard manager {action} NODE")
    if reason is not None and (action != "revoke" or len(reason) > 500 or "\x00" in reason):
        raise UsageError("manager: --reason goes with 'revoke', at most 500 characters")
    settings = settings_from(args)
    redact = Redactor(settings.secrets())
    say = sayer(settings.log_format, redact)
    try:
        found = steps.state(settings.db_url)
        if found.ahead or found.pending:
            raise UsageError(
                f"manager {action}: the database is not at this manager's revision {found.head}: "
                "run oomguard manager migrate first (or the manager that migrated it)"
            )
        engine = make_engine(settings.db_url)
        with engine.begin() as conn:
            if action == "revoked":
                print(json.dumps({"revoked": revoked.listed(conn)}, indent=2))
                return EXIT_OK
            if action == "revoke":
                done = revoked.revoke(conn, node, int(time.time() * 1000), reason)
                say(f"oomguard manager: node {node} " + ("revoked" if done else "was revoked already"))
            else:
                done = revoked.unrevoke(conn, node)
                say(f"oomguard manager: node {node} " + ("is no longer revoked" if done else "was not revoked"))
        engine.dispose()
    except SQLAlchemyError as exc:
        raise UsageError(
            f"manager {action}: cannot use the database {settings.masked_db()}: {redact(first_line(exc))}"
        ) from None
    return EXIT_OK


def flags_text(args: argparse.Namespace, name: str) -> str | None:
    value = getattr(args, name, None)
    return value if isinstance(value, str) else None


def manager_command(args: argparse.Namespace) -> int:
    """Check the settings, migrate the database, bind the port, then serve until stopped."""
    if getattr(args, "action", None) == "token":
        return token_command(args)
    require_extra()
    if getattr(args, "action", None) == "migrate":
        return migrate_command(args)
    if getattr(args, "action", None) in ("revoke", "unrevoke", "revoked"):
        return revoke_command(args)
    if getattr(args, "check", False):
        raise UsageError("manager: --check goes with 'migrate': oomguard manager migrate --check")
    settings = settings_from(args)
    redact = Redactor(settings.secrets())
    _migrate(settings, redact)
    from oomguard.manager.app import create_app
    from oomguard.manager.web import server

    cap = server.connection_cap(settings.max_connections, server.raise_nofile())
    sock = server.bind(settings.host, settings.port)
    say = sayer(settings.log_format, redact)
    say(start_line(settings, cap))
    if settings.agent_token is not None:
        sayer(settings.log_format, redact, logging.WARNING)(FLEET_TOKEN_WARNING.format(cap=settings.max_new_nodes))
    server.serve(
        create_app(settings),
        sock,
        max_connections=cap,
        header_timeout_s=settings.header_timeout_s,
        redactor=redact,
        per_client_connections=settings.per_client_connections,
        trusted_proxies=settings.trusted_proxies,
        log_format=settings.log_format,
    )
    return EXIT_OK
