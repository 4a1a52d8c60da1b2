"""Headless Chromium for the page tests (explorer, report): Playwright driving /usr/bin/chromium.

Without Chromium or the playwright package a test is skipped, except under CI (CI=true), where it
fails: the page tests must run there (`make test` installs Chromium and the package).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# The window widths the pages must fit without scrolling sideways: a laptop's, and a narrow window's.
WIDTHS = (1400, 800)


def _missing(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (under CI the browser tests must run)")
    pytest.skip(why)


def playwright():
    """sync_playwright, or the test is skipped (failed under CI) when Chromium or playwright is missing."""
    if not os.path.exists(CHROMIUM):
        _missing(f"no Chromium at {CHROMIUM}: install it with `apt-get install chromium` (`make test` does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is missing: pip install -e '.[test]'")
    return sync_playwright


@contextlib.contextmanager
def chromium_page(url: str, width: int = 1300, height: int = 900):
    """A headless Chromium page opened at `url`, and the list its page and console errors go to."""
    sync_playwright = playwright()
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": width, "height": height},
        )
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.goto(url)
            yield page, errors
        finally:
            browser.close()


def sideways_overflow(page, width: int) -> tuple[int, list[str]]:
    """Resize the window to `width` and return (document's scroll width - window width, the elements that
    stick out on the right): (<= 0, []) when the page needs no horizontal scrolling."""
    page.set_viewport_size({"width": width, "height": 900})
    page.wait_for_timeout(100)  # one layout after the resize
    return page.evaluate("""() => [
        document.documentElement.scrollWidth - window.innerWidth,
        [...document.querySelectorAll('body *')]
            .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5)
            .slice(0, 5).map(e => `${e.tagName.toLowerCase()}#${e.id}.${e.className}`)]""")


def overlapping_boxes(page, selector: str) -> list[tuple[str, str]]:
    """Pairs of elements matching `selector` whose boxes overlap (by more than half a pixel)."""
    return page.evaluate("""(selector) => {
        const boxes = [...document.querySelectorAll(selector)].map(e => [e, e.getBoundingClientRect()])
            .filter(([, r]) => r.width > 0 && r.height > 0);
        const out = [];
        for (let a = 0; a < boxes.length; a++) for (let b = a + 1; b < boxes.length; b++) {
            const [ea, ra] = boxes[a], [eb, rb] = boxes[b];
            const w = Math.min(ra.right, rb.right) - Math.max(ra.left, rb.left);
            const h = Math.min(ra.bottom, rb.bottom) - Math.max(ra.top, rb.top);
            if (w > 0.5 && h > 0.5) out.push([ea.textContent, eb.textContent]);
        }
        return out.slice(0, 5); }""", selector)
