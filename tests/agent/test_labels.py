"""Node labels (``agent/labels.py``): the rule, where they come from, and their way into every
envelope of ``oomguard agent`` and ``oomguard run --manager``, against a real HTTP server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomguard.agent import EventForwarder, run_agent
from oomguard.agent.labels import (
    ENV_LABELS,
    LabelError,
    check_label,
    environment_labels,
    node_labels,
    parse_label,
    parse_label_list,
)
from oomguard.errors import EXIT_USAGE, UsageError
from oomguard.labels import LABELS_MAX, VALUE_MAX, label_problem
from tests.conftest import REPO, run_oomguard
from tests.helpers.agent_fake import TOKEN, FakeManager, Logs, agent_args
from tests.helpers.fuzz import examples
from tests.helpers.wait import wait_until

# --- the rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "pair"),
    [
        ("zone=eu-1", ("zone", "eu-1")),
        ("_x=1", ("_x", "1")),
        ("a=b=c", ("a", "b=c")),  # split at the first "="
        ("k=two words", ("k", "two words")),
        ("K9=Ünïcode ok", ("K9", "Ünïcode ok")),  # values may hold any printable character
        ("a" * 63 + "=v", ("a" * 63, "v")),
        ("k=" + "v" * VALUE_MAX, ("k", "v" * VALUE_MAX)),
    ],
)
def test_good_labels_parse(text: str, pair: tuple[str, str]) -> None:
    assert parse_label(text) == pair


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("zone", "expected KEY=VALUE, got 'zone'"),
        ("=v", "label name '' must be 1-63 of [a-zA-Z0-9_]"),
        ("9lives=1", "label name '9lives' must be 1-63"),
        ("a-b=1", "label name 'a-b' must be 1-63"),
        ("zoné=1", "label name 'zoné' must be 1-63"),  # ASCII only, as Prometheus'
        ("a" * 64 + "=v", "must be 1-63"),
        ("__name__=x", "label name '__name__' must not start with __ (reserved by Prometheus)"),
        ("k=", "label k has an empty value (Prometheus treats that as no label)"),
        ("k=" + "v" * (VALUE_MAX + 1), f"label k's value is {VALUE_MAX + 1} characters long, more than {VALUE_MAX}"),
        ("k=a\tb", "label k's value holds a character that cannot be printed"),
        ("k=line\n", "cannot be printed"),
    ],
)
def test_bad_labels_are_one_line_usage_errors(text: str, says: str) -> None:
    with pytest.raises(LabelError) as caught:
        parse_label(text)
    assert says in str(caught.value)
    assert isinstance(caught.value, UsageError) and caught.value.exit_code == EXIT_USAGE
    assert "\n" not in str(caught.value)


def test_a_list_ignores_blanks_and_empty_items() -> None:
    assert parse_label_list(" a=1 , b=2,, ") == [("a", "1"), ("b", "2")]
    assert parse_label_list("") == []


@given(st.text())
def test_any_text_is_a_label_or_a_one_line_usage_error(text: str) -> None:
    try:
        key, value = parse_label(text)
    except LabelError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400
    else:
        check_label(key, value)  # what parses follows the rule
        assert f"{key}={value}" == text


@given(st.dictionaries(st.sampled_from(["CONTAINER_ID", "VAST_CONTAINERLABEL", "K8S_NODE_NAME", "OTHER"]), st.text()))
def test_any_environment_gives_valid_labels_and_never_raises(env: dict[str, str]) -> None:
    labels = environment_labels(env)
    for key, value in labels.items():
        check_label(key, value)
    assert set(labels) <= {"container_id", "vast_containerlabel", "k8s_node_name"}


@given(st.text(), st.lists(st.text(), max_size=20))
def test_node_labels_from_any_text_never_raise_anything_else(listed: str, flags: list[str]) -> None:
    try:
        labels = node_labels({"OOMGUARD_LABELS": listed}, flags)
    except LabelError as exc:
        assert "\n" not in str(exc)
    else:
        assert len(labels) <= LABELS_MAX
        for key, value in labels.items():
            check_label(key, value)


# --- where they come from ---------------------------------------------------------------------


def test_the_environment_then_the_list_then_the_flags_win() -> None:
    env = {
        "CONTAINER_ID": " 12345 ",
        "VAST_CONTAINERLABEL": "C.12345",
        "K8S_NODE_NAME": "",  # set but empty: no label
        "OOMGUARD_LABELS": "zone=eu-1,container_id=from-list",
    }
    assert node_labels(env, ["zone=eu-2", "rack=r7"]) == {
        "container_id": "from-list",
        "vast_containerlabel": "C.12345",
        "zone": "eu-2",
        "rack": "r7",
    }
    assert node_labels({}) == {}
    # an environment value that breaks the rule is made valid, never an error
    assert environment_labels({"K8S_NODE_NAME": "n\x1b1" + "x" * 300}) == {"k8s_node_name": "n?1" + "x" * 253}


def test_a_bad_label_names_its_source() -> None:
    with pytest.raises(LabelError, match=r"^--label: expected KEY=VALUE, got 'zone'$"):
        node_labels({}, ["zone"])
    with pytest.raises(LabelError, match=r"^OOMGUARD_LABELS: label name '1a' must be"):
        node_labels({"OOMGUARD_LABELS": "1a=b"})
    many = [f"k{i}=v" for i in range(LABELS_MAX)]
    assert len(node_labels({}, many)) == LABELS_MAX
    with pytest.raises(LabelError, match=rf"^labels: {LABELS_MAX + 1}, at most {LABELS_MAX} \(container_id, k0, "):
        node_labels({"CONTAINER_ID": "1"}, many)


def test_the_operators_class_of_node_is_the_node_class_label_and_follows_the_class_rule() -> None:
    """``--node-class`` (and ``OOMGUARD_NODE_CLASS``) is the label ``node_class``: the flag wins,
    and a ``node_class`` from anywhere must be a class the manager takes (manager/learning.py)."""
    env = {"OOMGUARD_NODE_CLASS": " gpu:L4/ram:64GiB ", "OOMGUARD_LABELS": "zone=eu-1"}
    assert node_labels(env) == {"zone": "eu-1", "node_class": "gpu:L4/ram:64GiB"}
    assert node_labels(env, ["node_class=from-label"])["node_class"] == "from-label"
    assert node_labels(env, ["node_class=from-label"], "h100-big")["node_class"] == "h100-big"
    assert node_labels({"OOMGUARD_NODE_CLASS": "  "}) == {}  # blank: none
    with pytest.raises(LabelError, match=r"^--node-class: a class of node is 1-64 of \[A-Za-z0-9._:/\+-\]"):
        node_labels({}, [], "has space")
    with pytest.raises(LabelError, match=r"^OOMGUARD_NODE_CLASS: a class of node is"):
        node_labels({"OOMGUARD_NODE_CLASS": "x" * 65})
    with pytest.raises(LabelError, match=r"^label node_class: a class of node is"):
        node_labels({}, ["node_class=-leading-dash"])


@pytest.mark.parametrize("command", ["agent", "run", "plan"])
def test_a_bad_class_of_node_on_the_command_line_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    argv = [command, "--manager", "http://127.0.0.1:9", "--spool", str(tmp_path), "--node-class", "a b"]
    more = {"run": ["--", sys.executable, "-c", "pass"], "plan": ["--profile", "porep-c2-32g", "--learned"]}
    proc = run_oomguard(*argv, *more.get(command, []))
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.startswith("oomguard: error: --node-class: a class of node is 1-64 of [A-Za-z0-9._:/+-]")
    assert len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize("command", ["agent", "run"])
def test_a_bad_label_on_the_command_line_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    argv = [command, "--manager", "http://127.0.0.1:9", "--spool", str(tmp_path)]
    worker = ["--", sys.executable, "-c", "pass"] if command == "run" else []
    proc = run_oomguard(*argv, "--label", "9=x", *worker)
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr == (
        "oomguard: error: --label: label name '9' must be 1-63 of [a-zA-Z0-9_], not starting with a digit "
        "(Prometheus' rule)\n"
    )
    listed = run_oomguard(*argv, *worker, env={"OOMGUARD_LABELS": "zone"})
    assert listed.returncode == EXIT_USAGE
    assert listed.stderr == "oomguard: error: OOMGUARD_LABELS: expected KEY=VALUE, got 'zone'\n"


# --- in every envelope ------------------------------------------------------------------------


def test_agent_reports_carry_the_labels(manager: FakeManager, tmp_path: Path) -> None:
    labels = {"zone": "eu-1", "vast_containerlabel": "C.1"}
    args = agent_args(tmp_path, manager=manager.url, once=True, make_report=lambda: {"r": 1}, labels=labels)
    assert run_agent(**args) == 0
    (sent,) = manager.requests
    assert sent["body"]["labels"] == labels
    assert set(sent["body"]) == {"node", "id", "report", "interval_s", "time", "labels"}


def test_without_labels_the_envelope_has_no_labels_key(manager: FakeManager, tmp_path: Path) -> None:
    """An older manager refuses an envelope with a key it does not know: none is added for nothing."""
    assert run_agent(**agent_args(tmp_path, manager=manager.url, once=True, labels={})) == 0
    assert "labels" not in manager.requests[0]["body"]


def test_the_loop_says_its_labels_in_its_start_line(manager: FakeManager, tmp_path: Path) -> None:
    logs = Logs()
    args = agent_args(tmp_path, manager=manager.url, log=logs, max_cycles=1, labels={"zone": "eu-1", "a": "b"})
    assert run_agent(**args) == 0
    assert (
        logs[0]
        == f"reporting to {manager.url} as node n1 every 10s (spool {tmp_path / 'spool'}; labels a=b, zone=eu-1)"
    )


def test_run_events_and_heartbeats_carry_the_labels(manager: FakeManager, tmp_path: Path) -> None:
    sink = EventForwarder(manager.url, TOKEN, "n1", str(tmp_path / "spool"), heartbeat_s=0.05, labels={"zone": "z"})
    sink({"event": "start", "pid": 1})

    def kinds() -> list[str]:
        return [r["body"]["event"]["event"] for r in manager.requests]

    try:  # the start goes through the spool, the heartbeats straight: either may arrive first
        wait_until(lambda: {"start", "heartbeat"} <= set(kinds()), what="a start and a heartbeat")
    finally:
        sink.close()
    assert kinds().count("start") == 1 and "heartbeat" in kinds(), kinds()
    assert all(r["body"]["labels"] == {"zone": "z"} for r in manager.requests)


def test_run_manager_from_the_command_line_sends_its_labels(manager: FakeManager, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_") and k not in ENV_LABELS}
    env.update(PYTHONPATH=str(REPO / "src"), OOMGUARD_LABELS="zone=eu-1", K8S_NODE_NAME="worker-node-3")
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "oomguard", "run", "--budget", "64MiB", "--restart", "never"),
            *("--manager", manager.url, "--token", TOKEN, "--node", "n1", "--spool", str(tmp_path / "spool")),
            *("--label", "rack=r7", "--", sys.executable, "-c", "pass"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    events = [r["body"] for r in manager.requests if r["path"] == "/api/v1/events"]
    assert [e["event"]["event"] for e in events][:1] == ["start"]
    assert all(e["labels"] == {"k8s_node_name": "worker-node-3", "zone": "eu-1", "rack": "r7"} for e in events)


@settings(max_examples=examples(300))
@given(
    key=st.text(max_size=70) | st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,64}", fullmatch=True),
    value=st.text(max_size=300) | st.sampled_from(["", "x", "\ud800", "a\u200bb", "a\nb", "é" * 256, "é" * 257]),
)
def test_the_agent_and_the_manager_take_the_same_labels(key: str, value: str) -> None:
    """One rule (oomguard.labels): what the agent would send is what the manager's envelope takes."""
    from pydantic import ValidationError

    from oomguard.manager.bodies import EventEnvelope

    try:
        check_label(key, value)
        agent_ok = True
    except LabelError:
        agent_ok = False
    assert agent_ok is (label_problem(key, value) is None)
    try:
        EventEnvelope.model_validate({"node": "n", "id": "i", "event": {"event": "heartbeat"}, "labels": {key: value}})
        manager_ok = True
    except ValidationError:
        manager_ok = False
    assert manager_ok is agent_ok, (key, value)
