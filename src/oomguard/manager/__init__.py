"""The fleet manager (extra ``[manager]``): agents report to it; an API, Prometheus metrics and a
dashboard show every node's truth and OOM history. Nothing here is imported by the worker side."""

from __future__ import annotations

from oomguard.errors import UsageError

INSTALL_HINT = "pip install 'oomguard[manager]'"


def require_extra() -> None:
    """Raise a one-line UsageError naming the pip command when the extra is missing."""
    missing = []
    for module in ("fastapi", "uvicorn", "sqlalchemy", "alembic", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise UsageError(f"manager: the manager extra is not installed (missing {', '.join(missing)}): {INSTALL_HINT}")
