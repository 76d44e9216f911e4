"""The dashboard's words for numbers: the Jinja filters, and how many alerts a group lists.

One formatter per kind of value, used by every template:

- ``when``: a time as "5 m ago" (relative to the page's render), with the absolute UTC time on
  hover (``<time title=...>``); the page refreshes its live part, so the words stay current;
- ``size``: bytes in binary units; ``yesno``: a boolean in words ("yes", "no", "unknown");
- ``gpus``: a node's GPUs summarised ("8× H100 80 GiB"), not one name per GPU;
- ``timed``: free text (an alert's message) with every ISO time in it shown by ``when``;
- ``pct``: a percentage with one decimal ("41.6%"), "unknown" when there is none (never "0%");
- ``reason``: an exit reason in words ("OOM kill", "pressure stop", ...);
- ``plural``: "1 stop", "2 stops";
- ``happened``: an event's time as ``when`` shows it, when it happened (the supervisor's own
  time, ``chart.measured_time``), and "(arrived 2 h later)" when it came a minute or more later
  (kept in a spool while the manager was away);
- ``shown_labels``: a node's labels as the nodes table lists them, the first ``LABELS_SHOWN`` by
  key, and those left (the node page lists them all).

Every filter escapes what it is given (Jinja2's ``escape``) and returns ``Markup`` only for markup
it built itself; anything unexpected becomes "-" (never raises).
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from typing import Any

from markupsafe import Markup, escape

from oomguard.manager.times import iso_ms, parse_iso_ms
from oomguard.manager.web.chart import measured_time
from oomguard.units import format_size

ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)")
ALERTS_SHOWN = 5  # alerts listed per kind before "show all"
ALERTS_PAGE = 500  # alerts listed a page at a time by "show all"
LABELS_SHOWN = 3  # a node's labels listed in the nodes table; the rest counted ("+13"), all on its page
LATE_S = 60  # an event that arrived this much after it happened says so in the timeline


def span_text(s: float) -> str:
    """ "12 s", "5 m", "3 h", "2 d": the largest whole unit."""
    s = abs(s)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)} {unit}"
    return f"{int(s)} s"


def ago_text(ms: int, now_s: float | None = None) -> str:
    """ "12 s ago", "5 m ago", "3 h ago", "2 d ago"; "in 4 s" for a time ahead of this clock."""
    s = (time.time() if now_s is None else now_s) - ms / 1000
    return f"in {span_text(s)}" if s < 0 else f"{span_text(s)} ago"


def when(iso: Any, never: str = "never") -> Markup:
    """``<time>`` with relative words and the absolute UTC time as its title (the hover)."""
    ms = parse_iso_ms(iso)
    if ms is None:
        return Markup(escape(never))
    absolute = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms // 1000))
    return Markup('<time datetime="{}" title="{}">{}</time>').format(iso, absolute, ago_text(ms))


def timed(text: Any) -> Markup:
    """Free text, escaped, with each ISO time in it shown as ``when`` shows it."""
    if not isinstance(text, str):
        return Markup("-")
    out, last = [], 0
    for m in ISO_TIME.finditer(text):
        out += [escape(text[last : m.start()]), when(m.group(0), never=m.group(0))]
        last = m.end()
    out.append(escape(text[last:]))
    return Markup("").join(out)


def happened(e: Any) -> Markup:
    """An event's time (``when``): when it happened; "(arrived 2 h later)" after it when it came
    ``LATE_S`` or more later."""
    if not isinstance(e, dict):
        return Markup("-")
    t = measured_time(e)
    if t is None:
        return Markup("time unknown")
    out = when(iso_ms(round(t * 1000)))
    received = parse_iso_ms(e.get("received"))
    if received is not None and received / 1000 - t >= LATE_S:
        late = span_text(received / 1000 - t)
        out += Markup(
            ' <span class="late" title="sent late, from the supervisor\'s spool">(arrived {} later)</span>'
        ).format(late)
    return out


def shown_labels(labels: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """(the first ``LABELS_SHOWN`` labels by key, as pairs; the rest as ``KEY=VALUE``)."""
    if not isinstance(labels, dict):
        return [], []
    pairs = sorted((str(k), str(v)) for k, v in labels.items())
    return pairs[:LABELS_SHOWN], [f"{k}={v}" for k, v in pairs[LABELS_SHOWN:]]


def size(n: Any, none: str = "-") -> str:
    """A size in binary units; *none* for None and "-" for anything that is not a byte count."""
    if n is None:
        return none
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 2**63:
        return "-"
    return format_size(n)


def yesno(value: Any) -> str:
    return "yes" if value is True else "no" if value is False else "unknown"


def number(value: Any) -> str:
    """64.0 -> "64", 12.5 -> "12.5"; "unknown" for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or math.isinf(value):
        return "unknown"
    return f"{value:.2f}".rstrip("0").rstrip(".")


def pct(value: Any) -> str:
    """41.56 -> "41.6%"; "unknown" for None or anything that is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or math.isinf(value):
        return "unknown"
    return f"{value:.1f}%"


REASONS = {  # the supervisor's exit reasons (oomguard.supervisor.exits), in words
    "oom-kill": "OOM kill",
    "pressure-stop": "pressure stop",
    "signal": "ended by a signal",
    "exit": "exited with an error",
    "clean": "exited cleanly",
}


AFTER = {  # the same reasons on the restart or give-up event that follows the exit
    "oom-kill": "after an OOM kill",
    "pressure-stop": "after a pressure stop",
    "signal": "after a signal",
    "exit": "after an error exit",
    "clean": "after a clean exit",
}


def reason(value: Any, after: bool = False) -> str:
    """An exit reason in words (*after*: as a later event words it); an unknown one as given
    (the template escapes it)."""
    if not isinstance(value, str):
        return "-"
    return (AFTER if after else REASONS).get(value, value)


def plural(count: Any, noun: str) -> str:
    """ "1 stop", "2 stops", "0 stops"."""
    n = count if isinstance(count, int) and not isinstance(count, bool) else 0
    return f"{n} {noun}{'' if n == 1 else 's'}"


def gpus(items: Any) -> str:
    """ "8× H100 80 GiB", "2× A10 24 GiB, 1× T4 16 GiB"; "-" for none. Same name and size count together."""
    if not isinstance(items, list) or not items:
        return "-"
    groups: Counter[str] = Counter()
    for g in items:
        if isinstance(g, dict):
            name = str(g.get("name") or "GPU").removeprefix("NVIDIA ")
            groups[f"{name} {size(g.get('memory_total_bytes'), '?')}"] += 1
    return ", ".join(f"{n}× {label}" for label, n in groups.items()) or "-"


FILTERS = {
    "size": size,
    "ago": when,
    "when": when,
    "timed": timed,
    "yesno": yesno,
    "number": number,
    "gpus": gpus,
    "pct": pct,
    "reason": reason,
    "plural": plural,
    "happened": happened,
    "shown_labels": shown_labels,
}
