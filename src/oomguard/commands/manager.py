"""``oomguard manager``: the options here, the server in ``oomguard.manager.cli`` (extra [manager]).

``oomguard manager token NODE`` prints node NODE's own agent token (signed with the first
``--fleet-secret``) instead of serving.

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
        "%(prog)s [--db URL] [--host HOST] [--port PORT] [--fleet-secret S]... [--agent-token T]\n"
        "       [--viewer-token T] [--admin-token T] [--retention 30d] [--forget-after 7d] [--allowed-hosts NAMES]\n"
        "       [--max-connections N] [--max-connections-per-client N] [--max-new-nodes N]\n"
        "       [--max-events-per-node N] [--max-observations-per-node N]\n"
        "       [--max-profiles N] [--max-classes N] [--max-profiles-per-node N] [--max-classes-per-node N]\n"
        "       [--trusted-proxy CIDR]... [--session-ttl 12h] [--db-wait 60s] [--log-format text|json]\n"
        "       %(prog)s token NODE [--fleet-secret S]\n"
        "       %(prog)s migrate [--check] [--db URL]\n"
        "       %(prog)s revoke NODE [--reason TEXT] | unrevoke NODE | revoked [--db URL]"
    )
    parser.description = SUMMARY
    parser.epilog = (
        "Agents write with their node's own token (made by 'oomguard manager token NODE' from the fleet secret; "
        "it writes that node only) or with the fleet-wide --agent-token (an opt-in: it may write any node, and "
        "create at most --max-new-nodes nodes an hour). Off loopback, a fleet secret or the agent token, and the "
        "viewer token, are required, of at least 16 characters (fleet secrets everywhere); the admin token "
        "(forgetting nodes) is optional, and without it nobody may forget a node. Tokens are compared in constant "
        "time; whitespace around a token is stripped, with a warning. X-Forwarded-For, -Proto and -Host are "
        "believed only from --trusted-proxy addresses (none by default).\n" + flags.DURATIONS + "\n" + flags.ENVIRONMENT
    )
    parser.add_argument(
        "action",
        nargs="?",
        metavar="token|migrate|revoke|unrevoke|revoked",
        type=flags.OneOf(("token", "migrate", "revoke", "unrevoke", "revoked")),
        help="token: print NODE's agent token and exit; migrate: apply the database's migrations and exit; "
        "revoke NODE / unrevoke NODE: refuse (or accept again) NODE's token and writes on every replica; "
        "revoked: list the revoked nodes",
    )
    flags.option(parser, "--reason", "with revoke: why, kept with it (at most 500 characters)", "TEXT")
    parser.add_argument(
        "--check",
        action="store_true",
        help="with migrate: change nothing, exit 3 when the database is behind this manager (2 when ahead)",
    )
    parser.add_argument("node", nargs="?", metavar="NODE", help="the node of 'token', 'revoke' and 'unrevoke'")
    flags.option(
        parser,
        "--db",
        "database URL: sqlite:///oomguard.db (default) or postgresql://user@host/db (or OOMGUARD_DB, or the "
        "file OOMGUARD_DB_FILE names)",
        "URL",
    )
    flags.option(parser, "--host", "address to listen on (default 127.0.0.1)", "HOST")
    flags.option(parser, "--port", "port (default 8080)", "PORT")
    flags.option(
        parser,
        "--fleet-secret",
        "key of the per-node tokens (or OOMGUARD_FLEET_SECRETS, comma-separated); repeat it during a rotation: "
        "the first signs, all verify",
        "SECRET",
        action="append",
    )
    flags.option(
        parser,
        "--agent-token",
        "fleet-wide token any agent may write any node with (or OOMGUARD_AGENT_TOKEN); opt-in",
        "TOKEN",
    )
    flags.option(parser, "--viewer-token", "bearer token readers use (or OOMGUARD_VIEWER_TOKEN)", "TOKEN")
    flags.option(
        parser,
        "--admin-token",
        "the operator's token: forgetting nodes (or OOMGUARD_ADMIN_TOKEN); none: nobody may",
        "TOKEN",
    )
    flags.option(
        parser,
        "--retention",
        "history kept (default 30d; events and observations too, OOM kills included: their counts stay)",
        "DURATION",
    )
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
        "--write-queue-bytes",
        "writes held for the database at most (default 64MiB, or OOMGUARD_WRITE_QUEUE_BYTES); past it 503 at once",
        "SIZE",
    )
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
    flags.option(
        parser,
        "--max-connections-per-client",
        "open connections one client address may hold (default 64; or OOMGUARD_MAX_CONNECTIONS_PER_CLIENT)",
        "N",
    )
    flags.option(
        parser,
        "--max-new-nodes",
        "new nodes an hour the fleet-wide token may create (default 1000; or OOMGUARD_MAX_NEW_NODES); beyond: 429",
        "N",
    )
    flags.option(
        parser,
        "--max-events-per-node",
        "events (heartbeats too) one node may send a minute (default 300; or OOMGUARD_MAX_EVENTS_PER_NODE); "
        "beyond: 429",
        "N",
    )
    flags.option(
        parser,
        "--max-observations-per-node",
        "observations one node may send a minute (default 120; or OOMGUARD_MAX_OBSERVATIONS_PER_NODE); beyond: 429",
        "N",
    )
    for flag, what, default in (
        ("--max-profiles", "distinct profiles the fleet's observations may name", 200),
        ("--max-classes", "distinct classes of node the fleet's observations may have", 100),
        ("--max-profiles-per-node", "distinct profiles one node's observations may name", 16),
        ("--max-classes-per-node", "distinct classes one node's observations may have", 4),
    ):
        variable = "OOMGUARD_" + flag[2:].upper().replace("-", "_")
        flags.option(
            parser, flag, f"{what} in the last 14 days (default {default}; or {variable}); a new one beyond: 429", "N"
        )
    flags.option(
        parser,
        "--trusted-proxy",
        "a proxy (address or network) whose X-Forwarded-* headers are believed; repeatable "
        "(or OOMGUARD_TRUSTED_PROXIES, comma-separated; default none)",
        "CIDR",
        action="append",
    )
    flags.option(
        parser,
        "--log-format",
        "text (default) or json: one JSON object a line (time, level, logger, message and the line's own fields)",
        "FORMAT",
        type=flags.OneOf(("text", "json")),
    )
    flags.option(parser, "--session-ttl", "how long a dashboard login lasts (default 12h)", "DURATION")
    flags.option(
        parser,
        "--db-wait",
        "at start, how long to retry a database that cannot be reached, with backoff and a line per try "
        "(default 60s; 0: no retry)",
        "DURATION",
    )


def execute(args: argparse.Namespace) -> int:
    try:
        from oomguard.manager.cli import manager_command
    except ModuleNotFoundError as exc:  # the worker zipapp ships without the manager
        if not (exc.name or "").startswith("oomguard.manager"):
            raise
        raise UsageError(f"manager: not in this build (the worker zipapp): {INSTALL_HINT}") from None
    return manager_command(args)
