"""Logging out is a form like the dashboard's others (issue 37, item 6): ``POST /logout`` needs the
form's token (keyed by the session cookie) and, from a browser, this manager's own ``Origin``;
another site's POST gets 403 and the session lives on. ``GET /logout`` changes nothing. The app in
process on a real SQLite file."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from oomguard.manager.app import create_app
from oomguard.manager.db import migrate
from oomguard.manager.settings import Settings
from oomguard.manager.web.forget import logout_token
from tests.helpers.manager import AGENT, VIEWER

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def c(tmp_path: Path) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    migrate(url)
    app = create_app(Settings(db_url=url, agent_token=AGENT, viewer_token=VIEWER))
    with TestClient(app, base_url="http://localhost") as client:
        assert client.post("/login", content=f"token={VIEWER}", headers=FORM, follow_redirects=False).status_code == 303
        yield client


def signed_in(c: TestClient) -> bool:
    return bool(c.get("/api/v1/nodes").status_code == 200)


def test_the_logout_page_carries_the_forms_token_and_keeps_its_origin(c: TestClient) -> None:
    page = c.get("/logout")
    assert page.status_code == 200 and 'action="/logout"' in page.text
    token = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text)
    assert token and token[1] == logout_token(c.cookies.get("oomguard_session"))
    assert '<meta name="referrer" content="same-origin">' in page.text  # else the browser sends Origin: null
    assert signed_in(c)


@pytest.mark.parametrize(
    ("body", "origin"),
    [
        ("", None),  # no token: a forged form cannot know it
        ("csrf=" + "0" * 64, None),  # a wrong one
        ("csrf={token}", "https://evil.example"),  # the right one, from another site
        ("csrf={token}", "null"),  # an opaque origin
    ],
    ids=["no-token", "wrong-token", "other-origin", "null-origin"],
)
def test_a_cross_site_logout_is_refused_and_the_session_lives_on(c: TestClient, body: str, origin: str | None) -> None:
    token = logout_token(c.cookies.get("oomguard_session"))
    headers = {**FORM, **({"Origin": origin} if origin else {})}
    r = c.post("/logout", content=body.format(token=token), headers=headers, follow_redirects=False)
    assert r.status_code == 403 and "own form; open /logout and try again" in r.text
    assert "set-cookie" not in r.headers  # the cookie is not cleared either
    assert signed_in(c)


def test_our_own_form_logs_out(c: TestClient) -> None:
    kept = c.cookies.get("oomguard_session")
    headers = {**FORM, "Origin": "http://localhost"}
    r = c.post("/logout", content=f"csrf={logout_token(kept)}", headers=headers, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert "oomguard_session=" in r.headers["set-cookie"] and "max-age=0" in r.headers["set-cookie"].lower()
    c.cookies.clear()
    c.cookies.set("oomguard_session", str(kept))  # revoked, even if kept
    assert not signed_in(c)


def test_without_a_session_there_is_nothing_to_end(c: TestClient) -> None:
    c.cookies.clear()
    r = c.post("/logout", content="", headers={**FORM, "Origin": "https://evil.example"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login" and "set-cookie" not in r.headers
