"""Whose address a request is: the peer's, or, from a trusted proxy, the one it forwarded.

``X-Forwarded-For``, ``X-Forwarded-Proto`` and ``X-Forwarded-Host`` are believed only when the
connection's peer is in ``--trusted-proxy`` (none by default: a loopback client is no proxy
unless the operator says so). Then the client is the right-most address of ``X-Forwarded-For``
that is not itself a trusted proxy (each proxy appends the address it saw, so the hops to the
right of it were added by proxies we trust and the ones to the left by nobody we know: MDN,
"X-Forwarded-For", "Selecting an IP address"); when every hop is trusted, the left-most.

``TrustedProxies`` applies the rule once, outermost, for every route and middleware: it sets the
ASGI scope's ``client`` and ``scheme`` (ASGI HTTP connection scope: ``client``, ``scheme``), and
keeps the raw peer and a trusted proxy's ``X-Forwarded-Host`` under ``SCOPE_KEY``. It needs the
server to leave the scope as the socket gave it (uvicorn's ``proxy_headers=False``; uvicorn's own
``ProxyHeadersMiddleware`` would replace the peer before this sees it).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
SCOPE_KEY = "oomguard.forwarded"  # {"peer": str, "via_proxy": bool, "host": str | None}
MAX_HOPS = 32  # X-Forwarded-For entries read, from the right
MAX_KEY = 64  # characters of an unparsable hop kept as its client key


def address(text: str) -> Address | None:
    """An IP address from a peer or an ``X-Forwarded-For`` hop (``1.2.3.4``, ``1.2.3.4:5``,
    ``::1``, ``[::1]:5``); an IPv4-mapped IPv6 address as its IPv4 one (Python docs, ipaddress,
    ``IPv6Address.ipv4_mapped``), since a dual-stack socket reports IPv4 peers so; else None."""
    text = text.strip()
    if text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else text
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_trusted(host: str | None, networks: Sequence[Network]) -> bool:
    ip = address(host) if host and networks else None
    return ip is not None and any(ip in net for net in networks)


def client_address(peer: str, forwarded_for: Iterable[str], networks: Sequence[Network]) -> str:
    """The client: *peer*, or from a trusted *peer* the right-most untrusted hop of the
    ``X-Forwarded-For`` header values *forwarded_for* (joined in order)."""
    if not is_trusted(peer, networks):
        return peer
    hops = [h.strip() for value in forwarded_for for h in value.split(",")][-MAX_HOPS:]
    hops = [h for h in hops if h]
    for hop in reversed(hops):
        if not is_trusted(hop, networks):
            ip = address(hop)
            return str(ip) if ip is not None else hop[:MAX_KEY]
    if hops:
        ip = address(hops[0])
        return str(ip) if ip is not None else hops[0][:MAX_KEY]
    return peer


class TrustedProxies:
    """Pure ASGI middleware: the scope's ``client`` and ``scheme`` as the trusted proxies say."""

    def __init__(self, app: Any, networks: Sequence[Network]) -> None:
        self.app = app
        self.networks = tuple(networks)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            client = scope.get("client")
            peer = str(client[0]) if client else ""
            via = is_trusted(peer, self.networks)
            forwarded: dict[str, Any] = {"peer": peer, "via_proxy": via, "host": None}
            if via:
                headers = [(k.lower(), v.decode("latin-1")) for k, v in scope.get("headers", ())]
                xff = [v for k, v in headers if k == b"x-forwarded-for"]
                scope["client"] = (client_address(peer, xff, self.networks), 0)
                proto = next((v.strip().lower() for k, v in headers if k == b"x-forwarded-proto"), "")
                if proto in ("http", "https") and scope["type"] == "http":
                    scope["scheme"] = proto
                host = next((v for k, v in headers if k == b"x-forwarded-host"), None)
                forwarded["host"] = host.split(",")[0].strip() if host else None
            scope[SCOPE_KEY] = forwarded
        await self.app(scope, receive, send)


def forwarded_host(scope: MutableMapping[str, Any]) -> str | None:
    """The ``X-Forwarded-Host`` of a trusted proxy (the first, as the client sent it); None for
    any other request, whatever its headers say."""
    info = scope.get(SCOPE_KEY)
    return info.get("host") if isinstance(info, dict) else None
