"""An operator excludes one observation from what the fleet learns, and includes it again (issue 36,
item 2): ``POST /api/v1/observations/{node}/{id}/exclude`` and ``.../include`` (the admin token;
any other role's is 403), the profile page's list and its Exclude/Include buttons (a form with the
admin token and a token bound to the session), and revision 0010; on a real SQLite file and a real
PostgreSQL."""

from __future__ import annotations

import math
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from oomguard.manager.app import create_app
from oomguard.manager.db import current_revision, head_revision, make_engine, migrate, observations
from oomguard.manager.learning import MARGIN, OOM_BUMP
from oomguard.manager.settings import Settings
from oomguard.manager.web.credentials import node_token
from tests.helpers.manager import (
    AGENT,
    AGENT_H,
    VIEWER,
    VIEWER_H,
    Clock,
    exit_event_body,
    local_client,
    make_store,
    migrated_db,
    observation_body,
)

NOW = int(time.time() * 1000)  # the page's chart and times read the real clock
GiB = 1 << 30
ADMIN = "admin-secret-token-1"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
SECRET = "fleet-secret-for-the-exclude-tests-01"
PROFILE = "cuzk-porep"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "obs_excl_")


def client(db_url: str, admin: str | None = ADMIN) -> Any:
    settings = Settings(
        db_url=db_url, agent_token=AGENT, viewer_token=VIEWER, admin_token=admin, fleet_secrets=(SECRET,)
    )
    return local_client(create_app(settings, make_store(db_url, Clock(NOW))))


def observe(c: Any, node: str, ingest_id: str | None = None, **kw: Any) -> str:
    """One observation of class c1 (a node without a report: unchecked); its id."""
    ingest_id = ingest_id or uuid.uuid4().hex
    body = observation_body(profile=PROFILE, node_class="c1", **kw)
    if body["outcome"] != "ok":  # its supervisor's exit event confirms it (store/claims.py)
        event = {"node": node, "id": uuid.uuid4().hex, "event": exit_event_body(body["outcome"], body["time"])}
        assert c.post("/api/v1/events", json=event, headers=AGENT_H).status_code == 200
    r = c.post("/api/v1/observations", json={"node": node, "id": ingest_id, "observation": body}, headers=AGENT_H)
    assert r.status_code == 200, r.text
    return ingest_id


def advice(c: Any) -> dict[str, Any]:
    r = c.get(f"/api/v1/profiles/{PROFILE}/recommendation", params={"node_class": "c1"}, headers=VIEWER_H)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def flip(c: Any, node: str, ingest_id: str, action: str = "exclude", headers: dict[str, str] | None = None) -> Any:
    return c.post(f"/api/v1/observations/{node}/{ingest_id}/{action}", headers=ADMIN_H if headers is None else headers)


def test_an_excluded_observation_no_longer_moves_the_recommendation(db_url: str) -> None:
    with client(db_url) as c:
        for node in ("a1", "a2", "a3"):
            observe(c, node)
        plain = advice(c)
        assert (plain["samples"], plain["per_job_bytes"]) == (3, math.ceil(10 * GiB * (1 + MARGIN)))
        outlier = observe(c, "a4", peak_per_job_bytes=300 * GiB)
        moved = advice(c)
        assert moved["samples"] == 4 and moved["per_job_bytes"] > plain["per_job_bytes"]  # one outlier moves it
        r = flip(c, "a4", outlier)
        assert r.status_code == 200 and r.json() == {"node": "a4", "id": outlier, "excluded": True}, r.text
        assert flip(c, "a4", outlier).status_code == 200  # again: still excluded
        assert advice(c) == plain
        listed = c.get("/api/v1/profiles", headers=VIEWER_H).json()["profiles"]
        assert [(p["profile"], p["samples"], p["nodes"]) for p in listed] == [(PROFILE, 3, 3)]
        assert flip(c, "a4", outlier, "include").json() == {"node": "a4", "id": outlier, "excluded": False}
        assert advice(c) == moved


def test_an_excluded_kill_raises_no_floor_and_leaves_the_metrics(db_url: str) -> None:
    with client(db_url) as c:
        for node in ("a1", "a2", "a3"):
            observe(c, node)
        kill = observe(c, "a1", outcome="oom-kill", peak_per_job_bytes=20 * GiB)
        assert advice(c)["floor_bytes"] == math.ceil(20 * GiB * OOM_BUMP)
        assert flip(c, "a1", kill).status_code == 200
        assert advice(c)["floor_bytes"] == 0
        listed = c.get("/api/v1/profiles", headers=VIEWER_H).json()["profiles"]
        assert listed[0]["failures"] == 0
        metrics = c.get("/metrics", headers=VIEWER_H).text
        assert f'oomguard_profile_floor_per_job_bytes{{node_class="c1",profile="{PROFILE}"}} 0.0' in metrics


def test_only_the_operator_excludes_and_the_rest_are_403_or_401(db_url: str) -> None:
    with client(db_url) as c:
        kept = observe(c, "a1")
        own = {"Authorization": f"Bearer {node_token(SECRET, 'a1')}"}
        for role in (own, AGENT_H, VIEWER_H):  # the node's own token, the fleet's, a viewer's
            r = flip(c, "a1", kept, headers=role)
            assert r.status_code == 403 and "admin token" in r.json()["detail"], r.text
        for nobody in ({}, {"Authorization": "Bearer not-a-token-of-this-manager"}):
            assert flip(c, "a1", kept, headers=nobody).status_code == 401
        assert learned_from(c) == 1  # none of them changed anything
        assert flip(c, "a1", kept).status_code == 200
        assert learned_from(c) == 0


def learned_from(c: Any) -> int:
    """The profile's observations the fleet learns from (``GET /api/v1/profiles``)."""
    listed = c.get("/api/v1/profiles", headers=VIEWER_H).json()["profiles"]
    return sum(int(p["samples"]) for p in listed if p["profile"] == PROFILE)


def test_an_unknown_observation_is_404_and_a_bad_id_422(db_url: str) -> None:
    with client(db_url) as c:
        kept = observe(c, "a1")
        r = flip(c, "a1", "no-such-id")
        assert r.status_code == 404 and r.json() == {"detail": "no observation 'no-such-id' of node 'a1'"}
        assert flip(c, "a2", kept).status_code == 404  # another node's id
        assert flip(c, "nobody", kept, "include").status_code == 404
        r = flip(c, "a1", "bad%20id")
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "id"], r.text
        assert flip(c, "a b", kept).status_code == 422


def test_without_an_admin_token_nobody_excludes(db_url: str) -> None:
    with client(db_url, admin=None) as c:
        kept = observe(c, "a1")
        r = flip(c, "a1", kept, headers=VIEWER_H)
        assert r.status_code == 403 and "no admin token" in r.json()["detail"]


# -- the profile page ------------------------------------------------------------------------------


def logged_in(c: Any) -> str:
    """A viewer's session (the client keeps the cookie); the page's form token for the profile."""
    r = c.post("/login", data={"token": VIEWER, "next": "/"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    page = c.get(f"/profiles/{PROFILE}")
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found is not None, page.text
    return found.group(1)


def row_of(html: str, node: str) -> str:
    row = re.search(rf'<tr class="observation[^"]*"><td data-label="Node"><a href="/nodes/{node}">.*?</tr>', html, re.S)
    assert row is not None, html
    return row.group(0)


def test_the_profile_page_lists_the_observations_and_its_buttons_exclude_and_include(db_url: str) -> None:
    from oomguard.manager.web.forget import GONE

    with client(db_url) as c:
        for node in ("a1", "a2", "a3"):
            observe(c, node)
        outlier = observe(c, "a4", peak_per_job_bytes=300 * GiB, outcome="oom-kill", concurrency=2)
        moved = advice(c)
        csrf = logged_in(c)
        page = c.get(f"/profiles/{PROFILE}").text
        row = row_of(page, "a4")
        for cell in ('"Class">c1<', '"Declared per job">14 GiB<', '"Peak per job">300 GiB<', '"Jobs">2<'):
            assert cell in row, (cell, row)
        assert 'class="bad">oom-kill<' in row and "<time datetime=" in row
        assert f'name="exclude" value="a4/{outlier}"' in row and "excluded" not in row
        assert '<meta name="referrer" content="same-origin">' in page
        form = {"csrf": csrf, "token": ADMIN, "exclude": f"a4/{outlier}", "observations": "0"}
        r = c.post(f"/profiles/{PROFILE}/observations", data=form, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == f"/profiles/{PROFILE}#observations", r.text
        assert advice(c)["per_job_bytes"] == math.ceil(10 * GiB * (1 + MARGIN))
        row = row_of(c.get(f"/profiles/{PROFILE}").text, "a4")
        assert 'class="observation excluded muted"' in row and "<b>excluded</b>" in row
        assert f'name="include" value="a4/{outlier}"' in row
        refusals = [
            ({**form, "csrf": "0" * 64}, {}, 403),  # not our form's token
            (form, {"Origin": "http://evil.example"}, 403),  # another site
            ({**form, "token": VIEWER}, {}, 403),  # the viewer's token is not the admin's
            ({k: v for k, v in form.items() if k != "exclude"}, {}, 400),  # no button
            ({**form, "exclude": f"a4/{outlier}/x"}, {}, 400),
            ({**form, "exclude": "a4/no-such-id"}, {}, 404),
        ]
        for data, headers, status in refusals:
            r = c.post(f"/profiles/{PROFILE}/observations", data=data, headers=headers, follow_redirects=False)
            assert r.status_code == status, (data, headers, r.text)
        assert GONE in c.post(f"/profiles/{PROFILE}/observations", data={**form, "exclude": "a1/nope"}).text
        r = c.post(f"/profiles/{PROFILE}/observations", data={**form, "include": f"a4/{outlier}"} | {"exclude": ""})
        assert r.status_code == 200 and 'name="exclude" value="a4/' in row_of(r.text, "a4")  # followed back
        assert advice(c) == moved


def test_a_profile_whose_observations_are_all_excluded_keeps_its_page(db_url: str) -> None:
    with client(db_url) as c:
        only = observe(c, "a1")
        assert flip(c, "a1", only).status_code == 200
        page = c.get(f"/profiles/{PROFILE}", headers={**VIEWER_H, "Accept": "text/html"})
        assert page.status_code == 200, page.text
        assert "<b>excluded</b>" in row_of(page.text, "a1") and "No observations in the window." in page.text
        assert c.get("/profiles/never-run", headers=VIEWER_H).status_code == 404


def test_without_an_admin_token_the_buttons_are_disabled(db_url: str) -> None:
    with client(db_url, admin=None) as c:
        observe(c, "a1")
        page = c.get(f"/profiles/{PROFILE}", headers=VIEWER_H).text
        assert '<button type="button" disabled' in row_of(page, "a1") and 'id="observation-form"' not in page
        assert "Excluding observations is disabled" in page


def test_the_list_pages_through_the_window(db_url: str) -> None:
    from oomguard.manager.store.profiles import OBSERVATIONS_PAGE

    with client(db_url) as c:
        for i in range(OBSERVATIONS_PAGE + 3):
            observe(c, f"n{i:03d}")
        first = c.get(f"/profiles/{PROFILE}", headers=VIEWER_H).text
        assert first.count('<tr class="observation') == OBSERVATIONS_PAGE
        assert f'href="?observations={OBSERVATIONS_PAGE}#observations">older<' in first
        second = c.get(f"/profiles/{PROFILE}", params={"observations": str(OBSERVATIONS_PAGE)}, headers=VIEWER_H).text
        assert second.count('<tr class="observation') == 3 and ">newer<" in second and ">older<" not in second


# -- revision 0010 ---------------------------------------------------------------------------------


def test_revision_0010_keeps_every_observation_learned_from_and_downgrades(db_url: str) -> None:
    migrate(db_url, "0009")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO nodes (name, first_seen_ms, last_seen_ms) VALUES ('old', 1, 1)"))
        conn.execute(
            text(
                "INSERT INTO observations (node_id, ingest_id, received_ms, observed, profile, node_class, "
                "declared_per_job_bytes, peak_per_job_bytes, declared_baseline_bytes, concurrency, outcome) "
                "SELECT id, 'o-1', :t, '2027-01-15T08:00:00Z', :p, 'c1', 1, 1, 1, 1, 'ok' FROM nodes"
            ),
            {"t": NOW, "p": PROFILE},
        )
    migrate(db_url)
    assert current_revision(engine) == head_revision()  # past 0010
    with engine.connect() as conn:
        assert conn.execute(select(observations.c.ingest_id, observations.c.excluded)).all() == [("o-1", False)]
    with client(db_url) as c:
        assert flip(c, "old", "o-1").status_code == 200
    from alembic import command

    from oomguard.manager.db import alembic_config

    command.downgrade(alembic_config(db_url), "0009")
    assert current_revision(engine) == "0009"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT ingest_id FROM observations")).scalars().all() == ["o-1"]
    engine.dispose()
