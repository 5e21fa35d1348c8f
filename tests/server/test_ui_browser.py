"""The 2am test: the dashboard in headless Chromium over a real ``agentrooms serve``.

Debian's ``chromium`` is driven by Playwright (``executable_path``; Playwright's own browser
download is never used). The room is seeded with tests/ops_scenario.py, and every trouble
it plants must be on the room page's first screen (1280x800: bounding boxes inside the
viewport, nothing scrolled or clicked); an event posted by another process must show within
a second. Without chromium the test skips on a laptop and fails in CI
(``AGENTROOMS_REQUIRE_BACKENDS``). ``AGENTROOMS_SCREENSHOTS=DIR`` keeps the screenshots
(docs/img/ holds the committed ones); otherwise they go to the test's temp dir.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from tests.conftest import unavailable
from tests.helpers import free_port

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

CHROMIUM = os.environ.get("AGENTROOMS_CHROMIUM", "/usr/bin/chromium")
VIEWPORT = {"width": 1280, "height": 800}
LIVE_WITHIN = 1.0  # seconds from an event's post to its row on the page


def need_chromium() -> None:
    if not Path(CHROMIUM).exists():
        unavailable(f"chromium at {CHROMIUM}")


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    need_chromium()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield browser
        finally:
            await browser.close()


def spawn(url: str, cwd: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``agentrooms serve`` (tokens required) over ``url``, logging to cwd/serve.log."""
    port = free_port()
    command = [sys.executable, "-m", "agentrooms", "serve", "--port", str(port), "--url", url]
    with (cwd / "serve.log").open("w") as log:
        proc = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


@asynccontextmanager
async def served(url: str, cwd: Path) -> AsyncIterator[str]:
    """A served store (see :func:`spawn`) that answers ``/readyz``; yields its base URL."""
    proc, base = spawn(url, cwd)
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient() as c:
            while True:
                try:
                    if (await c.get(f"{base}/readyz", timeout=1)).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, "no server"
                await asyncio.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)


def shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("AGENTROOMS_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


async def log_in(page: Page, base: str, path: str, token: str) -> None:
    """Open ``path`` as an operator would: the page asks for a token, which is typed in."""
    await page.goto(f"{base}{path}")
    await page.locator("#login-token").fill(token)
    await page.locator("#login button[type=submit]").click()


async def on_first_screen(page: Page, selector: str) -> None:
    """``selector``'s first element is shown inside the viewport, the page unscrolled."""
    element = page.locator(selector).first
    await element.wait_for(state="visible", timeout=5000)
    box = await element.bounding_box()
    assert box is not None, selector
    assert box["x"] >= 0 and box["y"] >= 0, (selector, box)
    assert box["x"] + box["width"] <= VIEWPORT["width"], (selector, box)
    assert box["y"] + box["height"] <= VIEWPORT["height"], (selector, box)
    assert await page.evaluate("window.scrollY") == 0
