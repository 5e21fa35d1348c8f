"""The HTTP surface around the routes: one envelope for every error (FastAPI's and
Starlette's own included), the OpenAPI document, health, readiness, metrics, dev mode,
and the serve() guard."""

from __future__ import annotations

import httpx
import pytest

from agentrooms.errors import StoreUnavailable
from agentrooms.server import AuthConfig, check_bind, serve
from agentrooms.store import Store
from agentrooms.store.types import Glance, Snapshot
from tests.helpers import Interposed
from tests.server.support import bearer, client, error_of, make_app, token


async def test_framework_errors_wear_the_envelope(store: Store, room: str) -> None:
    auth = bearer(await token(store, "alice", "*", ["admin"]))
    async with client(make_app(store)) as c:
        unknown = await c.get("/v1/nowhere", headers=auth)
        assert unknown.status_code == 404 and error_of(unknown)["type"] == "not_found"
        outside = await c.get("/nowhere")
        assert outside.status_code == 404 and error_of(outside)["type"] == "not_found"
        wrong = await c.patch(f"/v1/rooms/{room}/tasks", headers=auth)
        assert wrong.status_code == 405 and error_of(wrong)["type"] == "method_not_allowed"
        assert wrong.headers["Allow"] == "GET, POST, OPTIONS"
        invalid = await c.post("/v1/rooms", json={"name": "no spaces"}, headers=auth)
        assert invalid.status_code == 400 and error_of(invalid)["type"] == "bad_request"
        assert error_of(invalid)["details"]["errors"][0]["loc"] == ["body", "name"]
        extra = await c.post("/v1/rooms", json={"name": room, "surprise": 1}, headers=auth)
        assert extra.status_code == 400
        typed = await c.post("/v1/rooms", json={"name": 7}, headers=auth)
        assert typed.status_code == 400
        query = await c.get(f"/v1/rooms/{room}/events", params={"limit": "many"}, headers=auth)
        assert query.status_code == 400
        form = await c.post(
            "/v1/rooms", content=b"name=x", headers={**auth, "Content-Type": "text/plain"}
        )
        assert form.status_code == 400
        created = await c.post("/v1/rooms", json={"name": room}, headers=auth)
        assert created.status_code == 201
        exists = await c.post("/v1/rooms", json={"name": room}, headers=auth)
        assert exists.status_code == 409 and error_of(exists)["type"] == "version_conflict"


async def test_openapi_is_served_and_says_400_not_422(store: Store) -> None:
    async with client(make_app(store)) as c:
        spec = (await c.get("/openapi.json")).json()
    assert spec["openapi"].startswith("3.")
    assert "HTTPValidationError" not in str(spec)
    operations = [
        (path, method, op)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if path.startswith("/v1/")
    ]
    assert len(operations) >= 30
    for path, method, op in operations:
        responses = op["responses"]
        assert "400" in responses, (path, method)
        if "422" in responses:
            assert "Idempotency" in responses["422"]["description"], (path, method)
        assert op.get("security") == [{"HTTPBearer": []}], (path, method)
    put_doc = spec["paths"]["/v1/rooms/{room}/docs/{name}"]["put"]
    assert {"412", "428"} <= set(put_doc["responses"])
    params = {p["name"] for p in put_doc["parameters"]}
    assert {"If-Match", "If-None-Match", "Idempotency-Key"} <= params
    stream = spec["paths"]["/v1/rooms/{room}/events/stream"]["get"]
    assert "text/event-stream" in stream["responses"]["200"]["content"]


class Down(Interposed):
    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        raise StoreUnavailable("the store is down")

    async def _glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        raise StoreUnavailable("the store is down")


class Broken(Interposed):
    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        raise RuntimeError("a bug")

    async def _glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        raise RuntimeError("a bug")


async def test_an_unexpected_error_is_a_500_with_the_envelope(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(Broken(store), dev=True)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://agentrooms.test") as c:
        response = await c.get("/v1/rooms/anything")
    assert response.status_code == 500
    assert error_of(response) == {
        "type": "internal_error",
        "message": "internal error (logged on the server)",
        "details": {},
    }
    assert "a bug" in caplog.text  # logged, never shown


async def test_health_readiness_and_metrics(store: Store) -> None:
    async with client(make_app(store)) as c:
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        assert (await c.get("/readyz")).json() == {"status": "ready"}
        metrics = await c.get("/metrics")
        assert metrics.status_code == 200
        assert "agentrooms_errors_total" in metrics.text
    async with client(make_app(Down(store), dev=True)) as c:
        assert (await c.get("/healthz")).status_code == 200
        ready = await c.get("/readyz")
        assert ready.status_code == 503 and error_of(ready)["type"] == "store_unavailable"
        failing = await c.get("/v1/rooms/anything")
        assert failing.status_code == 503 and error_of(failing)["type"] == "store_unavailable"
        assert failing.headers["Retry-After"] == "1"


async def test_dev_mode_acts_as_the_x_agent(store: Store, room: str) -> None:
    async with client(make_app(store, dev=True)) as c:
        assert (await c.post("/v1/rooms", json={"name": room})).status_code == 201
        await c.post(f"/v1/rooms/{room}/tasks", json={"tasks": [{"id": "t"}]})
        lease = await c.post(f"/v1/rooms/{room}/tasks/claim-next", headers={"X-Agent": "zoe"})
        assert lease.json()["lease"]["agent"] == "zoe"
        bad = await c.get(f"/v1/rooms/{room}", headers={"X-Agent": "not valid"})
        assert bad.status_code == 400
        leaked = await c.get(f"/v1/rooms/{room}", params={"token": "x"})
        assert leaked.status_code == 401  # even in dev mode
    async with client(make_app(store)) as c:
        assert (await c.get(f"/v1/rooms/{room}", headers={"X-Agent": "zoe"})).status_code == 401


def test_dev_mode_binds_only_loopback() -> None:
    dev = AuthConfig(dev=True)
    for host in ("127.0.0.1", "::1", "[::1]"):
        check_bind(host, dev)
    for host in ("0.0.0.0", "::", "192.0.2.1", "localhost", "example.org"):
        with pytest.raises(ValueError, match="dev mode binds only"):
            check_bind(host, dev)
        with pytest.raises(ValueError, match="dev mode binds only"):
            serve("memory://", host, 0, dev)
    check_bind("0.0.0.0", AuthConfig())  # with tokens any interface may be served
