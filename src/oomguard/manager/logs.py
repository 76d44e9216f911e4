"""The manager's log lines as text (the default) or as JSON, one object a line (``--log-format json``,
``OOMGUARD_LOG_FORMAT``; issue 39, item 5), for a log shipper (Loki, Elasticsearch, Cloud Logging)
to index without parsing text.

A JSON line has ``time`` (UTC, ISO 8601 with milliseconds), ``level`` (``info``, ``warning``,
``error``...), ``logger``, ``message``, then the record's own fields where its code gave some
(``logging``'s ``extra``: the refused-token line's ``role``, ``client``, ``node``, ``reason``), and
``exception`` (the traceback's text) where there is one. Every string goes through the same
``Redactor`` as the text lines: no token or database password is written in either form.
The manager's own lines (migrations, the database's retries, the start line) are ``info`` records
of the logger ``oomguard.manager``, in the same form.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from oomguard.manager.redact import RedactingFormatter, Redactor
from oomguard.manager.settings import LOG_FORMATS

FORMATS = LOG_FORMATS  # settings checks --log-format against them
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
OWN_LOGGER = "oomguard.manager"
# A record's own attributes (logging.LogRecord's, and what Formatter.format adds): the rest are the
# caller's ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def _utc(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def _plain(value: Any, redact: Redactor) -> Any:
    """A JSON value of *value*: numbers, booleans and None as they are, anything else as redacted text."""
    if value is None or isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return redact(str(value))


class JsonFormatter(logging.Formatter):
    """One JSON object a record, every string redacted."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor or Redactor()

    def format(self, record: logging.LogRecord) -> str:
        redact = self.redactor
        out: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out and not key.startswith("_"):
                out[key] = _plain(value, redact)
        if record.exc_info:
            out["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False, allow_nan=False)


def formatter(log_format: str, redactor: Redactor) -> logging.Formatter:
    """The formatter of *log_format* (``FORMATS``)."""
    if log_format == "json":
        return JsonFormatter(redactor)
    return RedactingFormatter(TEXT_FORMAT, redactor)


def sayer(log_format: str, redactor: Redactor | None = None, level: int = logging.INFO) -> Callable[[str], None]:
    """What writes one of the manager's own lines to stderr: as it is (text), or as a record of
    ``oomguard.manager`` at *level* (json)."""
    if log_format != "json":
        return lambda line: print(line, file=sys.stderr, flush=True)
    form = JsonFormatter(redactor)

    def say(line: str) -> None:
        record = logging.LogRecord(OWN_LOGGER, level, __file__, 0, line, None, None)
        print(form.format(record), file=sys.stderr, flush=True)

    return say
