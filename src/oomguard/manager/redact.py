"""Secrets out of every message the manager writes: database passwords and tokens become ``***``.

A database URL carries its password as ``scheme://user:PASSWORD@host/db`` (RFC 3986 section 3.2.1,
userinfo) or as a ``password=`` query parameter (libpq's connection URIs, PostgreSQL docs,
"Connection URIs"). ``mask_url`` masks both forms in one URL; a ``Redactor`` masks the known
secrets (and anything URL-shaped) in any text: start-up errors, log lines and their tracebacks.
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import Iterable

MASK = "***"
_USERINFO = re.compile(r"(?P<pre>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):(?P<pw>[^@\s]*)@")
_QUERY_PW = re.compile(r"(?P<pre>[?&](?:password|sslpassword)=)(?P<pw>[^&\s]*)", re.IGNORECASE)


def mask_url(url: str) -> str:
    """*url* with its password (userinfo or ``password=`` parameter) replaced by ``***``."""
    url = _USERINFO.sub(lambda m: f"{m['pre']}:{MASK}@", url)
    return _QUERY_PW.sub(lambda m: f"{m['pre']}{MASK}", url)


def url_secrets(url: str) -> list[str]:
    """The passwords *url* carries, as written and percent-decoded (drivers quote the decoded one)."""
    found = [m["pw"] for m in _USERINFO.finditer(url)] + [m["pw"] for m in _QUERY_PW.finditer(url)]
    out: list[str] = []
    for pw in found:
        out.extend(p for p in {pw, urllib.parse.unquote(pw)} if p)
    return out


class Redactor:
    """Masks the given secrets, longest first, and every URL password, in any text."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        self.secrets = sorted({s for s in secrets if s and len(s) >= 3}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return mask_url(text)


class RedactingFormatter(logging.Formatter):
    """A log formatter whose whole output (message and traceback) goes through a ``Redactor``."""

    def __init__(self, fmt: str | None = None, redactor: Redactor | None = None) -> None:
        super().__init__(fmt)
        self.redactor = redactor or Redactor()

    def format(self, record: logging.LogRecord) -> str:
        return self.redactor(super().format(record))


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's text, or its class name."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
