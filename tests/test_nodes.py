"""The one node-name rule (``oomguard.nodes``), tested in one place: what it accepts, what the
agent turns any text into, and that the manager's request model enforces the same rule."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from oomguard.nodes import (
    NODE_NAME_CHARS,
    NODE_NAME_MAX,
    NODE_PATTERN,
    is_valid_node_name,
    sanitize_node_name,
)

ANY_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=300)


@pytest.mark.parametrize(
    "name", ["a", "0", "gpu-node_01.example", "C.12345", "x" * 128, "a..", "a-", "A_b.c-d", "9.9.9.9"]
)
def test_valid_names(name: str) -> None:
    assert is_valid_node_name(name)
    assert sanitize_node_name(name) == name  # a valid name is never changed


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "_x", ".hidden", "-x", "ñ", "Ñode", "a b", "a/b", "x" * 129, "a\n", "a\x00", "a:b", 7, None],
)
def test_invalid_names(name: object) -> None:
    assert not is_valid_node_name(name)


@pytest.mark.parametrize(
    ("given", "sanitized"),
    [
        ("", "node"),
        ("..", "node-" + "{:08x}"),
        ("_private", "private"),
        (".hidden", "hidden"),
        ("--x", "x"),
        ("gpu node/1:ä", "gpu-node-1-a"),
        ("Ñandú-7", "Nandu-7"),
        ("ｇｐｕ１", "gpu1"),  # full-width forms (NFKD)
        ("ﬁle", "file"),
        ("x" * 300, "x" * 128),
        ("_" + "y" * 200, "y" * 128),
        ("host\n", "host-"),
    ],
)
def test_sanitize_examples(given: str, sanitized: str) -> None:
    got = sanitize_node_name(given)
    if "{" in sanitized:  # text with nothing usable: node-<crc32>
        assert re.fullmatch(r"node-[0-9a-f]{8}", got)
    else:
        assert got == sanitized


def test_text_with_nothing_usable_gives_distinct_stable_names() -> None:
    a, b = sanitize_node_name("日本"), sanitize_node_name("中国")
    assert a != b and a == sanitize_node_name("日本")
    assert all(is_valid_node_name(x) for x in (a, b))


def test_the_alphabet_and_the_pattern_agree() -> None:
    assert set(NODE_NAME_CHARS) == set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    assert NODE_NAME_MAX == 128
    assert NODE_PATTERN == r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


@given(ANY_TEXT)
@example("_")
@example(".")
@example("\udcff")  # a byte the file system decoding could not decode (surrogateescape)
@example("\u0301abc")  # a lone combining mark first
def test_any_text_sanitizes_to_a_name_the_rule_accepts(text: str) -> None:
    name = sanitize_node_name(text)
    assert is_valid_node_name(name)
    assert re.fullmatch(NODE_PATTERN.strip("^$"), name)
    assert sanitize_node_name(name) == name  # idempotent


@given(ANY_TEXT)
def test_is_valid_never_raises_and_matches_the_pattern(text: str) -> None:
    assert is_valid_node_name(text) == (re.fullmatch(NODE_PATTERN[1:-1], text) is not None)


def _manager_node_model() -> type:
    pytest.importorskip("pydantic")
    models = pytest.importorskip("oomguard.manager.bodies")
    from pydantic import BaseModel

    class Probe(BaseModel):
        node: models.NodeName  # type: ignore[name-defined]

    return Probe


def test_the_manager_enforces_the_same_pattern() -> None:
    models = pytest.importorskip("oomguard.manager.bodies")
    assert models.NODE_PATTERN == NODE_PATTERN


@given(ANY_TEXT)
@example("_private")
@example(".hidden")
@example("Ñode")
@example("")
@example("node\n")  # Python's "$" would let the newline through; pydantic's regex does not
@example("x" * 129)
def test_the_manager_accepts_every_sanitized_name(text: str) -> None:
    """The issue: names starting with _ or . or a non-ASCII letter got 422 on every report."""
    model = _manager_node_model()  # skips where the manager's libraries are not installed
    from pydantic import ValidationError

    model(node=sanitize_node_name(text))
    if not is_valid_node_name(text):
        with pytest.raises(ValidationError):
            model(node=text)
