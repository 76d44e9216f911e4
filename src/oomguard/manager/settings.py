"""Manager settings: one object, built from flags and environment, validated before anything starts."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from oomguard.errors import UsageError
from oomguard.units import MiB

DEFAULT_DB = "sqlite:///oomguard.db"


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


@dataclass
class Settings:
    db_url: str = DEFAULT_DB
    host: str = "127.0.0.1"
    port: int = 8080
    agent_token: str | None = None
    viewer_token: str | None = None
    retention_s: float = 30 * 86400.0
    interval_s: float = 30.0  # the agents' default interval, for offline detection
    max_body: int = MiB
    thin_every_s: float = 600.0

    def check(self) -> None:
        if not is_loopback(self.host) and not (self.agent_token and self.viewer_token):
            raise UsageError(
                f"manager: refusing to listen on {self.host}, which is not a loopback address, without both "
                "--agent-token and --viewer-token (or OOMGUARD_AGENT_TOKEN / OOMGUARD_VIEWER_TOKEN)"
            )
        if self.agent_token is not None and self.agent_token == self.viewer_token:
            raise UsageError("manager: --agent-token and --viewer-token must differ")
        if not 0 < self.port < 65536:
            raise UsageError(f"--port: must be 1 to 65535, got {self.port}")
        if self.max_body < 1024:
            raise UsageError("--max-body: must be at least 1 KiB")
