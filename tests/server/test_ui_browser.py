"""The 2am test: the dashboard in headless Chromium over a real ``agentrooms serve``.

Debian's ``chromium`` is driven by Playwright (``executable_path``; Playwright's own browser
download is never used). The room is seeded with tests/ops_scenario.py, and every trouble
it plants must be on the room page's first screen (1280x800: bounding boxes inside the
viewport, nothing scrolled or clicked); an event posted by another process must show within
a second. A memory store is private to its process, so on ``memory://`` the server runs in
the test's own process (uvicorn on a free port, over the very handle the room was seeded
through); on every other backend it is a separate ``agentrooms serve``. Without chromium
the test skips on a laptop and fails in CI (``AGENTROOMS_REQUIRE_BACKENDS``).
``AGENTROOMS_SCREENSHOTS=DIR`` keeps the screenshots (docs/img/ holds the committed ones);
otherwise they go to the test's temp dir.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from agentrooms.ops import Ops
from agentrooms.rooms import Rooms
from agentrooms.server import AuthConfig, HttpLimits, mint
from agentrooms.store import Store
from tests.conftest import Backend, unavailable
from tests.helpers import free_port
from tests.ops_scenario import (
    DEAD_EFFECT,
    EXPIRED_TASK,
    FAILED_TASK,
    HOT_DOC,
    LAG,
    LAGGING_AGENT,
    LOCK,
    TASKS,
    UNKNOWN_EFFECT,
    WAITERS,
    seed_2am,
)

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page, ViewportSize

CHROMIUM = os.environ.get("AGENTROOMS_CHROMIUM", "/usr/bin/chromium")
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
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


def spawn(url: str, cwd: Path, dev: bool) -> tuple[subprocess.Popen[bytes], str]:
    """``agentrooms serve`` over ``url`` (``--dev`` or tokens required), logging to
    cwd/serve.log."""
    port = free_port()
    command = [sys.executable, "-m", "agentrooms", "serve", "--port", str(port), "--url", url]
    command += ["--dev"] if dev else []
    with (cwd / "serve.log").open("w") as log:
        proc = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


@asynccontextmanager
async def served(url: str, cwd: Path, dev: bool = False) -> AsyncIterator[str]:
    """A served store (see :func:`spawn`) that answers ``/readyz``; yields its base URL."""
    proc, base = spawn(url, cwd, dev)
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


@asynccontextmanager
async def served_here(
    store: Store, dev: bool = False, limits: HttpLimits | None = None
) -> AsyncIterator[str]:
    """The app ``agentrooms serve`` runs (perimeter included), served by uvicorn in this
    process over ``store`` itself, on a free port; yields its base URL."""
    import uvicorn

    from agentrooms.server.app import create_app
    from agentrooms.server.perimeter import LOOPBACK_HOSTS, Perimeter

    auth, limits = AuthConfig(dev=dev), limits or HttpLimits()
    app = create_app(store, auth=auth, limits=limits)
    guarded = Perimeter(
        app, store=store, auth=auth, limits=limits, hosts=LOOPBACK_HOSTS if dev else None
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            guarded,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            ws="none",
            timeout_graceful_shutdown=5,
        )
    )
    task = asyncio.create_task(server.serve())
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and not task.done(), "no server"
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def serving(
    backend: Backend, store: Store, cwd: Path, dev: bool = False
) -> AbstractAsyncContextManager[str]:
    """The store served: in this process for a memory store (:func:`served_here`), by
    ``agentrooms serve`` otherwise (:func:`served`)."""
    if backend.shared_across_processes:
        return served(backend.url, cwd, dev)
    return served_here(store, dev)


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
    box = None
    for _ in range(5):  # a live refetch may replace the element between the two calls
        await element.wait_for(state="visible", timeout=5000)
        box = await element.bounding_box()
        if box is not None:
            break
    assert box is not None, selector
    assert box["x"] >= 0 and box["y"] >= 0, (selector, box)
    assert box["x"] + box["width"] <= VIEWPORT["width"], (selector, box)
    assert box["y"] + box["height"] <= VIEWPORT["height"], (selector, box)
    assert await page.evaluate("window.scrollY") == 0


async def count_becomes(page: Page, selector: str, n: int) -> None:
    """Wait (5 s at most) until ``selector`` matches ``n`` elements (the page's CSP
    forbids the string-evaluated predicates of ``wait_for_function``)."""
    deadline = time.monotonic() + 5
    while (found := await page.locator(selector).count()) != n:
        assert time.monotonic() < deadline, f"{selector}: {found} elements, not {n}"
        await asyncio.sleep(0.05)


# An agent's post from another process; prints the event's sequence number.
POST = """
import sys, httpx
base, room, token = sys.argv[1:]
answer = httpx.post(f"{base}/v1/rooms/{room}/events", json={"type": "page.check",
    "data": {"from": "another process"}}, headers={"Authorization": f"Bearer {token}"})
assert answer.status_code == 201, answer.text
print(answer.json()["seq"])
"""


async def flushed_contention(backend: Backend, store: Store, room: str) -> None:
    """Wait until another handle sees the seed's conflicts (flushed in the background;
    a memory store's own handle is the one it is served through)."""
    other = await backend.open() if backend.shared_across_processes else store
    deadline = time.monotonic() + 10
    while not await Ops(other).contention(room):
        assert time.monotonic() < deadline, "the seed's contention was never flushed"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("backend", ["memory", "sqlite", "redis", "postgres"], indirect=True)
async def test_2am_scenario_on_the_first_screen(
    backend: Backend, room: str, tmp_path: Path
) -> None:
    need_chromium()
    store = await backend.open()
    seeded = await seed_2am(store, room)
    oncall = (await mint(store, "oncall", rooms=[room], scopes=["ops:read"])).token
    poster = (await mint(store, "poster", rooms=[room], scopes=["events:write"])).token
    await flushed_contention(backend, store, room)
    out = shots(tmp_path)
    async with serving(backend, store, tmp_path) as base, chromium() as browser:
        page = await browser.new_page(viewport=VIEWPORT)
        failures: list[str] = []
        page.on("pageerror", lambda exc: failures.append(str(exc)))
        await log_in(page, base, f"/ui/rooms/{room}", oncall)
        await page.locator("#status.live-on").wait_for(timeout=10_000)
        stuck = "#stuck tr.stuck-row"
        for selector in (
            f'{stuck}[data-kind="expired_lease"][data-subject="{EXPIRED_TASK}"]',
            f'{stuck}[data-kind="failed_at_limit"][data-subject="{FAILED_TASK}"]',
            f'{stuck}[data-kind="waiter_waiting"][data-subject="{LOCK}"]',
            f'{stuck}[data-kind="cursor_lagging"][data-subject="{LAGGING_AGENT}"]',
            f'{stuck}[data-kind="effect_unknown"][data-subject="{UNKNOWN_EFFECT}"]',
            f'#glance-effects [data-dead-letter="{DEAD_EFFECT}"]',
            f'#glance-contention [data-hot^="doc/{HOT_DOC}"]',
        ):
            await on_first_screen(page, selector)
        assert (
            await page.locator("#glance-contention [data-hot]").first.get_attribute("data-hot")
            == f"doc/{HOT_DOC}"
        ), "the hot key is the hottest"
        waiters = page.locator(f'{stuck}[data-kind="waiter_waiting"] td.detail')
        assert f"{WAITERS} of {WAITERS} waiters" in await waiters.inner_text()
        lag = page.locator(f'{stuck}[data-kind="cursor_lagging"] td.detail')
        behind = re.match(r"([\d,]+) events behind", await lag.inner_text())
        assert behind is not None and int(behind.group(1).replace(",", "")) >= LAG
        plan = await page.locator("#glance-plan h3").inner_text()
        assert f"{TASKS} tasks" in plan
        await page.screenshot(path=str(out / "ui-room-2am.png"))

        # an event posted by another process shows within a second
        assert seeded.last_seq > 0
        post = await asyncio.create_subprocess_exec(
            sys.executable, "-c", POST, base, room, poster, stdout=asyncio.subprocess.PIPE
        )
        printed, _ = await post.communicate()
        assert post.returncode == 0
        seq = int(printed)
        posted = time.monotonic()
        row = page.locator(f'#event-rows tr[data-seq="{seq}"]')
        await row.wait_for(state="attached", timeout=LIVE_WITHIN * 1000)
        assert time.monotonic() - posted <= LIVE_WITHIN
        assert "page.check" in await row.inner_text()
        assert f"last seq {seq:,}" in await page.locator("#who").inner_text()
        await row.scroll_into_view_if_needed()
        await page.screenshot(path=str(out / "ui-room-events.png"))

        # the plan a page at a time, and by status; the timeline by type
        await page.locator("#plan .pager button", has_text="next").click()
        await page.locator('#plan-rows tr[data-task="t-150"]').wait_for(timeout=5000)
        assert await page.locator('#plan-rows tr[data-task="t-050"]').count() == 0
        await page.locator("#plan-status").select_option("failed")
        await count_becomes(page, "#plan-rows tbody tr", 1)
        assert await page.locator(f'#plan-rows tr[data-task="{FAILED_TASK}"]').count() == 1
        await page.locator("#event-type").fill("page.check")
        await count_becomes(page, "#event-rows tbody tr", 1)
        assert await page.locator(f'#event-rows tr[data-seq="{seq}"]').count() == 1

        await page.goto(f"{base}/ui")
        await page.locator(f'#rooms tr[data-room="{room}"]').wait_for(timeout=5000)
        await page.screenshot(path=str(out / "ui-rooms.png"))
        assert failures == []


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_token_without_ops_read_is_refused(
    backend: Backend, room: str, tmp_path: Path
) -> None:
    need_chromium()
    store = await backend.open()
    await seed_2am(store, room)
    planner = (await mint(store, "planner", rooms=[room], scopes=["plan:read"])).token
    async with served(backend.url, tmp_path) as base, chromium() as browser:
        async with httpx.AsyncClient(base_url=base) as c:
            for path in ("/ui", f"/ui/rooms/{room}"):
                refused = await c.get(path, headers={"Authorization": f"Bearer {planner}"})
                assert refused.status_code == 403
        page = await browser.new_page(viewport=VIEWPORT)
        await log_in(page, base, f"/ui/rooms/{room}", planner)
        why = page.locator("#login-why")
        await why.wait_for(state="visible", timeout=5000)
        assert "ops:read" in await why.inner_text()
        assert await page.locator("#stuck").count() == 0
        await page.screenshot(path=str(shots(tmp_path) / "ui-login-refused.png"))


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_dev_mode_needs_no_token(backend: Backend, room: str, tmp_path: Path) -> None:
    """On loopback with ``--dev`` the page asks for nothing (its stream tickets are the
    dev caller's); an event another process posts still shows within a second."""
    need_chromium()
    store = await backend.open()
    await seed_2am(store, room)
    async with served(backend.url, tmp_path, dev=True) as base, chromium() as browser:
        page = await browser.new_page(viewport=VIEWPORT)
        await page.goto(f"{base}/ui/rooms/{room}")
        await page.locator("#status.live-on").wait_for(timeout=10_000)
        assert await page.locator("#login").is_hidden()
        await on_first_screen(
            page, f'#stuck tr[data-kind="expired_lease"][data-subject="{EXPIRED_TASK}"]'
        )
        seq = await Rooms(store).room(room).events.post("page.check", {"dev": True})
        posted = time.monotonic()
        row = page.locator(f'#event-rows tr[data-seq="{seq}"]')
        await row.wait_for(state="attached", timeout=LIVE_WITHIN * 1000)
        assert time.monotonic() - posted <= LIVE_WITHIN


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
async def test_a_full_pool_of_dashboard_streams_is_shown_on_the_page(
    backend: Backend, room: str
) -> None:
    """Past ``max_dashboard_streams`` a tab says why it is not live (the 429's message)
    instead of reconnecting silently, and goes live once another tab closes."""
    need_chromium()
    store = await backend.open()
    await Rooms(store).create(room)
    oncall = (await mint(store, "oncall", rooms=[room], scopes=["ops:read"])).token
    limits = HttpLimits(max_dashboard_streams=1)
    async with served_here(store, limits=limits) as base, chromium() as browser:
        first = await browser.new_page(viewport=VIEWPORT)
        await log_in(first, base, f"/ui/rooms/{room}", oncall)
        await first.locator("#status.live-on").wait_for(timeout=10_000)
        second = await browser.new_page(viewport=VIEWPORT)
        await log_in(second, base, f"/ui/rooms/{room}", oncall)
        refused = second.locator('#status[data-state="refused"]')
        await refused.wait_for(timeout=10_000)
        text = await refused.inner_text()
        assert "1 open dashboard streams" in text and "max_dashboard_streams" in text, text
        await first.close()
        await second.locator("#status.live-on").wait_for(timeout=20_000)
