"""``oomguard manager``: check settings, migrate the database, bind the port, print one start
line, serve.

The options are defined with the other commands' (``oomguard.commands.manager``); this module
turns them into ``Settings`` and runs the server, and is imported only when the command runs.
Every error is one line naming the flag, with the database password masked, and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from oomguard.errors import EXIT_OK, UsageError
from oomguard.manager import require_extra
from oomguard.manager.redact import Redactor, first_line, url_secrets
from oomguard.units import parse_duration, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard.manager.settings import Settings


def _text(args: argparse.Namespace, name: str) -> str | None:
    given = getattr(args, name, None)
    return given if isinstance(given, str) and given else None


def _token(args: argparse.Namespace, name: str, variable: str) -> str | None:
    """A token from its flag, else its variable; surrounding whitespace (a file's trailing newline)
    is stripped with a warning, as no agent could ever send it."""
    flag = "--" + name.replace("_", "-")
    given, source = _text(args, name), flag
    if given is None:
        given, source = os.environ.get(variable) or None, variable
    if given is None:
        return None
    stripped = given.strip()
    if stripped != given:
        print(f"oomguard: warning: {source}: whitespace around the token stripped", file=sys.stderr)
    return stripped or None


def _number(args: argparse.Namespace, name: str, default: str) -> int:
    text = _text(args, name) or default
    if not (text.isascii() and text.isdigit() and len(text) <= 7):
        raise UsageError(f"--{name.replace('_', '-')}: expected a whole number, got {text!r}")
    return int(text)


def _hosts(args: argparse.Namespace) -> tuple[str, ...] | None:
    given = _text(args, "allowed_hosts")
    if given is None:
        return None
    hosts = tuple(h.strip() for h in given.split(",") if h.strip())
    if not hosts:
        raise UsageError("--allowed-hosts: expected host names separated by commas, or *")
    return hosts


def _forget_after(args: argparse.Namespace) -> float | None:
    """``--forget-after``: a duration (default 7d); ``0`` or ``off``: never archive."""
    text = _text(args, "forget_after") or "7d"
    if text.strip().lower() in ("off", "never"):
        return None
    return parse_duration(text, "--forget-after") or None


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings from the parsed flags and the token variables, checked (UsageError naming the flag)."""
    from oomguard.manager.settings import DEFAULT_DB, Settings

    settings = Settings(
        db_url=_text(args, "db") or DEFAULT_DB,
        host=_text(args, "host") or "127.0.0.1",
        port=_number(args, "port", "8080"),
        agent_token=_token(args, "agent_token", "OOMGUARD_AGENT_TOKEN"),
        viewer_token=_token(args, "viewer_token", "OOMGUARD_VIEWER_TOKEN"),
        admin_token=_token(args, "admin_token", "OOMGUARD_ADMIN_TOKEN"),
        retention_s=parse_duration(_text(args, "retention") or "30d", "--retention"),
        forget_after_s=_forget_after(args),
        interval_s=parse_duration(_text(args, "interval") or "30s", "--interval"),
        max_body=parse_size(_text(args, "max_body") or "1MiB", "--max-body"),
        allowed_hosts=_hosts(args),
        max_connections=_number(args, "max_connections", "1000"),
        session_ttl_s=parse_duration(_text(args, "session_ttl") or "12h", "--session-ttl"),
    )
    settings.check()
    return settings


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
    redact = Redactor(
        [settings.agent_token, settings.viewer_token, settings.admin_token, *url_secrets(settings.db_url)]
    )
    _migrate(settings, redact)
    from oomguard.manager import server
    from oomguard.manager.app import create_app

    cap = server.connection_cap(settings.max_connections, server.raise_nofile())
    sock = server.bind(settings.host, settings.port)
    print(start_line(settings, cap), file=sys.stderr, flush=True)
    server.serve(
        create_app(settings), sock, max_connections=cap, header_timeout_s=settings.header_timeout_s, redactor=redact
    )
    return EXIT_OK
