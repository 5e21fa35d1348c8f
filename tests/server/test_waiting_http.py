"""Waiting over HTTP (issue #26 item 2): ``claim-next`` and a named claim take ``wait`` in
their body, ``read-new`` takes it as a query parameter; one request comes back as soon as
a task or an event arrives through another store handle, with the empty answer after
about ``wait`` when nothing happens, and at once (``finished``) when the plan is
finished. A wait out of bounds is refused (400); the OpenAPI document describes it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable

import httpx
import pytest

from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.server import HttpLimits
from agentrooms.server.models import MAX_WAIT
from agentrooms.store import Store
from tests.conftest import Backend
from tests.server.support import bearer, client, error_of, make_app, token

# On a loaded machine a call takes seconds; these still tell a wake-up (or an answer at
# once) from sleeping out a 10 s wait
WOKEN = 5.0
AT_ONCE = 3.0


async def later(seconds: float, action: Awaitable[object]) -> None:
    await asyncio.sleep(seconds)
    await action


class Counted:
    """An HTTP client that counts the requests it sends."""

    def __init__(self, c: httpx.AsyncClient, headers: dict[str, str]) -> None:
        self.c, self.headers, self.sent = c, headers, 0

    async def post(self, url: str, **kwargs: object) -> httpx.Response:
        self.sent += 1
        return await self.c.post(url, headers=self.headers, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def http(store: Store, room: str) -> AsyncIterator[Counted]:
    await Rooms(store).create(room)
    async with client(make_app(store)) as c:
        yield Counted(c, bearer(await token(store, "w")))


async def test_one_claim_request_gets_the_task_another_handle_adds(
    http: Counted, backend: Backend, room: str
) -> None:
    other = Rooms(await backend.open()).room(room)
    start = time.monotonic()
    adding = asyncio.create_task(later(0.3, other.plan.add([TaskSpec("t1")])))
    answer = await http.post(f"/v1/rooms/{room}/tasks/claim-next", json={"wait": 10})
    took = time.monotonic() - start
    await adding
    assert answer.status_code == 200, answer.text
    assert answer.json()["lease"]["task_id"] == "t1" and answer.json()["finished"] is False
    assert http.sent == 1 and 0.25 <= took < WOKEN, took


async def test_a_named_claim_waits_for_its_dependency(
    http: Counted, backend: Backend, room: str
) -> None:
    other = Rooms(await backend.open()).room(room)
    await other.plan.add([TaskSpec("a"), TaskSpec("b", deps=("a",))])
    held = await other.plan.claim("a", "x")
    start = time.monotonic()
    finishing = asyncio.create_task(later(0.3, other.plan.complete(held, None)))
    answer = await http.post(f"/v1/rooms/{room}/tasks/b/claim", json={"wait": 10})
    await finishing
    assert answer.status_code == 200, answer.text
    assert answer.json()["task_id"] == "b" and time.monotonic() - start < WOKEN
    assert http.sent == 1


async def test_claim_next_answers_null_after_wait_and_at_once_when_finished(
    http: Counted, store: Store, room: str
) -> None:
    plan = Rooms(store).room(room).plan
    await plan.add([TaskSpec("a"), TaskSpec("b", deps=("a",))])
    held = await plan.claim("a", "x", ttl=60)
    url = f"/v1/rooms/{room}/tasks/claim-next"
    start = time.monotonic()
    assert (await http.post(url, json={"wait": 0.5})).json() == {"lease": None, "finished": False}
    assert 0.45 <= time.monotonic() - start < WOKEN
    await plan.complete(held, None)
    await plan.cancel("b", None)
    start = time.monotonic()
    assert (await http.post(url, json={"wait": 10})).json() == {"lease": None, "finished": True}
    assert time.monotonic() - start < AT_ONCE


async def test_one_read_new_request_gets_the_event_another_handle_posts(
    http: Counted, backend: Backend, room: str
) -> None:
    other = Rooms(await backend.open()).room(room)
    url = f"/v1/rooms/{room}/events/read-new"
    await http.post(url)  # past room.created
    start = time.monotonic()
    posting = asyncio.create_task(later(0.3, other.events.post("note", 1, to=["w"])))
    answer = await http.post(f"{url}?wait=10")
    await posting
    assert [e["data"] for e in answer.json()["events"]] == [1]
    assert http.sent == 2 and 0.25 <= time.monotonic() - start < WOKEN
    start = time.monotonic()
    assert (await http.post(f"{url}?wait=0.4")).json() == {"events": []}
    assert 0.35 <= time.monotonic() - start < WOKEN
    inbox = f"{url}?inbox=true&wait=10"
    assert [e["data"] for e in (await http.post(inbox)).json()["events"]] == [1]  # at once
    start = time.monotonic()
    posting = asyncio.create_task(later(0.3, other.events.post("note", 2, to=["w"])))
    page = (await http.post(inbox)).json()
    await posting
    assert [e["data"] for e in page["events"]] == [2] and page["more"] is False
    assert 0.25 <= time.monotonic() - start < WOKEN


@pytest.mark.parametrize("wait", [-1, MAX_WAIT + 1, "soon"])
async def test_a_wait_out_of_bounds_is_refused(http: Counted, room: str, wait: object) -> None:
    claim = await http.post(f"/v1/rooms/{room}/tasks/claim-next", json={"wait": wait})
    read = await http.post(f"/v1/rooms/{room}/events/read-new?wait={wait}")
    for answer in (claim, read):
        assert answer.status_code == 400, answer.text  # validation is bad_request here
        assert "wait" in str(error_of(answer))


async def test_openapi_describes_wait(http: Counted) -> None:
    spec = (await http.c.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    wait = schemas["ClaimIn"]["properties"]["wait"]
    assert (wait["minimum"], wait["maximum"]) == (0, MAX_WAIT)
    assert "finished" in schemas["ClaimNextOut"]["properties"]
    params = spec["paths"]["/v1/rooms/{room}/events/read-new"]["post"]["parameters"]
    [query] = [p for p in params if p["name"] == "wait"]
    assert query["schema"]["maximum"] == MAX_WAIT and "woken" in query["description"]


async def test_the_server_caps_a_wait_at_its_max_wait(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    headers = bearer(await token(store, "w"))
    async with client(make_app(store, limits=HttpLimits(rate=None, max_wait=0.2))) as c:
        start = time.monotonic()
        claim = await c.post(
            f"/v1/rooms/{room}/tasks/claim-next", json={"wait": 20}, headers=headers
        )
        read = await c.post(f"/v1/rooms/{room}/events/read-new?wait=20&inbox=true", headers=headers)
        assert claim.json() == {"lease": None, "finished": False}
        assert read.json()["events"] == [] and time.monotonic() - start < WOKEN
