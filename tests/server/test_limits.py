"""Limits: 413 before the body is read (declared, lied about, chunked), JSON shape and
batch limits (400), the per-agent rate (429 with Retry-After, counted as rate_limited).
Nothing over a limit reaches a room in the store."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from agentrooms.metrics import default_metrics
from agentrooms.rooms import Rooms
from agentrooms.server import HttpLimits
from agentrooms.store import Store
from tests.server.support import Recording, bearer, client, digest, error_of, make_app, token

LIMIT = 1000


class Chunks:
    """A request body sent in ``count`` chunks of ``size`` bytes, counting those taken."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size, self.taken = count, size, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.count):
            self.taken += 1
            yield b" " * self.size


async def _setup(
    store: Store, room: str, limits: HttpLimits
) -> tuple[Recording, httpx.AsyncClient, dict[str, str]]:
    await Rooms(store).create(room)
    auth = bearer(await token(store, "alice", [room], ["admin"]))
    recording = Recording(store)
    return (
        recording,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=make_app(recording, limits=limits)),
            base_url="http://agentrooms.test",
        ),
        auth,
    )


@pytest.mark.parametrize(
    ("declared", "most_taken"),
    [
        (str(10 * 500), 0),  # an honest Content-Length over the limit: nothing is read
        ("10", 3),  # a small Content-Length lie: counted, cut at the chunk past 1000
        (None, 3),  # chunked
    ],
    ids=["content-length", "content-length-lie", "chunked"],
)
async def test_413_before_the_body_is_read(
    store: Store, room: str, declared: str | None, most_taken: int
) -> None:
    chunks = Chunks(10, 500)
    recording, c, auth = await _setup(store, room, HttpLimits(max_body_bytes=LIMIT, rate=None))
    headers = {**auth, "Content-Type": "application/json"}
    if declared is not None:
        headers["Content-Length"] = declared
    before = await digest(store, [room])
    recording.log.clear()
    async with c:
        response = await c.post(f"/v1/rooms/{room}/events", content=chunks, headers=headers)
    assert response.status_code == 413
    assert error_of(response)["type"] == "payload_too_large"
    assert chunks.taken <= most_taken < chunks.count
    assert recording.touched() == []  # only the token was looked up
    assert await digest(store, [room]) == before


async def test_a_chunked_body_under_the_limit_goes_through(store: Store, room: str) -> None:
    _, c, auth = await _setup(store, room, HttpLimits(max_body_bytes=LIMIT, rate=None))

    async def body() -> AsyncIterator[bytes]:
        yield b'{"type": "note", '
        yield b'"data": {"n": 1}}'

    async with c:
        response = await c.post(
            f"/v1/rooms/{room}/events",
            content=body(),
            headers={**auth, "Content-Type": "application/json"},
        )
    assert response.status_code == 201, response.text


def _nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (json.dumps({"type": "note", "data": _nested(40)}), "nested deeper"),
        (json.dumps({"type": "note", "data": "x" * 600}), "JSON string"),
        (json.dumps({"type": "note", "data": list(range(60))}), "items"),
        ('{"type": "note", "data": NaN}', "NaN"),
        ('{"type": "note", "data": 1e999}', "out of range"),
        ('{"type": "note", "data": "\\ud800"}', "surrogate"),
        ('{"type": "note", "data": ' + "[" * 5000 + "]" * 5000 + "}", "nested deeper"),
        ('{"type": "note", "data": 99999999999999999999999}', "64-bit"),
        ('{"type": "note", "data": [1,]}', "not valid JSON"),
    ],
    ids=["depth", "string", "items", "nan", "infinity", "surrogate", "deep", "bigint", "syntax"],
)
async def test_json_shape_limits(store: Store, room: str, payload: str, why: str) -> None:
    limits = HttpLimits(max_json_depth=16, max_string_bytes=500, max_items=50, rate=None)
    recording, c, auth = await _setup(store, room, limits)
    before = await digest(store, [room])
    recording.log.clear()
    async with c:
        response = await c.post(
            f"/v1/rooms/{room}/events",
            content=payload.encode(),
            headers={**auth, "Content-Type": "application/json"},
        )
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["type"] == "bad_request" and why in error["message"]
    assert recording.touched() == []
    assert await digest(store, [room]) == before


async def test_batch_limit(store: Store, room: str) -> None:
    recording, c, auth = await _setup(store, room, HttpLimits(max_batch=2, rate=None))
    before = await digest(store, [room])
    recording.log.clear()
    tasks = [{"id": f"t{i}"} for i in range(3)]
    async with c:
        response = await c.post(f"/v1/rooms/{room}/tasks", json={"tasks": tasks}, headers=auth)
    assert response.status_code == 400 and "at most 2" in error_of(response)["message"]
    assert recording.touched() == []
    assert await digest(store, [room]) == before


async def test_rate_limit_answers_429_with_retry_after(store: Store, room: str) -> None:
    recording, c, auth = await _setup(store, room, HttpLimits(rate=0.05, burst=3))
    limited_before = default_metrics().snapshot()["errors"]["rate_limited"]
    async with c:
        for _ in range(3):
            ok = await c.post(f"/v1/rooms/{room}/events", json={"type": "note"}, headers=auth)
            assert ok.status_code == 201
        before = await digest(store, [room])
        recording.log.clear()
        limited = await c.post(f"/v1/rooms/{room}/events", json={"type": "note"}, headers=auth)
        assert limited.status_code == 429
        error = error_of(limited)
        assert error["type"] == "rate_limited"
        assert int(limited.headers["Retry-After"]) >= 1
        assert error["details"]["retry_after"] > 0
        assert recording.log == []  # refused before any store access, the token's included
        assert await digest(store, [room]) == before
        others = bearer(await token(store, "bob", [room], ["admin"]))
        assert (await c.get(f"/v1/rooms/{room}", headers=others)).status_code == 200  # per agent
        metrics = await c.get("/metrics")
    assert default_metrics().snapshot()["errors"]["rate_limited"] == limited_before + 1
    assert 'agentrooms_errors_total{kind="rate_limited"}' in metrics.text
    assert 'agentrooms_http_errors_total{type="rate_limited"}' in metrics.text


async def test_a_wrong_secret_does_not_spend_the_agents_bucket(store: Store, room: str) -> None:
    _, c, auth = await _setup(store, room, HttpLimits(rate=0.5, burst=2))
    token_id = auth["Authorization"].split("_")[1]
    forged = bearer(f"ar_{token_id}_{'0' * 64}")
    async with c:
        assert (await c.get(f"/v1/rooms/{room}", headers=auth)).status_code == 200
        for _ in range(5):
            assert (await c.get(f"/v1/rooms/{room}", headers=forged)).status_code == 401
        assert (await c.get(f"/v1/rooms/{room}", headers=auth)).status_code == 200


async def test_no_body_limit_reaches_unknown_routes_either(store: Store) -> None:
    async with client(make_app(store, limits=HttpLimits(max_body_bytes=10, rate=None))) as c:
        response = await c.post("/nowhere", content=b"x" * 100)
    assert response.status_code == 413
