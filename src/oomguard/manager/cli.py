"""``oomguard manager``: check the settings, migrate the database, bind the port, print one start
line, serve.

The options are defined with the other commands' (``oomguard.commands.manager``, the lazy bridge,
which imports this module only when the command runs); ``settings.settings_from`` turns them into
``Settings``. Every error is one line naming the flag, with the database password masked, and exit 2.
"""

from __future__ import annotations

import argparse
import sys

from oomguard.errors import EXIT_OK, UsageError
from oomguard.manager import require_extra
from oomguard.manager.redact import Redactor, first_line
from oomguard.manager.settings import Settings, settings_from


def _migrate(settings: Settings, redact: Redactor) -> None:
    from sqlalchemy.exc import SQLAlchemyError

    from oomguard.manager.db import migrate

    try:
        migrate(settings.db_url)
    except (SQLAlchemyError, OSError, ImportError) as exc:
        raise UsageError(
            f"manager: cannot open or migrate the database {settings.masked_db()}: {redact(first_line(exc))}"
        ) from None


def start_line(settings: Settings, max_connections: int) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    hosts = ", ".join(settings.hosts())
    return (
        f"oomguard manager: serving http://{host}:{settings.port} (database {settings.masked_db()}; "
        f"Host allowed: {hosts}; at most {max_connections} connections)"
    )


def manager_command(args: argparse.Namespace) -> int:
    """Check the settings, migrate the database, bind the port, then serve until stopped."""
    require_extra()
    settings = settings_from(args)
    redact = Redactor(settings.secrets())
    _migrate(settings, redact)
    from oomguard.manager.app import create_app
    from oomguard.manager.web import server

    cap = server.connection_cap(settings.max_connections, server.raise_nofile())
    sock = server.bind(settings.host, settings.port)
    print(start_line(settings, cap), file=sys.stderr, flush=True)
    server.serve(
        create_app(settings), sock, max_connections=cap, header_timeout_s=settings.header_timeout_s, redactor=redact
    )
    return EXIT_OK
