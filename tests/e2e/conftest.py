"""Playwright driving Debian's Chromium (/usr/bin/chromium, installed by `make browsers`)."""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1366, "height": 860}


@pytest.fixture(scope="module")
def browser():
    """One Chromium per test module. Playwright's sync API runs an event loop on the main thread
    while it is open; closing it with the module keeps that loop out of the tests that follow
    (asyncio.run refuses to start inside a running loop)."""
    if not os.path.exists(CHROMIUM):
        pytest.fail("Chromium is missing: run `make browsers` (Debian's chromium package)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module", autouse=True)
def _orm_beside_playwright():
    # With Playwright's loop running on the main thread, Django's ORM refuses to run in the test
    # (and in its database teardown) unless told this thread may; set for browser modules only.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(base_url=live_server.url, viewport=LAPTOP)
    page = context.new_page()
    # Generous: a waiting limit, not a speed check (the machine may be busy with other work).
    page.set_default_timeout(60_000)
    yield page
    context.close()


def sign_up(page, username: str = "learner", password: str = "a-long-passphrase-1") -> None:
    page.goto("/accounts/signup/")
    page.fill("#id_username", username)
    page.fill("#id_password1", password)
    page.fill("#id_password2", password)
    page.click("button[type=submit]")
