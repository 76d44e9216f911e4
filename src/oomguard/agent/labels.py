"""Node labels: ``KEY=VALUE`` pairs the agent and ``run --manager`` put on every envelope.

They travel as an optional ``labels`` object (string to string) beside ``node`` in the report and
event envelopes; the rule they follow (Prometheus' label names, 1-256 printable characters, at
most 16) is ``oomguard.labels``, which the manager checks too.

Where they come from, later ones winning for the same key:

1. the environment (``ENV_LABELS``: vast.ai's ``CONTAINER_ID`` and ``VAST_CONTAINERLABEL``,
   ``K8S_NODE_NAME`` which deploy/k8s/worker.yaml sets from the pod's ``spec.nodeName``), each
   only when set, as the variable's name in lower case; such a value is never an error (too long
   is cut, a character that cannot be printed becomes ``?``);
2. ``OOMGUARD_LABELS`` (``k=v,k2=v2``);
3. ``--label KEY=VALUE``, repeatable.

The rule itself is ``oomguard.labels`` (the manager checks the same one). A bad label from 2 or 3
is a ``LabelError``, a ``UsageError``: one line naming where it came
from, exit 2 (``node_labels``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from oomguard.errors import UsageError
from oomguard.labels import VALUE_MAX, label_problem, labels_problem, shown

# vast.ai sets CONTAINER_ID and VAST_CONTAINERLABEL in its containers (docs/research/fleet.md);
# K8S_NODE_NAME is the downward API's spec.nodeName where the manifest sets it (deploy/k8s/worker.yaml).
ENV_LABELS = ("CONTAINER_ID", "VAST_CONTAINERLABEL", "K8S_NODE_NAME")
ENV_VAR = "OOMGUARD_LABELS"

_T = TypeVar("_T")


class LabelError(UsageError):
    """A label that breaks the rule (exit 2); the message is one line."""


def check_label(key: str, value: str) -> None:
    """``LabelError`` unless *key* and *value* follow the rule (``oomguard.labels``)."""
    problem = label_problem(key, value)
    if problem:
        raise LabelError(problem)


def parse_label(text: str) -> tuple[str, str]:
    """``"zone=eu-1"`` -> ``("zone", "eu-1")`` (split at the first ``=``); ``LabelError`` otherwise."""
    key, eq, value = text.partition("=")
    if not eq:
        raise LabelError(f"expected KEY=VALUE, got {shown(text)}")
    check_label(key, value)
    return key, value


def parse_label_list(text: str) -> list[tuple[str, str]]:
    """``"k=v,k2=v2"`` -> its pairs; blanks around an item and empty items are ignored."""
    return [parse_label(item.strip()) for item in text.split(",") if item.strip()]


def environment_labels(env: Mapping[str, str]) -> dict[str, str]:
    """The labels the environment gives (``ENV_LABELS`` that are set and not blank), made valid."""
    out: dict[str, str] = {}
    for name in ENV_LABELS:
        value = env.get(name, "").strip()
        if value:
            out[name.lower()] = "".join(c if c.isprintable() else "?" for c in value[:VALUE_MAX])
    return out


def merge_labels(*sources: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The labels of *sources* in order (a later one wins for the same key); ``LabelError``
    beyond ``oomguard.labels.LABELS_MAX``."""
    out: dict[str, str] = {}
    for source in sources:
        out.update(source)
    problem = labels_problem(out)
    if problem:
        raise LabelError(problem)
    return out


def node_labels(env: Mapping[str, str], given: Iterable[str] = ()) -> dict[str, str]:
    """The node's labels: the environment's, then ``OOMGUARD_LABELS``', then *given* (``--label``
    texts); ``LabelError`` naming the source of a bad one."""
    listed = _from(ENV_VAR, parse_label_list, env.get(ENV_VAR, ""))
    flags = [_from("--label", parse_label, text) for text in given]
    return merge_labels(environment_labels(env).items(), listed, flags)


def _from(source: str, parse: Callable[[str], _T], text: str) -> _T:
    try:
        return parse(text)
    except LabelError as exc:
        raise LabelError(f"{source}: {exc}") from None
