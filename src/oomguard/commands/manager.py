"""``oomguard manager``: the options here, the server in ``oomguard.manager.cli`` (extra [manager]).

A thin bridge: the manager package is imported only when this command runs, and a build without
it (the worker zipapp) or without the extra's packages says which ``pip install`` brings it.
"""

from __future__ import annotations

import argparse

from oomguard.commands import flags
from oomguard.errors import UsageError

SUMMARY = (
    "Run the fleet manager (extra [manager]): agents POST reports and events; an API, Prometheus "
    "metrics and a dashboard show every node. Migrates the database before it serves."
)
INSTALL_HINT = "pip install 'oomguard[manager]'"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "%(prog)s [--db URL] [--host HOST] [--port PORT] [--agent-token T] [--viewer-token T] [--retention 30d]\n"
        "       [--admin-token T] [--forget-after 7d] [--allowed-hosts NAMES] [--max-connections N]\n"
        "       [--session-ttl 12h]"
    )
    parser.description = SUMMARY
    parser.epilog = (
        "Off loopback, the agent and viewer tokens are required, of at least 16 characters; the admin token "
        "(forgetting nodes) is optional, and without it nobody may forget a node. Tokens are compared in constant "
        "time; whitespace around a token is stripped, with a warning.\n" + flags.DURATIONS
    )
    flags.option(parser, "--db", "database URL: sqlite:///oomguard.db (default) or postgresql://user@host/db", "URL")
    flags.option(parser, "--host", "address to listen on (default 127.0.0.1)", "HOST")
    flags.option(parser, "--port", "port (default 8080)", "PORT")
    flags.option(parser, "--agent-token", "bearer token agents write with (or OOMGUARD_AGENT_TOKEN)", "TOKEN")
    flags.option(parser, "--viewer-token", "bearer token readers use (or OOMGUARD_VIEWER_TOKEN)", "TOKEN")
    flags.option(
        parser,
        "--admin-token",
        "the operator's token: forgetting nodes (or OOMGUARD_ADMIN_TOKEN); none: nobody may",
        "TOKEN",
    )
    flags.option(parser, "--retention", "history kept (default 30d; OOM events are kept for ever)", "DURATION")
    flags.option(
        parser,
        "--forget-after",
        "archive nodes silent this long (default 7d, at least 1h and 3 intervals; 0 or off: never)",
        "DURATION",
    )
    flags.option(parser, "--interval", "the agents' report interval, for offline detection (default 30s)", "DURATION")
    flags.option(
        parser,
        "--working-set-line",
        "the working-set alert's line, a share of the limit (default 90%; or OOMGUARD_WORKING_SET_LINE)",
        "SHARE",
    )
    flags.option(parser, "--max-body", "largest request body (default 1MiB); larger gets 413", "SIZE")
    flags.option(
        parser,
        "--allowed-hosts",
        "Host header values accepted, comma-separated; *.example.com for subdomains, * for any "
        "(default: the --host address and localhost; any for 0.0.0.0 or ::)",
        "NAMES",
    )
    flags.option(
        parser, "--max-connections", "open connections at most (default 1000); above it a request gets 503", "N"
    )
    flags.option(parser, "--session-ttl", "how long a dashboard login lasts (default 12h)", "DURATION")


def execute(args: argparse.Namespace) -> int:
    try:
        from oomguard.manager.cli import manager_command
    except ModuleNotFoundError as exc:  # the worker zipapp ships without the manager
        if not (exc.name or "").startswith("oomguard.manager"):
            raise
        raise UsageError(f"manager: not in this build (the worker zipapp): {INSTALL_HINT}") from None
    return manager_command(args)
