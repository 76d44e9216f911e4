"""``/docs`` in a real browser: Swagger UI served by the manager itself (the ``fastapi-offline``
package's assets), under the Content-Security-Policy of every page, behind the viewer token.

Headless Chromium (``tests/helpers/dashboard.py``): every request the page makes is recorded and
any that would leave the manager's host is aborted and counted; CSP violations are caught by a
``securitypolicyviolation`` listener installed before any script of the page runs (CSP Level 3,
"Report a violation": the event fires on the document, https://www.w3.org/TR/CSP3/#report-violation)
and by the console's "Content Security Policy" errors."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers.dashboard import Watch, api, needs_browser, shot
from tests.helpers.manager import VIEWER, VIEWER_H, ManagerProcess, fixture_report

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Route

pytestmark = needs_browser
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
CATCH_CSP = """
window.__csp = [];
document.addEventListener("securitypolicyviolation",
    e => window.__csp.push(e.violatedDirective + " " + e.blockedURI));
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    s = ManagerProcess(f"sqlite:///{tmp_path_factory.mktemp('docs') / 'fleet.db'}").start()
    report = fixture_report("docker_v2_private_ns_limit_512m")
    api(s, "/api/v1/reports", {"node": "docs-node", "id": uuid.uuid4().hex, "report": report})
    yield s
    s.stop()


class Traffic:
    """Every URL a page asks for; those outside *origin* are aborted and kept in ``outside``."""

    def __init__(self, page: Page, origin: str) -> None:
        self.origin = origin
        self.seen: list[str] = []
        self.outside: list[str] = []
        page.route("**/*", self.route)

    def route(self, route: Route) -> None:
        url = route.request.url
        self.seen.append(url)
        if url.startswith(self.origin + "/"):
            route.continue_()
        else:
            self.outside.append(url)
            route.abort()


def operations(schema: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m.upper(), path) for path, item in schema["paths"].items() for m in item if m in METHODS}


def get(server: ManagerProcess, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    """Status, Location and body of a GET, redirects not followed."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(server.url + path, headers=headers or {}), timeout=10) as r:
            return r.status, r.headers.get("Location", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Location", ""), e.read()


def test_docs_render_every_operation_offline_under_the_csp(browser: Browser, server: ManagerProcess) -> None:
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    watch = Watch(page)
    page.add_init_script(CATCH_CSP)
    traffic = Traffic(page, server.url)
    page.goto(server.url + "/docs")  # the login form, which comes back to /docs
    page.fill("input[name=token]", VIEWER)
    page.click("button[type=submit]")
    page.wait_for_selector(".opblock", timeout=20_000)
    assert page.url == server.url + "/docs"
    schema = json.loads(get(server, "/openapi.json")[2])
    shown = page.locator(".opblock").evaluate_all(
        """bs => bs.map(b => [b.querySelector('.opblock-summary-method').textContent.trim(),
                             b.querySelector('.opblock-summary-path').getAttribute('data-path')])"""
    )
    assert len(shown) >= 5 and {tuple(s) for s in shown} == operations(schema)
    assert page.locator(".information-container .title").inner_text().startswith(schema["info"]["title"])
    assert page.evaluate("getComputedStyle(document.querySelector('.opblock-summary-method')).color") != "rgb(0, 0, 0)"
    # Try it out: the browser's session reaches the API (connect-src 'self')
    block = page.locator(".opblock-get").filter(has=page.locator("[data-path='/api/v1/nodes/{name}']")).first
    block.locator(".opblock-summary").click()
    block.locator("button.try-out__btn").click()
    block.locator(".parameters input[placeholder=name]").fill("docs-node")
    block.locator("button.execute").click()
    status = block.locator(".live-responses-table tbody .response-col_status").first
    assert status.inner_text(timeout=10_000).strip() == "200"
    body = block.locator(".live-responses-table .response-col_description pre").first
    assert json.loads(body.inner_text())["name"] == "docs-node"
    shot(page, "api-docs")
    assert page.evaluate("window.__csp") == []
    assert not [e for e in watch.errors if "Content Security Policy" in e], watch.errors
    assert not watch.errors, watch.errors
    assert traffic.outside == [] and any(u.endswith("/docs/assets/swagger-ui-bundle.js") for u in traffic.seen)


@pytest.mark.slow
def test_docs_keep_the_csp_of_every_page(server: ManagerProcess) -> None:
    """The same policy as the dashboard's: no inline script, nothing from elsewhere."""
    csp = {}
    for path in ("/docs", "/login"):
        with urllib.request.urlopen(urllib.request.Request(server.url + path, headers=VIEWER_H), timeout=10) as r:
            csp[path] = r.headers.get_all("Content-Security-Policy")
    assert csp["/docs"] == csp["/login"] and len(csp["/docs"]) == 1
    assert "unsafe-inline" not in csp["/docs"][0] and "script-src 'self'" in csp["/docs"][0]
    status, _, body = get(server, "/docs", VIEWER_H)
    assert status == 200 and b"<script>" not in body and b"cdn" not in body.lower()


def test_docs_need_the_viewer_token_like_every_page(browser: Browser, server: ManagerProcess) -> None:
    for path in ("/docs", "/docs/init.js"):
        status, location, _ = get(server, path)
        assert (status, location) == (303, f"/login?next={path}"), path
        assert get(server, path, {"Authorization": "Bearer wrong"})[0] == 303
        assert get(server, path, VIEWER_H)[0] == 200
    page = browser.new_context().new_page()
    watch = Watch(page)
    page.goto(server.url + "/docs")
    assert page.url == server.url + "/login?next=/docs"
    assert page.locator(".opblock").count() == 0 and not watch.errors
    assert get(server, "/redoc", VIEWER_H)[0] == 404  # only Swagger UI is served
    assert get(server, "/openapi.json")[0] == 200  # the schema itself stays public, as before


def test_the_schema_declares_the_bearer_token_and_the_page_fits_a_phone(server: ManagerProcess) -> None:
    """Issue 39, item 8: no security scheme (no Authorize button); /docs had no mobile viewport."""
    schema = json.loads(get(server, "/openapi.json")[2])
    assert schema["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "the agent's, viewer's or admin's token",
    }
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            wanted: list[dict[str, list[str]]] = [] if path in ("/healthz", "/readyz", "/livez") else [{"bearer": []}]
            assert op["security"] == wanted, (method, path)
    status, _, page = get(server, "/docs", VIEWER_H)
    assert status == 200 and b'<meta name="viewport" content="width=device-width, initial-scale=1">' in page
