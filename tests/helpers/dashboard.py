"""The dashboard in a real browser: headless Chromium (Debian's package) driven by Playwright.

A pytest plugin (``tests/conftest.py`` lists it in ``pytest_plugins``): the module-scoped
``browser`` fixture is shared by name, never imported. The page helpers and ``needs_browser``
(each browser test module's ``pytestmark``) are imported from here. Playwright itself is
imported only when a browser starts, so loading the plugin costs every test run nothing."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import REPO
from tests.helpers.manager import AGENT_H, VIEWER, ManagerProcess

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Dialog, Page

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = REPO / "test-artifacts"
HAVE_BROWSER = importlib.util.find_spec("playwright") is not None and os.path.exists(CHROMIUM)

needs_browser = pytest.mark.skipif(
    not HAVE_BROWSER,
    reason="needs Playwright (dev extra) and Debian's chromium (scripts/system-deps.sh installs it)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield b
        b.close()


def api(server: ManagerProcess, path: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={**AGENT_H, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


class Watch:
    """Console errors, page errors and dialogs (an alert() would be one) of a page."""

    def __init__(self, page: Page) -> None:
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))

        def dialog(d: Dialog) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", dialog)


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def logged_in(browser: Browser, server: ManagerProcess, **context: Any) -> tuple[Page, Watch]:
    page = browser.new_context(**context).new_page()
    watch = Watch(page)
    page.goto(server.url + "/")
    assert "/login" in page.url  # pages need the viewer token too
    shot(page, "login")
    page.fill("input[name=token]", "wrong")
    page.click("button[type=submit]")
    assert page.locator("p.bad").inner_text() == "That token is not valid."
    page.fill("input[name=token]", VIEWER)
    page.click("button[type=submit]")
    page.wait_for_selector("table.nodes")
    return page, watch


def rows(page: Page) -> list[str]:
    """The node names of the table, in order (a row without a node: its text, "No node matches.");
    the Node cell's labels and the group heading rows left out."""
    names: list[str] = page.locator("table.nodes tbody tr td:first-child").evaluate_all(
        "cs => cs.map(c => (c.querySelector('a.node') || c).innerText.trim())"
    )
    return names


def fits(page: Page, width: int) -> None:
    """Nothing wider than the window: neither the page nor the table inside its box."""
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    box = page.evaluate(
        "[document.querySelector('.scroll').scrollWidth, document.querySelector('.scroll').clientWidth]"
    )
    assert box[0] <= box[1], box
