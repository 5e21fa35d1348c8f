"""HTTP: conditional document writes against an echo endpoint of the same server.

The server is a real process, started by this script on a free port: uvicorn serving
the app as ``agentrooms serve --dev`` builds and runs it (one worker; ``asyncio.run``,
so the standard event loop, and httptools; access log at ``info``, sent to /dev/null; MCP
mounted at ``/mcp``) over the embedded SQLite store in a temp dir, a per-run Redis key
prefix or a per-run PostgreSQL database (both dropped at the end). Two differences from
``serve``, both for measuring: the per-agent rate limit is out of reach (1e9/s: the
bucket is still charged on every request, it never refuses), and one route is mounted
through the app factory, in this benchmark's server only:

    PUT /v1/bench/echo    answers the request body back

The echo passes the same middleware as every ``/v1`` request (the gate: query-token
check, body-size limit, dev-mode auth from ``X-Agent``, the rate bucket, body buffering
and the JSON shape check) and the same FastAPI router, then stops: no model, no store.

Two arms at each client count (closed loop; asyncio + ``httpx.AsyncClient``; each client
its own agent on one keep-alive connection, which it uses for both arms):

* conditional PUT: ``PUT /v1/rooms/R/docs/<doc>`` with ``If-Match`` set to the ETag of
  the previous answer. A ``412`` hands back the current ETag and the client retries with
  it (counted). Each client writes its OWN document, so this measures the request path,
  not contention on a document (every write still appends ``doc.written`` to the room's
  log; ``--room-per-client`` gives each client a room of its own);
* echo: the same body to ``PUT /v1/bench/echo``.

The arms run in slices (``--slice``, 1 s) alternating echo, PUT, PUT, echo, ... until
each has run ``--duration`` seconds, so drift on a shared machine hits both and a linear
one cancels out; the ratio is the median over adjacent pairs. A slice's rate counts the
requests completed inside its window. Besides requests/s, p50 and p99, every cell
reports the server process's CPU time per request (/proc/PID/stat) and how busy the
server and the client were: the client runs in this process and shares the machine's
cores with the server (and with Redis or PostgreSQL), so a client near 100% means the
cell measured the client.

Then server memory: VmRSS of the server process at rest after start and warm-up, after
the measured cells, after ``--events`` events posted to one room (``POST
/v1/rooms/R/events`` from 32 concurrent clients: the API takes one event per request),
and after 2 s idle.

    python3 dev.py bench http [--backends sqlite,redis,postgres] [--clients 8,32]
        [--duration 5] [--slice 1] [--events 100000] [--room-per-client] [--quick]

``--backends memory`` serves the server's own in-process store: the HTTP path alone.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from common import Arm, machine, ms, ratio_stats, store_url, unique

HOST = "127.0.0.1"
ECHO = "/v1/bench/echo"
PUT, ECHO_ARM = "conditional PUT", "echo"
BODY = {"value": {"n": 0, "pad": "x" * 100}}
WARMUP_REQUESTS = 20  # of each arm per client, unrecorded (its connection is then open)
EVENT_CLIENTS = 32
GOAL = 0.40  # issue 5: conditional PUT at >= 40% of the echo rate at 32 clients
IDLE = 2.0  # seconds of rest before the last RSS reading
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Unexpected(Exception):
    """The server did not start, or answered what no client here expects: the run is
    void."""


# ---------------------------------------------------------------------- server side


def mount_echo(app: FastAPI) -> None:
    """The benchmark's echo route, mounted through the app factory's app (never in
    ``agentrooms serve``): it runs behind the same gate as every ``/v1`` route."""

    async def echo(request: Request) -> Response:
        return Response(await request.body(), media_type="application/json")

    app.add_api_route(ECHO, echo, methods=["PUT"], include_in_schema=False)


async def serve_child(url: str, port: int) -> None:
    """What ``agentrooms.server.serve`` does for ``agentrooms serve --dev``, plus the echo
    route and the out-of-reach rate limit."""
    import uvicorn

    from agentrooms.server import AuthConfig, HttpLimits, create_app
    from agentrooms.server.mcp.http import McpHttp, mount_mcp
    from agentrooms.store import open_store

    auth = AuthConfig(dev=True)
    limits = HttpLimits(rate=1e9, burst=10**9)
    store = await open_store(url)
    try:
        app = create_app(store, auth=auth, limits=limits)
        mount_echo(app)
        mount_mcp(app, McpHttp(store, auth=auth, limits=limits, host=HOST), "/mcp")
        config = uvicorn.Config(app, host=HOST, port=port, log_level="info", proxy_headers=False)
        await uvicorn.Server(config).serve()
    finally:
        await store.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    pid: int
    base: str

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


@asynccontextmanager
async def server_process(url: str, log: Path) -> AsyncIterator[Server]:
    port = free_port()
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--child-url",
            url,
            "--child-port",
            str(port),
            stdout=asyncio.subprocess.DEVNULL,  # uvicorn's access log
            stderr=err,
        )
    server = Server(proc.pid, f"http://{HOST}:{port}")
    try:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(timeout=1) as http:
            while True:
                try:
                    if (await http.get(f"{server.base}/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise Unexpected(f"the server did not start:\n{tail(log)}")
                await asyncio.sleep(0.2)
        yield server
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


# ---------------------------------------------------------------------- client side


def expect(response: httpx.Response, *statuses: int) -> httpx.Response:
    if response.status_code not in statuses:
        raise Unexpected(
            f"{response.request.method} {response.request.url.path}: "
            f"{response.status_code} {response.text[:300]}"
        )
    return response


def connections(base: str, n: int, who: str) -> list[httpx.AsyncClient]:
    """``n`` clients, each its own agent on at most one keep-alive connection."""
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return [
        # verify=False: plain http, and it spares every client loading the CA bundle
        httpx.AsyncClient(
            base_url=base, limits=one, timeout=60, verify=False, headers={"X-Agent": f"{who}-{i}"}
        )
        for i in range(n)
    ]


class Client:
    """One agent on one connection, running either arm: a conditional write of its own
    document (If-Match the last ETag; a 412 hands back the current ETag and the client
    retries with it), or the echo of the same body."""

    def __init__(self, http: httpx.AsyncClient, room: str, doc: str) -> None:
        self.http, self.url, self.tag, self.retries = http, f"/v1/rooms/{room}/docs/{doc}", "", 0

    async def setup(self) -> None:
        """Create the document, then ``WARMUP_REQUESTS`` of each arm (connection open)."""
        answer = await self.http.put(self.url, json=BODY, headers={"If-None-Match": "*"})
        self.tag = expect(answer, 201).headers["ETag"]
        for _ in range(WARMUP_REQUESTS):
            await self.put()
            await self.echo()
        self.retries = 0

    async def put(self) -> None:
        while True:
            answer = await self.http.put(self.url, json=BODY, headers={"If-Match": self.tag})
            self.tag = expect(answer, 200, 412).headers["ETag"]
            if answer.status_code == 200:
                return
            self.retries += 1

    async def echo(self) -> None:
        expect(await self.http.put(ECHO, json=BODY), 200)


@dataclass
class Slice:
    """One arm run by every client for one slice of time (closed loop)."""

    arm: str
    window: float = 0.0  # seconds from the start to the close of the window
    done: int = 0  # requests completed inside the window: the rate's numerator
    latencies: list[float] = field(default_factory=list)  # every request, drain included
    server_cpu: float = 0.0  # seconds of the server process, drain included
    client_cpu: float = 0.0  # seconds of this process, drain included

    @property
    def rate(self) -> float:
        return self.done / self.window if self.window else 0.0


async def run_slice(server: Server, clients: list[Client], arm: str, seconds: float) -> Slice:
    """Every client runs ``arm`` back to back until the window closes; a request still
    in flight then finishes (its latency counts, it does not count toward the rate)."""
    result = Slice(arm)
    cpu0, mine0 = server.cpu_seconds(), time.process_time()
    start = time.perf_counter()
    stop = start + seconds

    async def loop(client: Client) -> None:
        op = client.put if arm == PUT else client.echo
        while (t0 := time.perf_counter()) < stop:
            await op()
            t1 = time.perf_counter()
            result.latencies.append(t1 - t0)
            result.done += t1 <= stop

    await asyncio.gather(*(loop(c) for c in clients))
    result.window = stop - start
    result.server_cpu = server.cpu_seconds() - cpu0
    result.client_cpu = time.process_time() - mine0
    return result


async def post_events(server: Server, room: str, total: int) -> float:
    """``total`` events to ``room`` from ``EVENT_CLIENTS`` concurrent clients; events/s."""
    numbers = itertools.count()
    pool = connections(server.base, EVENT_CLIENTS, "poster")

    async def poster(http: httpx.AsyncClient) -> None:
        while (i := next(numbers)) < total:
            body = {"type": "bench.event", "data": {"i": i}}
            expect(await http.post(f"/v1/rooms/{room}/events", json=body), 201)

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(poster(http) for http in pool))
    finally:
        for http in pool:
            await http.aclose()
    return total / (time.perf_counter() - t0)


# ------------------------------------------------------------------------- backends


@dataclass
class Result:
    backend: str
    slices: dict[tuple[str, int], list[Slice]] = field(default_factory=dict)
    retries: int = 0  # 412s answered by a retry (own documents: expected 0)
    memory: dict[str, float] = field(default_factory=dict)  # label -> VmRSS MB
    events_per_second: float = 0.0


async def clients_for(
    server: Server, n: int, rooms: list[str], tag: str
) -> tuple[list[Client], list[httpx.AsyncClient]]:
    pool = connections(server.base, n, "bench")
    clients = [Client(http, rooms[i % len(rooms)], f"{tag}-c{i}") for i, http in enumerate(pool)]
    await asyncio.gather(*(c.setup() for c in clients))
    return clients, pool


async def measure(server: Server, n: int, rooms: list[str], args: argparse.Namespace) -> Result:
    """``args.duration`` seconds per arm at ``n`` clients, in slices alternating
    echo, PUT, PUT, echo, ... (a drift that is linear in time cancels out)."""
    part = Result("")
    clients, pool = await clients_for(server, n, rooms, f"n{n}")
    try:
        for k in range(max(1, round(args.duration / args.slice))):
            for arm in (ECHO_ARM, PUT) if k % 2 == 0 else (PUT, ECHO_ARM):
                part.slices.setdefault((arm, n), []).append(
                    await run_slice(server, clients, arm, args.slice)
                )
    finally:
        for http in pool:
            await http.aclose()
    part.retries = sum(c.retries for c in clients)
    return part


async def bench_backend(backend: str, args: argparse.Namespace, tmp: Path) -> Result:
    result = Result(backend)
    counts = [int(n) for n in args.clients.split(",")]
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(store_url(backend, tmp, "http"))
        server = await stack.enter_async_context(server_process(url, tmp / f"{backend}.log"))
        room, events_room = unique("http"), unique("events")
        rooms = [f"{room}-c{i}" for i in range(max(counts))] if args.room_per_client else [room]
        async with httpx.AsyncClient(base_url=server.base, headers={"X-Agent": "bench"}) as c:
            for name in (*rooms, events_room):
                expect(await c.post("/v1/rooms", json={"name": name}), 201)
        clients, pool = await clients_for(server, max(counts), rooms, "warm")  # unrecorded
        for arm in (ECHO_ARM, PUT):
            await run_slice(server, clients, arm, args.warmup)
        for http in pool:
            await http.aclose()
        await asyncio.sleep(1.0)
        result.memory["at rest after warm-up"] = server.rss_mb()
        for n in counts:
            part = await measure(server, n, rooms, args)
            result.slices.update(part.slices)
            result.retries += part.retries
            for arm in (ECHO_ARM, PUT):
                slices = part.slices[(arm, n)]
                print(
                    f"  {backend:8} {arm:15} clients={n:<3} {rate(slices):7,.0f} req/s "
                    f"(slices {spread(slices)})  p50 {ms(pct(slices, 0.5))} ms  "
                    f"p99 {ms(pct(slices, 0.99))} ms  server CPU {server_ms(slices):.2f} ms/req",
                    flush=True,
                )
        result.memory["after the measured cells"] = server.rss_mb()
        result.events_per_second = await post_events(server, events_room, args.events)
        result.memory[f"after {args.events:,} events to one room"] = server.rss_mb()
        await asyncio.sleep(IDLE)
        result.memory[f"after {IDLE:.0f} s idle"] = server.rss_mb()
        print(
            f"  {backend:8} {args.events:,} events posted at {result.events_per_second:,.0f}/s; "
            f"RSS {' / '.join(f'{v:.1f}' for v in result.memory.values())} MB",
            flush=True,
        )
    return result


# -------------------------------------------------------------------------- report


def rate(slices: list[Slice]) -> float:
    return sum(s.done for s in slices) / sum(s.window for s in slices)


def spread(slices: list[Slice]) -> str:
    rates = [s.rate for s in slices]
    return f"{min(rates):,.0f}-{max(rates):,.0f}"


def pct(slices: list[Slice], q: float) -> float:
    return Arm("pooled", [x for s in slices for x in s.latencies]).pct(q)


def server_ms(slices: list[Slice]) -> float:
    requests = sum(len(s.latencies) for s in slices)
    return sum(s.server_cpu for s in slices) / requests * 1000 if requests else float("nan")


def busy(cpu: list[float], slices: list[Slice]) -> float:
    """CPU seconds per second of wall time (1.0 = one core busy)."""
    return sum(cpu) / sum(s.window for s in slices)


def ratio(result: Result, n: int) -> tuple[float, float, float]:
    """Conditional-PUT rate / echo rate: median, min, max over the adjacent pairs."""
    puts, echoes = result.slices[(PUT, n)], result.slices[(ECHO_ARM, n)]
    return ratio_stats([(p.rate, e.rate) for p, e in zip(puts, echoes, strict=True)])


def capacity(result: Result, n: int) -> float:
    """Echo's server CPU per request / the PUT's: the rate ratio a saturated server
    would reach if it were bound by its own CPU."""
    return server_ms(result.slices[(ECHO_ARM, n)]) / server_ms(result.slices[(PUT, n)])


def table(result: Result) -> str:
    lines = [
        "| arm | clients | req/s | slice range | p50 ms | p99 ms | server CPU ms/req | "
        "server CPU busy | client CPU busy | PUT / echo, req/s | PUT / echo, server CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (arm, n), slices in result.slices.items():
        shares = " | "
        if arm == PUT:
            med, lo, hi = ratio(result, n)
            shares = f"**{med:.0%}** ({lo:.0%}-{hi:.0%}) | {capacity(result, n):.0%}"
        lines.append(
            f"| {arm} | {n} | {rate(slices):,.0f} | {spread(slices)} | "
            f"{ms(pct(slices, 0.5))} | {ms(pct(slices, 0.99))} | {server_ms(slices):.2f} | "
            f"{busy([s.server_cpu for s in slices], slices):.0%} | "
            f"{busy([s.client_cpu for s in slices], slices):.0%} | {shares} |"
        )
    lines.append(f"\n412 retries in the conditional-PUT slices: {result.retries}")
    return "\n".join(lines)


def memory_table(results: list[Result]) -> str:
    labels = list(results[0].memory)
    head = " | ".join(labels)
    lines = [
        f"| backend (VmRSS, MB) | {head} | events/s while posting |",
        "|---|" + "---:|" * (len(labels) + 1),
    ]
    for r in results:
        row = " | ".join(f"{r.memory[label]:.1f}" for label in labels)
        lines.append(f"| {r.backend} | {row} | {r.events_per_second:,.0f} |")
    return "\n".join(lines)


def goals(results: list[Result], n: int) -> str:
    out = []
    for r in results:
        if (PUT, n) not in r.slices:
            continue
        (med, lo, hi), cpu = ratio(r, n), capacity(r, n)
        out.append(
            f"- {r.backend}, {n} clients: conditional PUT / echo = {med:.1%} of the rate "
            f"(pairs {lo:.0%}-{hi:.0%}), {cpu:.1%} by server CPU per request; goal >= 40%: "
            f"{'met' if med >= GOAL else 'NOT met'} by rate, "
            f"{'met' if cpu >= GOAL else 'NOT met'} by server CPU"
        )
    return "\n".join(out)


async def main(args: argparse.Namespace) -> None:
    load = os.getloadavg()[0]
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            results.append(await bench_backend(backend, args, Path(tmp)))
    counts = [int(n) for n in args.clients.split(",")]
    pairs = max(1, round(args.duration / args.slice))
    where = (
        "each in its own room"
        if args.room_per_client
        else "all in one room, so every write also appends doc.written to that room's one log"
    )
    print("\n# HTTP: conditional PUT against an echo endpoint of the same server\n")
    print(
        f"{machine()}; load average {load:.1f} at start, {os.getloadavg()[0]:.1f} at end. "
        f"{args.duration:g} s per arm and client count, in {pairs} pairs of {args.slice:g} s "
        "slices alternating echo, PUT, PUT, echo, ...; the ratio is the median over the pairs "
        "(range in brackets); p50/p99 over every request of the cell.\n\n"
        "One uvicorn worker, built as `agentrooms serve --dev` builds it (rate limit out of "
        "reach). The client (asyncio + httpx, one keep-alive connection per client, closed "
        "loop) runs in the benchmark process and shares the cores with the server and the "
        f"store. Each PUT client writes its OWN document ({where}): the request path, not "
        "contention on a document. The echo passes the same gate (dev auth, rate bucket, "
        "body limit, JSON shape check) and router, then answers the body back: no model, no "
        "store. 'Server CPU' is user+system time of the server process (/proc/PID/stat); "
        "'PUT / echo, server CPU' is echo's server CPU per request over the PUT's, the rate "
        "ratio a CPU-bound server would reach. A client CPU near 100% means the cell is "
        "bound by the client, not the server."
    )
    for r in results:
        print(f"\n## {r.backend}\n\n{table(r)}")
    print(f"\n## server memory (VmRSS of the server process)\n\n{memory_table(results)}\n")
    print(goals(results, max(counts)))


FULL = {"duration": 5.0, "slice": 1.0, "warmup": 1.0, "events": 100_000}
QUICK = {"duration": 1.0, "slice": 0.5, "warmup": 0.5, "events": 10_000}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backends", default="sqlite,redis,postgres", help="sqlite, redis, postgres, memory"
    )
    parser.add_argument("--clients", default="8,32")
    parser.add_argument("--duration", type=float, help="seconds per arm and client count (5)")
    parser.add_argument("--slice", type=float, help="seconds per alternating slice (1)")
    parser.add_argument("--warmup", type=float, help="seconds per arm, unrecorded (1)")
    parser.add_argument("--events", type=int, help="events posted for the RSS figures (100,000)")
    parser.add_argument(
        "--room-per-client",
        action="store_true",
        help="put each client's document in a room of its own (no shared room log)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 1 s per arm, 0.5 s slices, 10,000 events"
    )
    parser.add_argument("--child-url", help=argparse.SUPPRESS)
    parser.add_argument("--child-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


if __name__ == "__main__":
    ARGS = parse()
    if ARGS.child_url is not None:
        # the server: asyncio.run like agentrooms.server.serve (its default event loop)
        asyncio.run(serve_child(ARGS.child_url, ARGS.child_port))
    else:
        try:
            asyncio.run(main(ARGS))
        except Unexpected as exc:
            raise SystemExit(f"bench http: run void: {exc}") from None
