"""Property: any interleaving of concurrent commands leaves the state that a serial
order of the committed commands would leave, and no command applies twice.

Commands move money between accounts (a transfer that would overdraw is an invalid
transition). Each runs through ``commit`` concurrently with the others; Hypothesis picks
the commands and the delays that interleave them. The log's order is the commit order:
replaying the committed commands in that order on a plain-Python model must give
exactly the final store state.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrooms.commit import Change, CommitOptions, View, commit
from agentrooms.errors import InvalidTransition
from agentrooms.retry import FullJitter, RetryPolicy
from agentrooms.store import Append, Compare, Put
from tests.conftest import Backend
from tests.helpers import Interposed

ACCOUNTS = ["acct/a", "acct/b", "acct/c"]
START = {"acct/a": 10, "acct/b": 10, "acct/c": 0}
POLICY = RetryPolicy(max_attempts=200, budget=60, backoff=FullJitter(base=0.0005, cap=0.01))


@dataclass(frozen=True)
class Transfer:
    source: str
    target: str
    amount: int


def apply_model(state: dict[str, int], t: Transfer) -> bool:
    if state[t.source] < t.amount:
        return False
    state[t.source] -= t.amount
    state[t.target] += t.amount
    return True


def transfer(view: View, event: dict[str, object]) -> Change:
    source, target, amount = str(event["source"]), str(event["target"]), event["amount"]
    assert isinstance(amount, int)
    balance = view.get(source)
    if balance < amount:
        raise InvalidTransition(f"{source} has {balance}, cannot send {amount}")
    writes = [Put(source, balance - amount)]
    if target != source:
        writes.append(Put(target, view.get(target) + amount))
    else:
        writes = [Put(source, balance)]
    return Change(writes=writes, appends=[Append("transfer", event)], result=event["id"])


transfers = st.builds(
    Transfer, st.sampled_from(ACCOUNTS), st.sampled_from(ACCOUNTS), st.integers(1, 8)
)


async def run_history(backend: Backend, commands: list[Transfer], delays: list[float]) -> None:
    store = await backend.open()
    room = f"prop-{uuid.uuid4().hex[:10]}"
    try:
        await store.transact(room, writes=[Put(k, v) for k, v in START.items()])
        jitter = iter(delays * (len(commands) * 50))

        async def wait(n: int, compares: list[Compare]) -> None:
            await asyncio.sleep(next(jitter, 0.0))

        wrapped = Interposed(store, before=wait)
        ids = [f"c{i}" for i in range(len(commands))]

        async def send(i: int, t: Transfer) -> str | None:
            event = {"id": ids[i], "source": t.source, "target": t.target, "amount": t.amount}
            try:
                r = await commit(
                    wrapped,
                    room,
                    transfer,
                    event,
                    keys=ACCOUNTS,
                    command_id=ids[i],
                    options=CommitOptions(policy=POLICY),
                )
            except InvalidTransition:
                return None
            assert r.result == ids[i]
            return ids[i]

        committed = [
            c for c in await asyncio.gather(*(send(i, t) for i, t in enumerate(commands))) if c
        ]
        log = await store.read_log(room, 0, 10_000)
        order = [e.data["id"] for e in log]
        assert sorted(order) == sorted(committed)  # every success logged, exactly once
        assert len(set(order)) == len(order)
        model = dict(START)
        for cid in order:
            assert apply_model(model, commands[ids.index(cid)]), (
                "log order is not a valid serial order"
            )
        snap = await store.read(room, ACCOUNTS)
        assert {k: snap.value(k) for k in ACCOUNTS} == model
        assert sum(model.values()) == sum(START.values())
    finally:
        await store.close()


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    commands=st.lists(transfers, min_size=1, max_size=10),
    delays=st.lists(st.sampled_from([0.0, 0.0, 0.0005, 0.002]), min_size=1, max_size=8),
)
def test_interleavings_match_a_serial_order(
    backend: Backend, commands: list[Transfer], delays: list[float]
) -> None:
    asyncio.run(run_history(backend, commands, delays))
