"""Three server processes on one store serve one room, each request sent to a random
instance: one lock holder, exactly-once cursors and fenced completion still hold.

Runs on every backend other processes can share (SQLite file, Redis, PostgreSQL).
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Backend
from tests.helpers import free_port


@pytest.fixture
def instances(backend: Backend, tmp_path: Path) -> Iterator[list[str]]:
    if not backend.shared_across_processes:
        pytest.skip("memory:// is private to one process")
    ports = [free_port() for _ in range(3)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentrooms",
                "serve",
                "--dev",
                "--port",
                str(port),
                "--url",
                backend.url,
            ],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in ports
    ]
    bases = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for base, proc in zip(bases, procs, strict=True):
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.2)
        yield bases
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


async def test_three_instances_keep_the_invariants(instances: list[str]) -> None:
    rng = random.Random(7)
    room = f"st-{uuid.uuid4().hex[:8]}"

    async with httpx.AsyncClient(timeout=30) as http:

        async def call(method: str, path: str, agent: str, **kw: object) -> httpx.Response:
            base = rng.choice(instances)
            return await http.request(method, f"{base}/v1{path}", headers={"X-Agent": agent}, **kw)  # type: ignore[arg-type]

        assert (await call("POST", "/rooms", "admin", json={"name": room})).status_code == 201

        # one lock holder among ten concurrent acquirers
        acquired = await asyncio.gather(
            *(
                call("POST", f"/rooms/{room}/locks/plan/acquire", f"a{i}", json={"ttl": 30})
                for i in range(10)
            )
        )
        assert sorted(r.status_code for r in acquired) == [200] + [409] * 9
        holder = next(r for r in acquired if r.status_code == 200).json()
        shown = (await call("GET", f"/rooms/{room}/locks/plan", "x")).json()
        assert shown["holder"]["owner"] == holder["owner"]

        # exactly-once cursors while events are posted through random instances
        async def post(i: int) -> None:
            r = await call("POST", f"/rooms/{room}/events", "writer", json={"type": "e", "data": i})
            assert r.status_code == 201

        got: dict[str, list[int]] = {"r1": [], "r2": []}

        async def read(agent: str) -> None:
            for _ in range(30):
                r = await call("POST", f"/rooms/{room}/events/read-new?limit=7", agent)
                got[agent] += [e["seq"] for e in r.json()["events"]]
                await asyncio.sleep(0.01)

        await asyncio.gather(*(post(i) for i in range(40)), read("r1"), read("r2"))
        for agent in got:
            while batch := (
                await call("POST", f"/rooms/{room}/events/read-new?limit=100", agent)
            ).json()["events"]:
                got[agent] += [e["seq"] for e in batch]
        head = (await call("GET", f"/rooms/{room}", "x")).json()["last_seq"]
        assert got["r1"] == got["r2"] == list(range(1, head + 1))

        # fenced completion: a late holder cannot record its result
        await call("POST", f"/rooms/{room}/tasks", "admin", json={"tasks": [{"id": "t"}]})
        old = (await call("POST", f"/rooms/{room}/tasks/t/claim", "slow", json={"ttl": 0.3})).json()
        await asyncio.sleep(0.6)
        new = (await call("POST", f"/rooms/{room}/tasks/t/claim", "fast", json={"ttl": 30})).json()
        assert new["fence"] == old["fence"] + 1
        done = await call(
            "POST", f"/rooms/{room}/tasks/t/complete", "fast", json={**new, "result": "fast"}
        )
        assert done.status_code == 200
        late = await call(
            "POST", f"/rooms/{room}/tasks/t/complete", "slow", json={**old, "result": "slow"}
        )
        assert late.status_code == 409 and late.json()["error"]["type"] == "stale_fence"
        task = (await call("GET", f"/rooms/{room}/tasks/t", "x")).json()
        assert (task["status"], task["result"]) == ("done", "fast")
