"""The dashboard's login session, and a brake on guessing tokens.

A session cookie is ``<id>.<expiry>.<mac>``: a random id, an expiry (epoch seconds) and an
HMAC-SHA256 (RFC 2104) of both, keyed by a secret derived from the viewer token. The token itself
never leaves the login form. Replicas that share the viewer token accept each other's cookies; a
new viewer token ends every session. ``POST /logout`` revokes the cookie's id until its expiry
(kept in this process: with replicas, a revoked cookie stays valid on the others until it
expires).

``FailureLimiter``: failed tokens are counted twice, in the client's bucket (its address: the
peer's, or what a trusted proxy forwarded, ``web.proxies``) of ``burst`` failures refilled one
per ``refill_s``, and in one global bucket of ``global_per_minute`` failures refilled at that rate,
so that rotating addresses does not escape. Only failures are limited: the caller checks the
token first, and a valid one always passes, so a bad client cannot lock out a good one on the
same address; a failure while either bucket is empty is answered 429 instead of 401.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict

COOKIE = "oomguard_session"
MAX_REVOKED = 100_000
MAX_CLIENTS = 10_000


def _mac(key: bytes, message: str) -> str:
    digest = hmac.new(key, message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class Sessions:
    def __init__(self, viewer_token: str | None, ttl_s: float) -> None:
        seed = viewer_token.encode() if viewer_token else secrets.token_bytes(32)
        self._key = hmac.new(seed, b"oomguard-session-v1", hashlib.sha256).digest()
        self.ttl_s = ttl_s
        self._revoked: dict[str, int] = {}
        self._lock = threading.Lock()

    def issue(self, now: float | None = None) -> str:
        """A new cookie value, valid for ``ttl_s``."""
        expiry = int((time.time() if now is None else now) + self.ttl_s)
        sid = secrets.token_urlsafe(16)
        return f"{sid}.{expiry}.{_mac(self._key, f'{sid}.{expiry}')}"

    def _parse(self, cookie: str | None, now: float | None) -> tuple[str, int] | None:
        parts = (cookie or "").split(".")
        if len(parts) != 3 or not parts[1].isascii() or not parts[1].isdigit() or len(parts[1]) > 12:
            return None
        sid, expiry, mac = parts
        if not hmac.compare_digest(mac.encode(), _mac(self._key, f"{sid}.{expiry}").encode()):
            return None
        if int(expiry) <= (time.time() if now is None else now):
            return None
        return sid, int(expiry)

    def valid(self, cookie: str | None, now: float | None = None) -> bool:
        parsed = self._parse(cookie, now)
        return parsed is not None and parsed[0] not in self._revoked

    def revoke(self, cookie: str | None, now: float | None = None) -> bool:
        """End the session of *cookie* (False when it was not a valid one)."""
        parsed = self._parse(cookie, now)
        if parsed is None:
            return False
        t = time.time() if now is None else now
        with self._lock:
            if len(self._revoked) >= MAX_REVOKED:
                self._revoked = {s: e for s, e in self._revoked.items() if e > t}
            self._revoked[parsed[0]] = parsed[1]
        return True


class FailureLimiter:
    """Failed attempts: per client a token bucket of *burst*, one more every *refill_s* seconds;
    across all clients one of *global_per_minute*, refilled at that rate."""

    def __init__(self, burst: int, refill_s: float, global_per_minute: int = 120) -> None:
        self.burst = burst
        self.refill_s = refill_s
        self.global_burst = global_per_minute
        self.global_refill_s = 60.0 / global_per_minute
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)
        self._global: tuple[float, float] | None = None  # (tokens, at); None: full
        self._lock = threading.Lock()

    def _tokens(self, client: str, now: float) -> float:
        tokens, at = self._buckets.get(client, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) / self.refill_s)

    def _global_tokens(self, now: float) -> float:
        tokens, at = self._global or (float(self.global_burst), now)
        return min(float(self.global_burst), tokens + (now - at) / self.global_refill_s)

    @staticmethod
    def _wait(tokens: float, refill_s: float) -> int:
        return 0 if tokens >= 1 else max(1, int((1 - tokens) * refill_s + 0.999))

    def retry_after(self, client: str, now: float | None = None) -> int:
        """0 while *client*'s own bucket has a failure left; else the seconds until it has. (The
        global bucket is not consulted: a flood from elsewhere must not turn anyone away before
        their token is checked; ``failed`` applies both.)"""
        t = time.monotonic() if now is None else now
        with self._lock:
            tokens = self._tokens(client, t) if client in self._buckets else float(self.burst)
        return self._wait(tokens, self.refill_s)

    def failed(self, client: str, now: float | None = None) -> int:
        """Count a failed attempt of *client*: 0 when it was within both allowances (answer 401),
        else the seconds to wait (answer 429)."""
        t = time.monotonic() if now is None else now
        with self._lock:
            tokens, shared = self._tokens(client, t), self._global_tokens(t)
            wait = max(self._wait(tokens, self.refill_s), self._wait(shared, self.global_refill_s))
            self._buckets[client] = (max(tokens - 1, 0.0), t)
            self._buckets.move_to_end(client)
            self._global = (max(shared - 1, 0.0), t)
            while len(self._buckets) > MAX_CLIENTS:
                self._buckets.popitem(last=False)
        return wait
