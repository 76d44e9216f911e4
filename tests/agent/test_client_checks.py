"""What the agent checks before it speaks to the manager (issue 37): a token is visible ASCII (what
an HTTP header carries and the manager accepts), a manager URL is one that can be connected to.
Each refusal is a ``BadParameter`` (one line, exit 2 on the command line), never a crash later:
``http.client`` raises ``UnicodeEncodeError`` for a header beyond Latin-1, ``InvalidURL`` for a
control character in the host (``http://%00/``), and ``socket``'s ``idna`` codec ``UnicodeError``
for an empty or a 64-character label (``http://a..b/``)."""

from __future__ import annotations

import urllib.parse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomguard.agent.client import Client, check_manager, check_token
from oomguard.errors import BadParameter

NOT_HEADER_TOKENS = ["tök€n", "токен", "tok\u00e9n", "emoji-\U0001f600", "a b", "tab\tx", "nul\x00x", "del\x7fx"]


@pytest.mark.parametrize("token", NOT_HEADER_TOKENS)
def test_a_token_a_header_cannot_carry_is_refused_without_saying_it(token: str) -> None:
    with pytest.raises(BadParameter, match=r"^token: must hold only visible ASCII characters, no spaces") as info:
        check_token(token)
    assert token not in str(info.value) and "\n" not in str(info.value)


def test_visible_ascii_tokens_pass_stripped() -> None:
    visible = "".join(chr(c) for c in range(0x21, 0x7F))
    assert check_token(f" {visible}\n") == visible
    assert check_token("ogn1.gpu-07.abc_DEF~\r\n") == "ogn1.gpu-07.abc_DEF~"
    assert check_token("") == ""


@given(st.text(max_size=40))
def test_any_token_is_one_the_header_carries_or_a_one_line_refusal(text: str) -> None:
    try:
        token = check_token(text)
    except BadParameter as exc:
        assert exc.param == "token" and "\n" not in str(exc)
    else:
        token.encode("ascii")  # what http.client sends (it would take Latin-1; the manager takes ASCII)
        assert " " not in token and token.isprintable()


BAD_URLS = [
    ("http://%00/", "the URL's host must be a name"),  # the issue: InvalidURL from http.client
    ("http://a%41b:9/", "the URL's host must be a name"),
    ("http://../", "the URL's host must be a name"),  # UnicodeError from the idna codec
    ("http://a..b:9/", "the URL's host must be a name"),
    ("http://.:9/", "the URL's host must be a name"),
    ("http://" + "x" * 64 + ".example/", "the URL's host must be a name"),
    ("http://" + "x" * 300, "the URL's host must be a name"),
    ("http://a!b/", "the URL's host must be a name"),
    ("http://[zz]:9/", "the URL must be http://HOST"),
    ("http://[::1", "the URL must be http://HOST"),
    ("http://bücher.example/", "the URL must be visible ASCII"),
    ("http://a b/", "the URL must be visible ASCII"),
    ("http://h/\x00", "the URL must be visible ASCII"),
    ("http://h\n/", "the URL must be visible ASCII"),
    ("http://u:hunter2@127.0.0.1:9", "the URL must not carry a user or password"),
    ("http://127.0.0.1:99999", "the URL must be http://HOST"),
    ("ftp://h/", "the URL must be http://HOST"),
    ("http://h/?x=1", "the URL must not have a query or fragment"),
]


@pytest.mark.parametrize(("url", "words"), BAD_URLS)
def test_a_url_nothing_can_connect_to_is_refused_in_one_line(url: str, words: str) -> None:
    with pytest.raises(BadParameter) as info:
        check_manager(url)
    assert info.value.param == "manager" and info.value.message.startswith(words), info.value.message
    assert "\n" not in str(info.value) and "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:9", "https://manager.example:8443/base/", "http://Oomguard_Manager:8080", "http://[::1]:9/p"],
)
def test_urls_that_can_be_connected_to_pass(url: str) -> None:
    assert check_manager(url) == url.rstrip("/")


HOSTILE = st.text(st.sampled_from("aZ09-_.%[]:@/?#\x00\n é€\u200b"), max_size=20)


@given(st.one_of(HOSTILE, st.text(max_size=30)).map(lambda host: f"http://{host}/"))
def test_any_url_check_manager_passes_is_one_socket_can_encode(url: str) -> None:
    """What urllib and socket do with an accepted URL's host never raises: http.client's checks
    (no control character) and the idna codec that socket encodes a host name with."""
    if len(url) > 200:
        return
    try:
        base = check_manager(url)
    except BadParameter as exc:
        assert exc.param == "manager" and "\n" not in str(exc)
        return
    host = urllib.parse.urlsplit(base).hostname
    assert host is not None and host.isascii() and host.isprintable()
    if ":" not in host:  # a name or an IPv4 address; an IPv6 one is not encoded
        host.encode("idna")
    Client(base, "t")  # builds, with no network
