"""A profile's learned size from the fleet manager, and the last answer kept on disk (issue 23).

``GET {manager}/api/v1/profiles/{profile}/recommendation?node=NODE`` with the agent's token (a
node's own token reads its own node's answer; ``oomguard.manager.web.deps.require_reader_or_agent``).
A good answer is kept in ``{spool}/learned/{profile}.json`` (written whole, then renamed over the
old one), so a node that cannot reach the manager plans with the last answer it had, and one that
never had one with the declared profile (``oomguard.policy.learned``). Nothing here raises for the
network or the disk: each failure is a value, said in the decision.

Standard library only: this runs on every node.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from oomguard._version import __version__
from oomguard.agent.client import NoRedirect, check_manager, check_token, http_outcome, network_why
from oomguard.nodes import is_valid_profile_name
from oomguard.policy.learned import Answer, apply, parse_answer
from oomguard.units import MAX_SIZE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from oomguard._types import Report
    from oomguard.policy.plan import Shape

CACHE_DIR = "learned"  # under the spool directory
MAX_ANSWER = 1 << 20  # an answer is a few kilobytes; more is not one


@dataclass(frozen=True)
class Fetched:
    """What asking came to: the *answer* (None: none to be had), where it came from (``manager``,
    ``cache``, ``none``), when it was fetched, and why the manager gave none (*unreached*)."""

    answer: Answer | None
    origin: str
    fetched: str | None = None
    unreached: str | None = None


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def cache_path(spool: str, profile: str) -> str:
    return os.path.join(spool, CACHE_DIR, f"{profile}.json")


def ask(
    manager: str,
    token: str,
    profile: str,
    node: str | None,
    *,
    timeout: float,
    node_class: str | None = None,
    budget: int | None = None,
) -> tuple[object, str | None]:
    """(the parsed JSON answer, None) or (None, why not) from one GET; *budget*: the run's, so the
    manager can size the run's jobs together (docs/manager.md)."""
    sent = budget if isinstance(budget, int) and 0 < budget <= MAX_SIZE else None  # the API's bounds
    pairs = (("node", node), ("node_class", node_class), ("budget_bytes", None if sent is None else str(sent)))
    params = {k: v for k, v in pairs if v}
    query = "" if not params else "?" + urllib.parse.urlencode(params)
    url = f"{check_manager(manager)}/api/v1/profiles/{urllib.parse.quote(profile)}/recommendation{query}"
    headers = {"Accept": "application/json", "User-Agent": f"oomguard-agent/{__version__}"}
    token = check_token(token)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    opener = urllib.request.build_opener(NoRedirect())
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            data = resp.read(MAX_ANSWER + 1)
    except urllib.error.HTTPError as exc:
        return None, http_outcome(exc).why
    except (urllib.error.URLError, OSError, TimeoutError, ValueError, http.client.HTTPException) as exc:
        return None, network_why(exc)  # ValueError: UnicodeError (idna) too; HTTPException: InvalidURL
    if len(data) > MAX_ANSWER:
        return None, f"the answer is over {MAX_ANSWER} bytes"
    try:
        return json.loads(data), None
    except ValueError:
        return None, "the answer is not JSON"


def _read_cache(path: str) -> tuple[Answer, str | None] | None:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(MAX_ANSWER + 1))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    answer = parse_answer(data.get("answer"))
    fetched = data.get("fetched")
    return (answer, fetched if isinstance(fetched, str) else None) if isinstance(answer, Answer) else None


def _write_cache(path: str, raw: object, fetched: str, node: str | None) -> None:
    """Keep the answer; a disk that cannot take it costs only the offline fallback."""
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".learned-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"fetched": fetched, "node": node, "answer": raw}, f)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def fetch(
    manager: str,
    token: str,
    profile: str,
    node: str | None,
    spool: str,
    *,
    timeout: float = 5.0,
    node_class: str | None = None,
    budget: int | None = None,
) -> Fetched:
    """The manager's answer for *profile* on *node* of *node_class* (None: the class the manager
    knows the node by) for a run of *budget* bytes, kept on disk under *spool*; else the answer
    kept from before, else none. ``BadParameter`` only for a bad URL or token (the caller's flags)."""
    if not is_valid_profile_name(profile):
        return Fetched(None, "none", unreached=f"the profile name {profile!r} is not one the manager takes"[:160])
    raw, why = ask(manager, token, profile, node, timeout=timeout, node_class=node_class, budget=budget)
    path = cache_path(spool, profile)
    if why is None:
        answer = parse_answer(raw)
        if isinstance(answer, Answer):
            now = _iso(time.time())
            _write_cache(path, raw, now, node)
            return Fetched(answer, "manager", fetched=now)
        why = f"the answer does not fit: {answer}"
    kept = _read_cache(path)
    if kept is None:
        return Fetched(None, "none", unreached=why)
    return Fetched(kept[0], "cache", fetched=kept[1], unreached=why)


def _defaults(
    token: str | None, node: str | None, spool: str | None, node_class: object
) -> tuple[str, str, str, str | None]:
    """The agent's defaults for what the caller left out: the token (``OOMGUARD_AGENT_TOKEN``), the
    node's name (sanitized, else the agent's default), the spool, the class (``OOMGUARD_NODE_CLASS``;
    ``BadParameter`` for one outside the rule)."""
    from oomguard.agent.node import default_node_name, sanitize_node_name
    from oomguard.agent.spool import default_spool_dir
    from oomguard.errors import BadParameter
    from oomguard.nodes import node_class_problem

    env = dict(os.environ)
    cls = str(node_class or "") or env.get("OOMGUARD_NODE_CLASS", "").strip() or None
    problem = None if cls is None else node_class_problem(cls)
    if problem is not None:
        raise BadParameter("node_class", problem)
    return (
        env.get("OOMGUARD_AGENT_TOKEN", "") if token is None else token,
        sanitize_node_name(node) if node else default_node_name(env),
        spool or default_spool_dir(env),
        cls,
    )


def learned_shape(
    shape: Shape,
    *,
    manager: str,
    token: str | None = None,
    node: str | None = None,
    spool: str | None = None,
    report: Report | None = None,
    may_lower: bool = False,
    timeout: float = 5.0,
    node_class: str | None = None,
) -> tuple[Shape, dict[str, Any]]:
    """*shape* (a profile's: ``shape.profile`` set) at the size the fleet manager learned, and the
    decision (``policy/learned.py``): ``plan --learned`` and ``run --learned`` as an API, for a
    worker that sizes its ``MemoryBudget`` reservations itself::

        shape, decision = oomguard.learned_shape(oomguard.Shape(14 * GiB, 70 * GiB, profile="porep-c2-32g"),
                                                 manager="http://manager:8080")
        budget.reserve(shape.per_job)

    *token* defaults to ``OOMGUARD_AGENT_TOKEN``, *node* to the agent's default name, *spool* to the
    agent's spool directory (where the last answer is kept), *node_class* to ``OOMGUARD_NODE_CLASS``
    (else the class the manager knows the node by), *report* to a fresh ``probe()`` (its ceiling
    bounds the learned size, and its budget goes to the manager, which may size the run's jobs
    together for it). ``BadParameter`` for a bad *manager* or *token*, ``ValueError``
    for a shape without a profile; the network and the disk never raise (the decision says)."""
    if shape.profile is None:
        raise ValueError("learned_shape needs a shape with a profile (Shape(..., profile=NAME))")
    token, node, spool, node_class = _defaults(token, node, spool, node_class)
    if report is None:
        from oomguard.policy.budget import probe

        report = probe()
    got = fetch(
        check_manager(manager), check_token(token), shape.profile, node, spool, timeout=timeout,
        node_class=node_class, budget=report["budget"]["bytes"],  # the run's: its jobs sized together
    )  # fmt: skip
    return apply(
        shape,
        got.answer,
        origin=got.origin,
        fetched=got.fetched,
        unreached=got.unreached,
        ceiling=report["memory"]["effective_bytes"],
        may_lower=may_lower,
    )


def send_observation(
    observation: dict[str, Any],
    *,
    manager: str,
    token: str | None = None,
    node: str | None = None,
    spool: str | None = None,
    timeout: float = 5.0,
) -> str:
    """Send *observation* (``MemoryBudget.observation``) to the fleet manager's recommender,
    through the agent's spool: written there first (durable, sent once by its id), then the spool
    is flushed, oldest first. Its fate: ``delivered``, ``spooled`` (the agent, or a later call,
    sends it), ``rejected`` (the manager refuses it: it moves to the spool's ``rejected/``),
    ``token`` or ``url``, or ``lost`` (neither spooled nor delivered). The node's class is the
    observation's ``node_class``, else ``OOMGUARD_NODE_CLASS``. Defaults as for
    ``learned_shape``; ``BadParameter`` for a bad *manager*, *token* or *spool*."""
    from oomguard.agent.sender import Sender
    from oomguard.agent.spool import open_spool

    token, node, spool, cls = _defaults(token, node, spool, observation.get("node_class"))
    sent = dict(observation) | ({"node_class": cls} if cls else {})
    sender = Sender(manager, token, open_spool(spool), timeout=timeout)
    return sender.send("observation", sender.envelope(node, observation=sent))
