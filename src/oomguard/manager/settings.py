"""The manager's configuration, in one place: ``Settings`` (every knob and its default), built from
the command's flags and the token variables (``settings_from``) and checked (``Settings.check``)
before anything starts. The flags themselves are declared with the other commands' options
(``oomguard.commands.manager``, the one lazy bridge); a flag not given keeps its field's default,
or takes its variable's value where it has one (``OOMGUARD_*``; a flag beats its variable)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
import sqlite3
import sys
from dataclasses import dataclass
from typing import Any

from oomguard.errors import UsageError
from oomguard.manager.redact import mask_url, url_secrets
from oomguard.units import MiB, parse_duration, parse_size

DEFAULT_DB = "sqlite:///oomguard.db"
SQLITE_MIN = (3, 35, 0)
DB_SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+psycopg")
MIN_TOKEN = 16  # characters, off loopback: `openssl rand -hex 32` gives 64
WILDCARDS = ("0.0.0.0", "::", "")
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
_HOST_ENTRY = re.compile(r"^(\*|(\*\.)?[A-Za-z0-9_.:-]{1,253}|\[[0-9A-Fa-f:.]+\])$")
_TOKEN = re.compile(r"^[\x21-\x7e]+$")  # visible ASCII: what an Authorization header can carry as is


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def db_scheme(url: str) -> str | None:
    """The scheme of a database URL (``sqlite``, ``postgresql``, ...), None when it is no URL."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", url)
    return m[1].lower() if m else None


FORGET_AFTER_MIN_S = 3600.0  # --forget-after at least this (and 3 intervals)
WRITE_QUEUE_BYTES_DEFAULT = 64 * MiB  # the writes the writer holds at once (store/commit.py applies it)
PER_CLIENT_DEFAULT = 64  # connections one client address may hold (web/server.py says why, and applies it)
MAX_COUNT = 1_000_000  # the most --max-new-nodes, --max-connections-per-client and the quotas may be
# A node's quotas a minute (web/quotas.py applies them, and says why they are generous): events (a
# heartbeat included) and observations. Real use: a heartbeat a minute and three events a restart
# per supervisor, an observation per worker run; 16 supervisors on one node crash-looping together
# (1 s backoff, doubling) send 240 events and 80 observations in their first minute.
EVENTS_PER_NODE = 300
OBSERVATIONS_PER_NODE = 120
# Distinct profiles and classes in the recommender's window (store/claims.py: --max-profiles and
# the like): a fleet runs a few provers' and trainers' profiles on a few kinds of node; the
# profile pages and /metrics are measured at these (BENCHMARKS.md, "the fleet's lessons at the caps").
MAX_PROFILES = 200
MAX_CLASSES = 100
MAX_PROFILES_PER_NODE = 16
MAX_CLASSES_PER_NODE = 4
LOG_FORMATS = ("text", "json")  # --log-format's (manager/logs.py writes them)
NODE_TOKEN_PREFIX = "ogn1."  # web.credentials.PREFIX: a fleet-wide token must not look like a node's
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass
class Settings:
    db_url: str = DEFAULT_DB
    host: str = "127.0.0.1"
    port: int = 8080
    agent_token: str | None = None  # the fleet-wide token (an opt-in: it may write any node)
    # Per-node tokens' keys (--fleet-secret, OOMGUARD_FLEET_SECRETS): the first signs
    # `oomguard manager token NODE`, every one verifies (a rotation holds two).
    fleet_secrets: tuple[str, ...] = ()
    viewer_token: str | None = None
    admin_token: str | None = None  # the operator's: forgetting nodes (none: nobody may)
    retention_s: float = 30 * 86400.0
    forget_after_s: float | None = 7 * 86400.0  # archive nodes silent this long; None: never
    interval_s: float = 30.0  # the agents' default interval, for offline detection
    max_body: int = MiB
    write_queue_bytes: int = WRITE_QUEUE_BYTES_DEFAULT  # past it a write gets 503 at once
    thin_every_s: float = 600.0
    allowed_hosts: tuple[str, ...] | None = None  # None: the bind address and localhost (``hosts()``)
    max_connections: int = 1000  # above it, a request gets 503 at once (uvicorn's limit_concurrency)
    db_timeout_s: float = 5.0  # statement, lock and pool waits; SQLite's busy timeout
    request_timeout_s: float = 8.0  # a request's whole wait on the database, under the agents' 10 s
    header_timeout_s: float = 10.0  # a connection must send its request's headers within this
    body_timeout_s: float = 30.0  # ... and its body within this
    session_ttl_s: float = 12 * 3600.0  # the dashboard's login
    db_wait_s: float = 60.0  # at start, how long an unreachable database is retried (cli._migrate)
    login_burst: int = 10  # failed logins or bearer tokens per client before 429 ...
    login_refill_s: float = 6.0  # ... and one more allowed every this many seconds
    failed_tokens_per_minute: int = 120  # failed tokens of all clients together, before 429
    max_new_nodes: int = 1000  # new nodes an hour for a credential not bound to one node
    max_events_per_node: int = EVENTS_PER_NODE  # a node's events (heartbeats too) a minute; past it 429
    max_observations_per_node: int = OBSERVATIONS_PER_NODE  # a node's observations a minute; past it 429
    # Distinct profiles and classes in the recommender's window (store/claims.py); a new one past a cap: 429.
    max_profiles: int = MAX_PROFILES
    max_classes: int = MAX_CLASSES
    max_profiles_per_node: int = MAX_PROFILES_PER_NODE
    max_classes_per_node: int = MAX_CLASSES_PER_NODE
    per_client_connections: int = PER_CLIENT_DEFAULT  # open connections per client address
    trusted_proxies: tuple[Network, ...] = ()  # whose X-Forwarded-* headers are believed (none)
    # The working-set alert's line: this share of the effective limit (--working-set-line or
    # OOMGUARD_WORKING_SET_LINE: "90%" or "0.9"); a working set above the budget alerts too.
    working_set_line: float = 0.9
    log_format: str = "text"  # or "json", one object a line (manager/logs.py)

    def hosts(self) -> tuple[str, ...]:
        """The Host header values accepted: ``--allowed-hosts``, else the bind address and localhost;
        any Host for a wildcard bind (tokens are required there, so a rebound name gains nothing)."""
        if self.allowed_hosts is not None:
            return self.allowed_hosts
        if self.host in WILDCARDS:
            return ("*",)
        return tuple(dict.fromkeys((self.host.lower(), *LOCAL_NAMES)))

    def caps(self) -> dict[str, int]:
        """The caps on distinct profiles and classes, as ``claims.Caps.set_limits`` takes them."""
        return {
            "profiles": self.max_profiles,
            "classes": self.max_classes,
            "profiles_per_node": self.max_profiles_per_node,
            "classes_per_node": self.max_classes_per_node,
        }

    def masked_db(self) -> str:
        return mask_url(self.db_url)

    def secrets(self) -> list[str | None]:
        """What no message may show: the tokens, the fleet secrets and the database URL's passwords."""
        return [self.agent_token, self.viewer_token, self.admin_token, *self.fleet_secrets, *url_secrets(self.db_url)]

    def check(self) -> None:
        self._check_db()
        loopback = is_loopback(self.host)
        if not loopback and not ((self.agent_token or self.fleet_secrets) and self.viewer_token):
            raise UsageError(
                f"manager: refusing to listen on {self.host}, which is not a loopback address, without both "
                "an agent credential (--fleet-secret or --agent-token) and --viewer-token (or "
                "OOMGUARD_FLEET_SECRETS / OOMGUARD_AGENT_TOKEN, OOMGUARD_VIEWER_TOKEN)"
            )
        tokens = (
            ("--agent-token", self.agent_token),
            ("--viewer-token", self.viewer_token),
            ("--admin-token", self.admin_token),
            *(("--fleet-secret", secret) for secret in self.fleet_secrets),
        )
        for flag, token in tokens[:3]:
            self._check_token(flag, token, loopback)
        check_fleet_secrets(self.fleet_secrets)
        if self.agent_token is not None and self.agent_token.startswith(NODE_TOKEN_PREFIX):
            raise UsageError(f"--agent-token: must not start with {NODE_TOKEN_PREFIX!r} (a node's token does)")
        for i, (flag, token) in enumerate(tokens):
            for other, token2 in tokens[i + 1 :]:
                if token is not None and token == token2:
                    raise UsageError(f"manager: {flag} and {other} must differ")
        if not 0 < self.port < 65536:
            raise UsageError(f"--port: must be 1 to 65535, got {self.port}")
        if self.max_body < 1024:
            raise UsageError("--max-body: must be at least 1 KiB")
        if self.write_queue_bytes < MiB:
            raise UsageError("--write-queue-bytes: must be at least 1 MiB")
        if not 8 <= self.max_connections <= 1_000_000:
            raise UsageError(f"--max-connections: must be 8 to 1000000, got {self.max_connections}")
        for flag, count in (
            ("--max-connections-per-client", self.per_client_connections),
            ("--max-new-nodes", self.max_new_nodes),
            ("--max-events-per-node", self.max_events_per_node),
            ("--max-observations-per-node", self.max_observations_per_node),
            ("--max-profiles", self.max_profiles),
            ("--max-classes", self.max_classes),
            ("--max-profiles-per-node", self.max_profiles_per_node),
            ("--max-classes-per-node", self.max_classes_per_node),
        ):
            if not 1 <= count <= MAX_COUNT:
                raise UsageError(f"{flag}: must be 1 to {MAX_COUNT}, got {count}")
        for entry in self.allowed_hosts or ():
            if not _HOST_ENTRY.match(entry):
                raise UsageError(f"--allowed-hosts: {entry!r} is not a host name, an address or *")
        if self.log_format not in LOG_FORMATS:
            raise UsageError(f"--log-format: expected one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}")
        if not 0 < self.working_set_line <= 1:
            raise UsageError(f"--working-set-line: must be above 0% and at most 100%, got {self.working_set_line:g}")
        floor = max(FORGET_AFTER_MIN_S, 3 * self.interval_s)
        if self.forget_after_s is not None and self.forget_after_s < floor:
            # A node must be seen offline (three missed intervals) before it is archived.
            raise UsageError(
                f"--forget-after: must be at least {floor:g} s (1 h, and 3 times --interval), "
                f"got {self.forget_after_s:g} s; 0 or off: never archive"
            )

    def _check_db(self) -> None:
        scheme = db_scheme(self.db_url)
        if scheme not in DB_SCHEMES:
            what = f"scheme {scheme!r}" if scheme else f"URL {mask_url(self.db_url)!r}"
            raise UsageError(
                f"--db: unsupported database {what}: use sqlite:///PATH or postgresql://USER@HOST/DATABASE"
            )
        if scheme == "sqlite" and sqlite3.sqlite_version_info < SQLITE_MIN:
            # The writer's INSERT ... RETURNING needs 3.35 (https://sqlite.org/lang_returning.html),
            # the risk sort's NULLS LAST 3.30 (https://sqlite.org/lang_select.html#nullslast).
            raise UsageError(
                f"--db: this Python's SQLite is {sqlite3.sqlite_version}; the manager needs 3.35 or later "
                "(or use postgresql://USER@HOST/DATABASE)"
            )

    @staticmethod
    def _check_token(flag: str, token: str | None, loopback: bool) -> None:
        if token is None:
            return
        if not _TOKEN.match(token):
            raise UsageError(f"{flag}: only visible ASCII characters, no spaces")
        if not loopback and len(token) < MIN_TOKEN:
            raise UsageError(
                f"{flag}: at least {MIN_TOKEN} characters off loopback (got {len(token)}); "
                "make one with: openssl rand -hex 32"
            )


def check_fleet_secrets(secrets: tuple[str, ...]) -> None:
    """Fleet secrets are keys: visible ASCII without commas, of at least MIN_TOKEN characters on
    loopback too (a token signed by a short key could be forged offline)."""
    for secret in secrets:
        Settings._check_token("--fleet-secret", secret, loopback=False)
        if "," in secret:
            raise UsageError("--fleet-secret: no commas (OOMGUARD_FLEET_SECRETS separates secrets with them)")


# -- from the command line ---------------------------------------------------------------------------

DURATION_FLAGS = {  # flag: field
    "retention": "retention_s",
    "interval": "interval_s",
    "session_ttl": "session_ttl_s",
    "db_wait": "db_wait_s",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _text(args: argparse.Namespace, name: str) -> str | None:
    given = getattr(args, name, None)
    return given if isinstance(given, str) and given else None


def _token(args: argparse.Namespace, name: str, variable: str) -> str | None:
    """A token from its flag, else its variable; surrounding whitespace (a file's trailing newline)
    is stripped with a warning, as no agent could ever send it."""
    given, source = _text(args, name), _flag(name)
    if given is None:
        given, source = os.environ.get(variable) or None, variable
    if given is None and os.environ.get(variable + "_FILE"):  # a mounted secret's file
        given, source = secret_file(variable + "_FILE"), variable + "_FILE"
    if given is None:
        return None
    stripped = given.strip()
    if stripped != given:
        print(f"oomguard: warning: {source}: whitespace around the token stripped", file=sys.stderr)
    return stripped or None


def _number(name: str, text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 7):
        raise UsageError(f"{_flag(name)}: expected a whole number, got {text!r}")
    return int(text)


def _hosts(text: str) -> tuple[str, ...]:
    hosts = tuple(h.strip() for h in text.split(",") if h.strip())
    if not hosts:
        raise UsageError("--allowed-hosts: expected host names separated by commas, or *")
    return hosts


def _forget_after(text: str) -> float | None:
    """``--forget-after``: a duration; ``0``, ``off`` or ``never``: never archive (None)."""
    if text.strip().lower() in ("off", "never"):
        return None
    return parse_duration(text, "--forget-after") or None


def _share(text: str, source: str) -> float:
    """A share of the limit: ``90%`` or ``0.9``, above 0 and at most 1 (1 is 100 %)."""
    given = text.strip()
    try:
        value = float(given[:-1]) / 100 if given.endswith("%") else float(given)
    except ValueError:
        raise UsageError(f"{source}: expected a share of the limit such as 90% or 0.9, got {text!r}") from None
    if not 0 < value <= 1:  # NaN fails this too
        raise UsageError(f"{source}: must be above 0% and at most 100%, got {text!r}")
    return value


def _count(source: str, text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 7):
        raise UsageError(f"{source}: expected a whole number, got {text!r}")
    return int(text)


def _flag_or_env(args: argparse.Namespace, name: str, variable: str) -> tuple[str, str] | None:
    """(the text, where it came from) of a valued flag, else of its variable; None: neither."""
    given = _text(args, name)
    if given is not None:
        return given, _flag(name)
    if os.environ.get(variable):
        return os.environ[variable], variable
    return None


SECRET_FILE_MAX = 64 * 1024


def secret_file(variable: str) -> str:
    """The text of the file the variable *variable* names (``OOMGUARD_VIEWER_TOKEN_FILE`` and the
    like: a Kubernetes or Docker secret mounted as a file), surrounding whitespace stripped; one
    line naming the variable when it cannot be read or is empty (issue 39: ``*_FILE`` for every secret)."""
    path = os.environ.get(variable, "")
    try:
        with open(path, "rb") as f:
            data = f.read(SECRET_FILE_MAX + 1)
    except OSError as exc:
        raise UsageError(f"{variable}: cannot read {path!r}: {exc.strerror or exc}") from None
    except ValueError:
        raise UsageError(f"{variable}: cannot read {path!r}: a path holds no NUL byte") from None
    if len(data) > SECRET_FILE_MAX:
        raise UsageError(f"{variable}: {path!r} is larger than {SECRET_FILE_MAX} bytes: not a secret's file")
    text = data.decode("utf-8", "replace").strip()
    if not text:
        raise UsageError(f"{variable}: {path!r} is empty")
    return text


def _list(args: argparse.Namespace, name: str, variable: str) -> tuple[list[str], str]:
    """A repeatable flag's values, else its variable's comma-separated ones (blanks dropped), else
    those of the file ``<variable>_FILE`` names."""
    given = getattr(args, name, None)
    if isinstance(given, list) and given:
        return [str(g).strip() for g in given], _flag(name)
    text = os.environ.get(variable, "")
    if not text and os.environ.get(variable + "_FILE"):
        text, variable = secret_file(variable + "_FILE"), variable + "_FILE"
    return [part.strip() for part in text.split(",") if part.strip()], variable


def fleet_secrets_from(args: argparse.Namespace) -> tuple[str, ...]:
    """``--fleet-secret`` (repeatable), else ``OOMGUARD_FLEET_SECRETS`` (comma-separated): the
    first signs new tokens, all verify. Unchecked: ``Settings.check`` checks them."""
    secrets, _ = _list(args, "fleet_secret", "OOMGUARD_FLEET_SECRETS")
    if any(not s for s in secrets):
        raise UsageError("--fleet-secret: must not be empty")
    return tuple(dict.fromkeys(secrets))


def trusted_proxies_from(args: argparse.Namespace) -> tuple[Network, ...]:
    """``--trusted-proxy CIDR`` (repeatable; an address is its /32 or /128), else
    ``OOMGUARD_TRUSTED_PROXIES`` (comma-separated); a one-line UsageError for anything else."""
    entries, source = _list(args, "trusted_proxy", "OOMGUARD_TRUSTED_PROXIES")
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            shown = entry if len(entry) <= 64 and entry.isprintable() else entry[:64].encode("unicode_escape").decode()
            raise UsageError(
                f"{source}: {shown!r} is not an address or a network (such as 10.0.0.0/8 or fd00::/8)"
            ) from None
    return tuple(dict.fromkeys(networks))


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings from the parsed flags and the token variables, checked (UsageError naming the flag)."""
    given: dict[str, Any] = {
        "agent_token": _token(args, "agent_token", "OOMGUARD_AGENT_TOKEN"),
        "viewer_token": _token(args, "viewer_token", "OOMGUARD_VIEWER_TOKEN"),
        "admin_token": _token(args, "admin_token", "OOMGUARD_ADMIN_TOKEN"),
        "fleet_secrets": fleet_secrets_from(args),
        "trusted_proxies": trusted_proxies_from(args),
    }
    text = {name: t for name in vars(args) if (t := _text(args, name)) is not None}
    if "db" in text:
        given["db_url"] = text["db"]
    elif os.environ.get("OOMGUARD_DB"):
        given["db_url"] = os.environ["OOMGUARD_DB"]
    elif os.environ.get("OOMGUARD_DB_FILE"):  # a URL with a password: a secret
        given["db_url"] = secret_file("OOMGUARD_DB_FILE")
    if "host" in text:
        given["host"] = text["host"]
    if "log_format" in text:
        given["log_format"] = text["log_format"]
    for name in ("port", "max_connections"):
        if name in text:
            given[name] = _number(name, text[name])
    for name, field in DURATION_FLAGS.items():
        if name in text:
            given[field] = parse_duration(text[name], _flag(name))
    counts = (
        ("max_connections_per_client", "OOMGUARD_MAX_CONNECTIONS_PER_CLIENT", "per_client_connections"),
        ("max_new_nodes", "OOMGUARD_MAX_NEW_NODES", "max_new_nodes"),
        ("max_events_per_node", "OOMGUARD_MAX_EVENTS_PER_NODE", "max_events_per_node"),
        ("max_observations_per_node", "OOMGUARD_MAX_OBSERVATIONS_PER_NODE", "max_observations_per_node"),
        ("max_profiles", "OOMGUARD_MAX_PROFILES", "max_profiles"),
        ("max_classes", "OOMGUARD_MAX_CLASSES", "max_classes"),
        ("max_profiles_per_node", "OOMGUARD_MAX_PROFILES_PER_NODE", "max_profiles_per_node"),
        ("max_classes_per_node", "OOMGUARD_MAX_CLASSES_PER_NODE", "max_classes_per_node"),
    )
    for name, variable, field in counts:
        if (found := _flag_or_env(args, name, variable)) is not None:
            given[field] = _count(*reversed(found))
    if "max_body" in text:
        given["max_body"] = parse_size(text["max_body"], "--max-body")
    if (found := _flag_or_env(args, "write_queue_bytes", "OOMGUARD_WRITE_QUEUE_BYTES")) is not None:
        given["write_queue_bytes"] = parse_size(*found)
    if "forget_after" in text:
        given["forget_after_s"] = _forget_after(text["forget_after"])
    if "allowed_hosts" in text:
        given["allowed_hosts"] = _hosts(text["allowed_hosts"])
    if "working_set_line" in text:
        given["working_set_line"] = _share(text["working_set_line"], "--working-set-line")
    elif os.environ.get("OOMGUARD_WORKING_SET_LINE"):
        given["working_set_line"] = _share(os.environ["OOMGUARD_WORKING_SET_LINE"], "OOMGUARD_WORKING_SET_LINE")
    settings = Settings(**given)
    settings.check()
    return settings
