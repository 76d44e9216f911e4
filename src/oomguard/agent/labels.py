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
3. ``OOMGUARD_NODE_CLASS``, as the label ``node_class``;
4. ``--label KEY=VALUE``, repeatable;
5. ``--node-class CLASS``, as the label ``node_class``.

``node_class`` is the operator's class of node, for the manager's recommender
(``oomguard.manager.learning``): it must follow the class rule as well
(``oomguard.nodes.node_class_problem``: 1-64 of ``[A-Za-z0-9._:/+-]``).

The rule itself is ``oomguard.labels`` (the manager checks the same one). A bad label from 2 or 3
is a ``LabelError``, a ``UsageError``: one line naming where it came
from, exit 2 (``node_labels``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from oomguard.errors import UsageError
from oomguard.labels import CLASS_LABEL, VALUE_MAX, label_problem, labels_problem, shown
from oomguard.nodes import node_class_problem

# vast.ai sets CONTAINER_ID and VAST_CONTAINERLABEL in its containers (docs/research/fleet.md);
# K8S_NODE_NAME is the downward API's spec.nodeName where the manifest sets it (deploy/k8s/worker.yaml).
ENV_LABELS = ("CONTAINER_ID", "VAST_CONTAINERLABEL", "K8S_NODE_NAME")
ENV_VAR = "OOMGUARD_LABELS"
CLASS_ENV = "OOMGUARD_NODE_CLASS"

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


def _class(source: str, text: str) -> list[tuple[str, str]]:
    """The ``node_class`` label of *text* (none when blank); ``LabelError`` naming *source*."""
    value = text.strip()
    if not value:
        return []
    problem = node_class_problem(value)
    if problem:
        raise LabelError(f"{source}: {problem}")
    return [(CLASS_LABEL, value)]


def node_labels(env: Mapping[str, str], given: Iterable[str] = (), node_class: str | None = None) -> dict[str, str]:
    """The node's labels: the environment's, then ``OOMGUARD_LABELS``' and ``OOMGUARD_NODE_CLASS``,
    then *given* (``--label`` texts) and *node_class* (``--node-class``); ``LabelError`` naming the
    source of a bad one."""
    listed = _from(ENV_VAR, parse_label_list, env.get(ENV_VAR, ""))
    env_class = _class(CLASS_ENV, env.get(CLASS_ENV, ""))
    flags = [_from("--label", parse_label, text) for text in given]
    flag_class = _class("--node-class", node_class) if node_class is not None else []
    labels = merge_labels(environment_labels(env).items(), listed, env_class, flags, flag_class)
    if CLASS_LABEL in labels:
        _class(f"label {CLASS_LABEL}", labels[CLASS_LABEL])  # also when it came from --label or OOMGUARD_LABELS
    return labels


def _from(source: str, parse: Callable[[str], _T], text: str) -> _T:
    try:
        return parse(text)
    except LabelError as exc:
        raise LabelError(f"{source}: {exc}") from None
