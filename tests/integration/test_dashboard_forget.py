"""Forgetting a node from the dashboard, in Chromium: the button, the confirmation (the node's
name typed again and the operator's admin token), a wrong name, a wrong token (403), success (the
node leaves the table, a one-line notice once), no admin token configured (a disabled button),
and requests that did not come from the manager's own form (403), with and without script."""

from __future__ import annotations

import html
import re
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from oomguard.manager.web.forget import forget_token
from tests.helpers.dashboard import Watch, api, needs_browser, rows, shot
from tests.helpers.fleet import PHONE, WIDE
from tests.helpers.manager import VIEWER, ManagerProcess, fixture_report

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = needs_browser

ADMIN = "admin-secret-token-0123"
CROSS_SITE_LINE = "This request did not come from this manager's own form; open the node's page and try again."


def seed(s: ManagerProcess, n: int) -> None:
    for i in range(n):
        report = fixture_report("docker_v2_private_ns_limit_512m")
        api(s, "/api/v1/reports", {"node": f"churn-{i:02d}", "id": uuid.uuid4().hex, "report": report})


@pytest.fixture(scope="module")
def admin_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    """A manager with an admin token (OOMGUARD_ADMIN_TOKEN, as --admin-token), 6 nodes."""
    db = tmp_path_factory.mktemp("forget") / "fleet.db"
    s = ManagerProcess(f"sqlite:///{db}", env={"OOMGUARD_ADMIN_TOKEN": ADMIN}).start()
    seed(s, 6)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    """A manager without an admin token: nobody may forget a node."""
    db = tmp_path_factory.mktemp("noadmin") / "fleet.db"
    env = {"OOMGUARD_ADMIN_TOKEN": ""}  # an empty variable is no token
    s = ManagerProcess(f"sqlite:///{db}", env=env).start()
    seed(s, 2)
    yield s
    s.stop()


def signed_in(browser: Browser, server: ManagerProcess, **context: Any) -> tuple[Page, Watch]:
    page = browser.new_context(**context).new_page()
    watch = Watch(page)
    page.goto(server.url + "/login")
    page.fill("input[name=token]", VIEWER)
    page.click("button[type=submit]")
    page.wait_for_selector("table.nodes")
    return page, watch


def unexpected(watch: Watch) -> list[str]:
    """Console errors but the statuses this test asks for (Chromium logs every 4xx page)."""
    return [e for e in watch.errors if not re.fullmatch(r"Failed to load resource: .* status of 40[034] .*", e)]


def submit(page: Page, confirm: str, token: str) -> int:
    """Fill the confirmation form and send it; the status of the page it lands on."""
    page.fill("input[name=confirm]", confirm)
    page.fill("input[name=token]", token)
    with page.expect_navigation() as nav:
        page.click("form.forget button[type=submit]")
    response = nav.value
    assert response is not None
    return response.status


@pytest.mark.parametrize(("view", "node", "script"), [("wide", "churn-01", True), ("phone", "churn-02", False)])
def test_forget_a_node_confirm_wrong_token_success(
    browser: Browser, admin_server: ManagerProcess, view: str, node: str, script: bool
) -> None:
    """The whole flow; on the phone with script off (the page needs none)."""
    viewport = {"wide": WIDE, "phone": PHONE}[view]
    page, watch = signed_in(browser, admin_server, java_script_enabled=script, **viewport)
    assert node in rows(page)
    page.goto(admin_server.url + f"/nodes/{node}")
    page.click("a.button >> text=Forget node…")
    page.wait_for_url(f"**/nodes/{node}/forget")
    assert page.locator("h1").inner_text() == f"Forget node “{node}”?"
    assert page.evaluate("document.documentElement.scrollWidth") <= viewport["viewport"]["width"]
    shot(page, f"forget-confirm-{view}")

    assert submit(page, "churn-0", ADMIN) == 400  # the name typed wrong: asked again, nothing done
    assert page.locator("form.forget p.bad").inner_text() == "Type the node's name exactly to confirm."

    assert submit(page, node, "not-the-admin-token") == 403
    assert page.locator("h1").inner_text() == "Forbidden"
    assert page.locator("main p").first.inner_text() == "That admin token is not valid."
    shot(page, f"forget-403-{view}")

    page.goto(admin_server.url + f"/nodes/{node}/forget")
    assert submit(page, node, ADMIN) == 200
    assert urllib.parse.urlsplit(page.url).path == "/"
    notice = page.locator("p.notice")
    assert notice.inner_text().startswith(f"Forgot node {node}:")
    assert node not in rows(page) and "churn-00" in rows(page)
    shot(page, f"forget-done-{view}")
    page.reload()
    assert page.locator("p.notice").count() == 0  # said once
    response = page.goto(admin_server.url + f"/nodes/{node}")
    assert response is not None and response.status == 404
    assert not unexpected(watch), watch.errors


def test_forget_from_another_origin_is_refused(browser: Browser, admin_server: ManagerProcess) -> None:
    """A page on another origin (same site: 127.0.0.1 on another port, so the SameSite=Strict
    cookie is sent) that even knows the admin token cannot forget a node: no form token, and its
    Origin is not the manager's."""
    target = "churn-03"
    attack = (
        f'<form id="f" method="post" action="{admin_server.url}/nodes/{target}/forget">'
        f'<input name="confirm" value="{target}"><input name="token" value="{ADMIN}">'
        '<input name="csrf" value=""></form><script>document.getElementById("f").submit()</script>'
    ).encode()

    class Attacker(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(attack)

        def log_message(self, *args: Any) -> None:
            pass

    evil = ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        page, _ = signed_in(browser, admin_server, **WIDE)
        with page.expect_navigation(url=f"**/nodes/{target}/forget") as nav:
            page.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
        assert nav.value is not None and nav.value.status == 403
        assert page.locator("main p").first.inner_text() == CROSS_SITE_LINE
        shot(page, "forget-cross-origin")
        # With the right form token, a foreign Origin is still refused.
        page.goto(admin_server.url + f"/nodes/{target}/forget")
        csrf = page.locator("input[name=csrf]").get_attribute("value") or ""
        assert len(csrf) == 64
        form: dict[str, str | float | bool] = {"confirm": target, "token": ADMIN, "csrf": csrf}
        refused = page.request.post(
            admin_server.url + f"/nodes/{target}/forget", form=form, headers={"Origin": "http://evil.example"}
        )
        assert refused.status == 403
        refused = page.request.post(  # the session's form token is the one for this node only
            admin_server.url + "/nodes/churn-04/forget", form={**form, "confirm": "churn-04"}
        )
        assert refused.status == 403
        for odd in ("é" * 64, "\x00", csrf + "0"):  # never a 500: a one-line refusal
            refused = page.request.post(admin_server.url + f"/nodes/{target}/forget", form={**form, "csrf": odd})
            assert refused.status == 403 and CROSS_SITE_LINE in html.unescape(refused.text())
        page.goto(admin_server.url + "/")
        assert {target, "churn-04"} <= set(rows(page))  # nothing was forgotten
    finally:
        evil.shutdown()
        evil.server_close()


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_forget_is_disabled_without_an_admin_token(browser: Browser, plain_server: ManagerProcess, view: str) -> None:
    viewport = {"wide": WIDE, "phone": PHONE}[view]
    page, watch = signed_in(browser, plain_server, **viewport)
    page.goto(plain_server.url + "/nodes/churn-00")
    button = page.locator("button.danger", has_text="Forget node")
    assert button.is_disabled() and "--admin-token" in (button.get_attribute("title") or "")
    assert page.locator("a.button", has_text="Forget node").count() == 0
    shot(page, f"forget-disabled-{view}")
    page.goto(plain_server.url + "/nodes/churn-00/forget")  # typed by hand: disabled there too
    assert page.locator("form.forget").count() == 0 and page.locator("button.danger[disabled]").count() == 1
    assert page.locator("input[name=csrf]").count() == 0
    form: dict[str, str | float | bool] = {"confirm": "churn-00", "token": "anything", "csrf": ""}
    url = plain_server.url + "/nodes/churn-00/forget"
    assert page.request.post(url, form=form).status == 403  # no form token: refused before anything else
    session = {c["name"]: c["value"] for c in page.context.cookies()}["oomguard_session"]
    disabled = page.request.post(url, form={**form, "csrf": forget_token(session, "churn-00")})
    assert disabled.status == 403 and "Forgetting nodes is disabled: start the manager with --admin-token." in (
        disabled.text()
    )
    page.goto(plain_server.url + "/")
    assert "churn-00" in rows(page)
    assert not unexpected(watch), watch.errors
