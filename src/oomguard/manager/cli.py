"""``oomguard manager``: check settings, migrate the database, serve.

The options are defined with the other commands' (``oomguard.commands.manager``); this module
turns them into ``Settings`` and runs the server, and is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import os

from oomguard.errors import EXIT_OK, UsageError
from oomguard.manager import require_extra
from oomguard.units import parse_duration, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard.manager.settings import Settings


def _text(args: argparse.Namespace, name: str) -> str | None:
    given = getattr(args, name, None)
    return given if isinstance(given, str) and given else None


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings from the parsed flags and the token variables, checked (UsageError naming the flag)."""
    from oomguard.manager.settings import DEFAULT_DB, Settings

    port_text = _text(args, "port") or "8080"
    if not port_text.isdigit():
        raise UsageError(f"--port: expected a port number, got {port_text!r}")
    settings = Settings(
        db_url=_text(args, "db") or DEFAULT_DB,
        host=_text(args, "host") or "127.0.0.1",
        port=int(port_text),
        agent_token=_text(args, "agent_token") or os.environ.get("OOMGUARD_AGENT_TOKEN") or None,
        viewer_token=_text(args, "viewer_token") or os.environ.get("OOMGUARD_VIEWER_TOKEN") or None,
        retention_s=parse_duration(_text(args, "retention") or "30d", "--retention"),
        interval_s=parse_duration(_text(args, "interval") or "30s", "--interval"),
        max_body=parse_size(_text(args, "max_body") or "1MiB", "--max-body"),
    )
    settings.check()
    return settings


def _migrate(db_url: str) -> None:
    from sqlalchemy.exc import SQLAlchemyError

    from oomguard.manager.db import migrate

    try:
        migrate(db_url)
    except (SQLAlchemyError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"manager: cannot open or migrate the database {db_url!r}: {first}") from None


def manager_command(args: argparse.Namespace) -> int:
    """Check the settings, migrate the database, then serve until stopped."""
    require_extra()
    settings = settings_from(args)
    _migrate(settings.db_url)
    import uvicorn

    from oomguard.manager.app import create_app

    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    return EXIT_OK
