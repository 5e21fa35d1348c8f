"""N writers on ONE record through ``commit``: backoff policies side by side.

Every writer increments one shared counter through the commit loop (read, transition,
conditional write, back off on conflict) for a fixed time; the counter must end equal to
the number of acknowledged commits (zero lost updates, checked every cell).

Reported per backend, policy and writer count: goodput (commits/s), conflict rate
(conflicts per write attempt), p50/p99 commit latency, write attempts per commit,
transitions per commit and store calls per commit (reads + conditional writes).

Writers share a store handle eight to one, as agents hosted eight to a process would.
The library's policies take *local turns* on a key once it has conflicted (writers of
one process queue for it in the process and meet other processes in the store as one
writer); the ``-noturns`` variants switch that off, so every writer contends with every
other in the store, as separate processes each holding one writer would. ``none`` is
the naive loop: no backoff, no turns.

    python3 dev.py bench commit [--writers 1,2,4,8,16,32,64] [--duration 2]
        [--repetitions 1] [--backends sqlite,redis,postgres]
        [--policies none,exponential,full,...] [--plot BENCHMARKS-commit.png] [--base 32]
        [--rounds 5]

With ``--repetitions R`` the writer sweep runs R times back to back; the goal figures
(goodput at the most writers against the peak, jitter against exponential) are computed
within each sweep and given as the median with every run's figure.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentrooms.commit import Change, CommitOptions, View, commit
from agentrooms.errors import ContentionExhausted
from agentrooms.retry import (
    DEFAULT_BASE,
    Backoff,
    Decorrelated,
    Exponential,
    FullJitter,
    NoBackoff,
    RetryPolicy,
)
from agentrooms.store import Put, Store, open_store
from common import machine, ms, store_url, unique

BASE, CAP = DEFAULT_BASE, 0.25  # the library's base (--base); a shorter cap than its 0.5 s
ROUNDS = 5  # bursts per policy (--rounds)
BACKOFFS: dict[str, Callable[[], Backoff]] = {
    "none": NoBackoff,
    "exponential": lambda: Exponential(BASE, CAP),
    "full": lambda: FullJitter(BASE, CAP),
    "decorrelated": lambda: Decorrelated(BASE, CAP),
}


def retry_policy(name: str, budget: float) -> RetryPolicy:
    """``full`` = full jitter with local turns (the library default); ``full-noturns``
    without them; ``none`` = immediate retry without turns (the naive loop)."""
    backoff = name.removesuffix("-noturns")
    turns = not name.endswith("-noturns") and backoff != "none"
    return RetryPolicy(
        max_attempts=10_000, budget=budget, backoff=BACKOFFS[backoff](), local_turns=turns
    )


@dataclass
class Cell:
    backend: str
    policy: str
    writers: int
    rep: int = 0
    commits: int = 0
    attempts: int = 0
    transitions: int = 0
    exhausted: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        return self.commits / self.elapsed if self.elapsed else 0.0

    @property
    def conflict_rate(self) -> float:
        return (self.attempts - self.commits) / self.attempts if self.attempts else 0.0

    def per_commit(self, n: int) -> float:
        return n / self.commits if self.commits else float("nan")

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def increment(view: View, _: None) -> Change:
    return Change(writes=[Put("counter", view.get("counter", 0) + 1)])


async def run_cell(stores: list[Store], cell: Cell, duration: float) -> None:
    room = unique("commitbench")
    policy = retry_policy(cell.policy, 30.0)
    stop = time.perf_counter() + duration

    async def writer(store: Store) -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            try:
                result = await commit(
                    store,
                    room,
                    increment,
                    None,
                    keys=["counter"],
                    options=CommitOptions(policy=policy),
                )
            except ContentionExhausted as exc:
                cell.exhausted += 1
                cell.attempts += exc.attempts
                continue
            cell.latencies.append(time.perf_counter() - t0)
            cell.commits += 1
            cell.attempts += result.attempts
            cell.transitions += result.transitions

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(stores[i % len(stores)]) for i in range(cell.writers)))
    cell.elapsed = time.perf_counter() - t0
    final = (await stores[0].read(room, ["counter"])).value("counter", 0)
    if final != cell.commits:
        raise SystemExit(f"LOST UPDATE: counter {final} != {cell.commits} acknowledged commits")


@dataclass
class Burst:
    """AWS's "Exponential Backoff and Jitter" setting: N writers start at once and each
    must commit once; total write attempts and time until the last one is done."""

    backend: str
    policy: str
    writers: int
    attempts: list[int] = field(default_factory=list)  # per round
    seconds: list[float] = field(default_factory=list)


async def run_burst(stores: list[Store], burst: Burst, rounds: int) -> None:
    policy = retry_policy(burst.policy, 60.0)
    for _ in range(rounds):
        room = unique("burst")
        barrier = asyncio.Barrier(burst.writers)

        async def writer(store: Store, room: str = room, barrier: asyncio.Barrier = barrier) -> int:
            await barrier.wait()
            result = await commit(
                store, room, increment, None, keys=["counter"], options=CommitOptions(policy=policy)
            )
            return result.attempts

        t0 = time.perf_counter()
        attempts = await asyncio.gather(
            *(writer(stores[i % len(stores)]) for i in range(burst.writers))
        )
        burst.seconds.append(time.perf_counter() - t0)
        burst.attempts.append(sum(attempts))
        final = (await stores[0].read(room, ["counter"])).value("counter", 0)
        if final != burst.writers:
            raise SystemExit(f"LOST UPDATE in burst: {final} != {burst.writers}")


async def open_many(url: str, n: int) -> list[Store]:
    if url.startswith("memory:"):
        return [await open_store(url)]  # one process-private store
    return [await open_store(url) for _ in range(n)]


async def bench_backend(
    name: str,
    url: str,
    writers: list[int],
    policies: list[str],
    duration: float,
    bursts: list[Burst],
    rep: int = 0,
) -> list[Cell]:
    cells: list[Cell] = []
    # one store handle (connection pool) per 8 writers, as separate agents would have
    stores = await open_many(url, max(1, max(writers) // 8))
    try:
        for policy in policies if rep == 0 else []:
            burst = Burst(name, policy, max(writers))
            await run_burst(stores, burst, rounds=ROUNDS)
            bursts.append(burst)
            print(
                f"  {name:8} {policy:12} burst of {burst.writers}: "
                f"{statistics.median(burst.attempts) / burst.writers:.2f} attempts per writer, "
                f"all done in {statistics.median(burst.seconds) * 1000:.0f} ms",
                flush=True,
            )
        for n in writers:
            for policy in policies:
                cell = Cell(name, policy, n, rep)
                await run_cell(stores, cell, duration)
                cells.append(cell)
                print(
                    f"  {name:8} {policy:12} N={n:<3} {cell.goodput:8.0f}/s "
                    f"conflicts {cell.conflict_rate:5.1%} attempts/commit "
                    f"{cell.per_commit(cell.attempts):5.2f} p99 {ms(cell.pct(0.99))} ms",
                    flush=True,
                )
    finally:
        for s in stores:
            await s.close()
    return cells


def burst_table(bursts: list[Burst]) -> str:
    lines = [
        f"| backend | policy | writers | write attempts per writer (median of {ROUNDS}) | "
        "all done in ms (median) |",
        "|---|---|---:|---:|---:|",
    ]
    for b in bursts:
        lines.append(
            f"| {b.backend} | {b.policy} | {b.writers} | "
            f"{statistics.median(b.attempts) / b.writers:.2f} | "
            f"{statistics.median(b.seconds) * 1000:.0f} |"
        )
    out = "\n".join(lines)
    for backend in dict.fromkeys(b.backend for b in bursts):
        by = {b.policy: b for b in bursts if b.backend == backend}
        for turns in ("", "-noturns"):
            if f"exponential{turns}" in by and f"full{turns}" in by:
                exp = statistics.median(by[f"exponential{turns}"].attempts)
                full = statistics.median(by[f"full{turns}"].attempts)
                out += (
                    f"\n- {backend}{turns}: full jitter sends {1 - full / exp:.0%} fewer write "
                    f"attempts than un-jittered exponential backoff for a burst of "
                    f"{by[f'full{turns}'].writers}"
                )
    return out


def table(cells: list[Cell]) -> str:
    lines = [
        "| backend | policy | N | commits/s | conflict rate | p50 ms | p99 ms | "
        "attempts/commit | transitions/commit | store calls/commit |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    several = len({c.rep for c in cells}) > 1
    if several:  # one more column: the repetition
        lines = [lines[0].replace("| N |", "| N | run |"), lines[1] + "---:|"]
    for c in cells:
        run = f" {c.rep + 1} |" if several else ""
        lines.append(
            f"| {c.backend} | {c.policy} | {c.writers} |{run} {c.goodput:,.0f} | "
            f"{c.conflict_rate:.1%} | {ms(c.pct(0.5))} | {ms(c.pct(0.99))} | "
            f"{c.per_commit(c.attempts):.2f} | {c.per_commit(c.transitions):.2f} | "
            f"{c.per_commit(c.attempts + c.transitions):.2f} |"
        )
    return "\n".join(lines)


def _spread(values: list[float], fmt: str = "{:.0%}") -> str:
    """The median, and the range over repetitions when there are several."""
    median = fmt.format(statistics.median(values))
    if len(values) == 1:
        return median
    return f"{median} (runs: {', '.join(fmt.format(v) for v in values)})"


def goals(cells: list[Cell]) -> str:
    """The issue's goal figures, computed within each repetition (a writer sweep run
    back to back), then summarised over the repetitions."""
    out = []
    reps = sorted({c.rep for c in cells})
    for backend in dict.fromkeys(c.backend for c in cells):
        mine = [c for c in cells if c.backend == backend]
        for policy in dict.fromkeys(c.policy for c in mine):
            shares, at16 = [], []
            for rep in reps:
                row = [c for c in mine if c.policy == policy and c.rep == rep]
                if not row:
                    continue
                last = max(row, key=lambda c: c.writers)
                shares.append(last.goodput / max(c.goodput for c in row))
                at16 += [c.per_commit(c.attempts) for c in row if c.writers == 16]
            line = f"- {backend} / {policy}: goodput at the most writers is "
            line += f"{_spread(shares)} of the peak over N"
            if at16:
                line += f"; write attempts per commit at N=16: {_spread(at16, '{:.2f}')}"
            out.append(line)
        for turns in ("", "-noturns"):
            saved = []
            for rep in reps:
                at64 = {c.policy: c for c in mine if c.writers == 64 and c.rep == rep}
                exp, full = at64.get(f"exponential{turns}"), at64.get(f"full{turns}")
                if exp and full:
                    saved.append(1 - full.per_commit(full.attempts) / exp.per_commit(exp.attempts))
            if saved:
                out.append(
                    f"- {backend}{turns}: full jitter sends {_spread(saved)} fewer write "
                    "attempts per commit than un-jittered exponential backoff at N=64"
                )
    return "\n".join(out)


def plot(cells: list[Cell], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = list(dict.fromkeys(c.backend for c in cells))
    fig, axes = plt.subplots(2, len(backends), figsize=(5 * len(backends), 7), squeeze=False)
    for col, backend in enumerate(backends):
        for policy in dict.fromkeys(c.policy for c in cells):
            row = [c for c in cells if c.backend == backend and c.policy == policy and c.rep == 0]
            xs = [c.writers for c in row]
            axes[0][col].plot(xs, [c.goodput for c in row], marker="o", label=policy)
            axes[1][col].plot(xs, [c.per_commit(c.attempts) for c in row], marker="o", label=policy)
        axes[0][col].set_title(f"{backend}: goodput (commits/s)")
        axes[1][col].set_title(f"{backend}: write attempts per commit")
        axes[1][col].set_yscale("log", base=2)
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("writers on one record")
            ax.grid(alpha=0.3)
        axes[0][col].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writers", default="1,2,4,8,16,32,64")
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument(
        "--repetitions", type=int, default=1, help="writer sweeps per backend, back to back"
    )
    parser.add_argument("--backends", default="sqlite,redis,postgres")
    parser.add_argument(
        "--policies",
        default="none,exponential,full,decorrelated,exponential-noturns,full-noturns",
    )
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument(
        "--rounds", type=int, default=5, help="bursts per policy (the median is reported)"
    )
    parser.add_argument(
        "--base",
        type=float,
        default=DEFAULT_BASE * 1000,
        help=f"the backoffs' base delay in ms (the library's default: {DEFAULT_BASE * 1000:g})",
    )
    args = parser.parse_args()
    global BASE, ROUNDS
    BASE, ROUNDS = args.base / 1000, args.rounds
    writers = [int(n) for n in args.writers.split(",")]
    policies = args.policies.split(",")
    cells: list[Cell] = []
    bursts: list[Burst] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            async with store_url(backend, Path(tmp), "commit") as url:
                for rep in range(args.repetitions):
                    cells += await bench_backend(
                        backend, url, writers, policies, args.duration, bursts, rep
                    )
    print(
        f"\n# commit on one record: backoff policies\n\n{machine()}; {args.duration}s per cell; "
        f"backoff base {args.base:g} ms, cap {CAP * 1000:g} ms\n"
    )
    print(table(cells))
    print()
    print(goals(cells))
    print()
    print(burst_table(bursts))
    if args.plot:
        plot(cells, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    asyncio.run(main())
