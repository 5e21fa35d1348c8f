"""The blocking facade is derived from the async core and cannot drift from it."""

from __future__ import annotations

import inspect
import threading
from pathlib import Path

import pytest

from agentrooms import sync
from agentrooms.commit import Change, View
from agentrooms.errors import VersionConflict
from agentrooms.store import Append, Put, Store, VersionIs


def test_every_public_coroutine_of_store_has_a_blocking_twin() -> None:
    public = {
        name
        for name, fn in inspect.getmembers(Store, inspect.iscoroutinefunction)
        if not name.startswith("_") and name != "open"
    }
    assert public - {"close"} <= set(vars(sync.SyncStore))
    assert "close" in vars(sync.SyncStore)


def bump(view: View, by: int) -> Change:
    return Change(writes=[Put("n", view.get("n", 0) + by)], result=view.get("n", 0) + by)


def test_blocking_calls_from_many_threads(tmp_path: Path) -> None:
    with sync.SyncStore.open(f"sqlite:///{tmp_path / 's.db'}") as store:
        result = store.transact("r", writes=[Put("doc", {"v": 1})], appends=[Append("e", 1)])
        with pytest.raises(VersionConflict):
            store.transact("r", [VersionIs("doc", result.versions["doc"] + 99)], [Put("doc", 2)])
        assert store.read("r", ["doc"]).value("doc") == {"v": 1}
        assert [e.data for e in store.read_log("r")] == [1]

        def worker() -> None:
            for _ in range(10):
                sync.commit(store, "r", bump, 1, keys=["n"])

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert store.read("r", ["n"]).value("n") == 40
        assert store.backend == "sqlite"
    with pytest.raises(RuntimeError, match="closed"):
        store.read("r", ["n"])
