"""Memory consumers that keep their own budget: what they say of it, beside the kernel's view.

``oomguard agent --cuzk-status URL`` polls CuZK's status endpoint before each report and sends
what it answered as the report's ``consumers`` list (schema.json): CuZK's budget, what it has
reserved from it, what it thinks is left; or, when any of that cannot be read, the three as null
and ``error`` saying why in one line. Never a made-up number: a prover that budgets from the host's
RAM inside a smaller container is the outage the manager's ``consumer-budget-above-limit`` alert
names, and a guessed value would hide it or invent it.

The GET (``poll_cuzk``) is the only I/O: plain ``http://``, no proxy, no redirect followed, a short
time-out for the whole answer (``TIMEOUT_S``) and a bounded read (``MAX_BYTES``). The parse
(``parse_cuzk_status``) is a pure function of the answer's text that never raises.

Standard library only: the agent runs on every node.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from oomguard._version import __version__
from oomguard.agent.client import NoRedirect, network_why
from oomguard.agent.log import one_line
from oomguard.errors import BadParameter
from oomguard.units import MAX_SIZE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import ConsumerEntry

CUZK = "cuzk"
TIMEOUT_S = 2.0  # the whole answer, connect to last byte: a status endpoint answers in milliseconds
MAX_BYTES = 4 << 20  # CuZK's snapshot is a few KiB; its pipelines list is the only part that grows
STATUS_PATH = "/status"  # the one path CuZK's status server answers (cuzk-daemon/src/main.rs, below)
URL_MAX = 2048
ERROR_MAX = 200  # characters of ``error``
MEMORY_FIELDS = ("total_bytes", "used_bytes", "available_bytes")  # CuZK's MemoryStatus, in its order
_CHUNK = 65536


def check_status_url(url: str) -> str:
    """The status URL to poll: *url* stripped, with ``/status`` as its path when it has none
    (``http://127.0.0.1:9821``, CuZK's ``status_listen``, is enough). ``BadParameter("cuzk_status")``
    unless it is ``http://HOST[:PORT][/PATH]`` without credentials or a fragment."""
    text = url.strip()
    try:
        parts = urllib.parse.urlsplit(text)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme != "http" or not parts.hostname:
        raise BadParameter("cuzk_status", f"the URL must be http://HOST:PORT[/status], got {url!r}")
    if parts.username is not None or parts.fragment or len(text) > URL_MAX:
        raise BadParameter(
            "cuzk_status", f"the URL must have no user, no fragment and at most {URL_MAX} characters, got {url!r}"
        )
    if parts.path in ("", "/"):
        text = urllib.parse.urlunsplit(parts._replace(path=STATUS_PATH))
    return text


def unknown(url: str, why: str, name: str = CUZK) -> ConsumerEntry:
    """A consumer whose numbers are unknown: null values and *why*, one line."""
    line = one_line(why, ERROR_MAX) or "unknown"
    return {"name": name, "url": url, "budget_bytes": None, "used_bytes": None, "available_bytes": None, "error": line}


def _what(value: Any) -> str:
    """A short description of a JSON value that is not a whole number of bytes."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return one_line(repr(value), 40)
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


# CuZK's status JSON (filecoin-project/curio e0294b0, extern/cuzk):
#
# cuzk-core/src/status.rs L21-54: ``GET /status`` returns a ``StatusSnapshot`` (serde JSON):
#
#     pub struct StatusSnapshot {
#         pub uptime_secs: f64,
#         pub memory: MemoryStatus,
#         pub synthesis: SynthesisStatus,
#         pub pipelines: Vec<PipelineSnapshot>,
#         pub gpu_workers: Vec<GpuWorkerSnapshot>,
#         pub allocations: AllocationsSnapshot,   // {srs: [...], pce: [...]}
#         pub counters: CountersSnapshot,
#         pub buffers: BuffersSnapshot,
#     }
#     pub struct MemoryStatus { pub total_bytes: u64, pub used_bytes: u64, pub available_bytes: u64 }
#
#   status.rs L468-472 fills ``memory`` from the engine's MemoryBudget: ``total_bytes`` is the budget
#   (cuzk.example.toml ``[memory] total_budget = "auto"``: "/proc/meminfo MemTotal - safety_margin",
#   5 GiB by default, memory.rs L33: the host's RAM, whatever the container allows), ``used_bytes``
#   what is reserved from it, ``available_bytes`` what is left. A sample (tests/fixtures/cuzk/status.json):
#
#     {"uptime_secs": 86412.517, "memory": {"total_bytes": 534723428352, "used_bytes": 197939314688,
#      "available_bytes": 336784113664}, "synthesis": {...}, "pipelines": [...], ...}
#
# cuzk-daemon/src/main.rs L121-203: the status server runs only when ``[daemon] status_listen`` is
# set (cuzk-core/src/config.rs L36-39: "Empty string disables. Examples: "0.0.0.0:9821",
# "127.0.0.1:9821""); a request line starting ``GET /status`` gets 200 and that JSON (500 with
# ``{"error": ...}`` when it cannot be serialized), anything else 404. Its Prometheus text (gRPC
# GetMetrics, cuzk-server/src/service.rs L256-341: proofs, uptime, queue depth, durations, running
# jobs, GPU workers) has no memory family, so this JSON is the only place CuZK says its budget.
#
# Only ``memory`` is read: the other sections may change without this parser noticing. Each of
# the three must be a whole number of bytes within oomguard's sizes (``units.MAX_SIZE``, 2**63 - 1);
# when one is missing or is not, all three are unknown (a partial view would be a guess).
def parse_cuzk_status(text: str, url: str) -> ConsumerEntry:
    """The ``consumers`` entry for CuZK's status answer *text* (polled at *url*); never raises."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the decoder goes
        return unknown(url, "the answer is not JSON (CuZK's GET /status gives its status snapshot)")
    if not isinstance(data, dict):
        return unknown(url, f"the answer is {_what(data)}, not CuZK's status object")
    memory = data.get("memory")
    if not isinstance(memory, dict):
        return unknown(url, "memory: missing" if memory is None else f"memory: {_what(memory)}, not an object")
    values: list[int] = []
    for key in MEMORY_FIELDS:
        if key not in memory:
            return unknown(url, f"memory.{key}: missing")
        value = memory[key]
        if isinstance(value, bool) or not isinstance(value, int):
            return unknown(url, f"memory.{key}: {_what(value)}, not a whole number of bytes")
        if not 0 <= value <= MAX_SIZE:
            return unknown(url, f"memory.{key}: {_what(value)} is out of range (0 to 2**63 - 1)")
        values.append(value)
    total, used, available = values
    return {
        "name": CUZK,
        "url": url,
        "budget_bytes": total,
        "used_bytes": used,
        "available_bytes": available,
        "error": None,
    }


def _late(timeout: float) -> str:
    return f"no whole answer within {timeout:g}s"


def _read(resp: http.client.HTTPResponse, deadline: float, timeout: float, max_bytes: int) -> bytes | str:
    """The answer's body, or why not (over *max_bytes*, past *deadline*)."""
    data = bytearray()
    while True:
        if time.monotonic() > deadline:
            return _late(timeout)
        chunk = resp.read1(_CHUNK)
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > max_bytes:
            return f"the answer is over {max_bytes} bytes"


def _get(url: str, timeout: float, max_bytes: int) -> bytes | str:
    """One GET of *url*: the body of a 2xx answer, or why there is none (one line)."""
    headers = {"Accept": "application/json", "User-Agent": f"oomguard-agent/{__version__}"}
    opener = urllib.request.build_opener(NoRedirect(), urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            return _read(resp, deadline, timeout, max_bytes)
    except urllib.error.HTTPError as exc:
        with contextlib.suppress(Exception):
            exc.close()
        moved = " (redirects are not followed)" if 300 <= exc.code < 400 else ""
        return f"HTTP {exc.code} {one_line(str(exc.reason), 60)}{moved}"
    except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException, ValueError) as exc:
        why = network_why(exc)
        return _late(timeout) if why == "timed out" else f"unreachable: {why}"


def poll_cuzk(url: str, *, timeout: float = TIMEOUT_S, max_bytes: int = MAX_BYTES) -> ConsumerEntry:
    """CuZK's own view of its memory from its status endpoint *url* (``check_status_url``'s), as the
    report's ``consumers`` entry; every failure is a value (``error``), never an exception."""
    body = _get(url, timeout, max_bytes)
    if isinstance(body, str):
        return unknown(url, body)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return unknown(url, "the answer is not UTF-8 text")
    return parse_cuzk_status(text, url)


__all__ = ["CUZK", "MAX_BYTES", "TIMEOUT_S", "check_status_url", "parse_cuzk_status", "poll_cuzk", "unknown"]
