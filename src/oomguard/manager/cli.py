"""``oomguard manager``: check settings, migrate the database, serve."""

from __future__ import annotations

import os
from typing import Any

from oomguard.commands.flags import text
from oomguard.errors import UsageError
from oomguard.manager import require_extra
from oomguard.units import parse_duration, parse_size


def manager_command(values: dict[str, Any]) -> int:
    require_extra()
    from oomguard.manager.settings import DEFAULT_DB, Settings

    port_text = text(values, "port") or "8080"
    if not port_text.isdigit():
        raise UsageError(f"--port: expected a port number, got {port_text!r}")
    settings = Settings(
        db_url=text(values, "db") or DEFAULT_DB,
        host=text(values, "host") or "127.0.0.1",
        port=int(port_text),
        agent_token=text(values, "agent_token") or os.environ.get("OOMGUARD_AGENT_TOKEN") or None,
        viewer_token=text(values, "viewer_token") or os.environ.get("OOMGUARD_VIEWER_TOKEN") or None,
        retention_s=parse_duration(text(values, "retention") or "30d", "--retention"),
        interval_s=parse_duration(text(values, "interval") or "30s", "--interval"),
        max_body=parse_size(text(values, "max_body") or "1MiB", "--max-body"),
    )
    settings.check()
    from sqlalchemy.exc import SQLAlchemyError

    from oomguard.manager.db import migrate

    try:
        migrate(settings.db_url)
    except (SQLAlchemyError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"manager: cannot open or migrate the database {settings.db_url!r}: {first}") from None
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
    return 0
