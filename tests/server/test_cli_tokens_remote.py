"""``agentrooms tokens ... --server`` and ``agentrooms doctor --server`` against a real
``agentrooms serve`` with tokens (the fixture of test_cli_remote): a token with
``tokens:admin`` mints, lists and revokes, the minted token works and then does not; a
token cannot mint beyond its own rooms, scopes, role or expiry; ``admin`` alone is not
enough; doctor says what the server is and what the token may do."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from agentrooms.cli import EXIT_FINDING, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, app
from agentrooms.server import mint
from agentrooms.store import open_store
from tests.server.test_cli_remote import Served, ok, run, runner, served

__all__ = ["served"]  # the fixture, shared with test_cli_remote

OPERATOR_SCOPES = ["tokens:admin", "rooms:read", "plan:read", "docs:read", "docs:write"]


def _operator(served: Served, *, rooms: Any = ("ops-a", "ops-b"), ttl: float = 3600.0) -> str:
    async def go() -> str:
        store = await open_store(served.url)
        try:
            chosen = rooms if isinstance(rooms, str) else list(rooms)
            minted = await mint(
                store, "oscar", rooms=chosen, scopes=OPERATOR_SCOPES, role="ops", ttl=ttl
            )
            return minted.token
        finally:
            await store.close()

    return asyncio.run(go())


def test_mint_list_revoke_remotely_and_use_the_minted_token(served: Served) -> None:
    at = ["--server", served.base]
    operator = _operator(served)
    assert run("rooms", "create", "ops-a", *at, token=served.tokens["alice"])[0] == EXIT_OK
    code, out, err = run("tokens", "mint", "wendy", "--rooms", "ops-a", "--scopes",
                         "rooms:read,docs:read", "--ttl", "600", *at, token=operator)  # fmt: skip
    assert code == EXIT_OK, err
    heading, secret = out.strip().splitlines()
    assert heading.startswith("token id ") and heading.endswith(" for agent wendy (shown once):")
    token_id = heading.split()[2]
    assert secret.startswith(f"ar_{token_id}_")
    # the minted token works, as its agent, in its room only
    assert [r["name"] for r in ok("rooms", "list", *at, token=secret)["rooms"]] == ["ops-a"]
    listed = ok("tokens", "list", *at, token=operator)
    mine = {t["id"]: t for t in listed["tokens"]}
    assert mine[token_id]["agent"] == "wendy" and mine[token_id]["rooms"] == ["ops-a"]
    assert mine[token_id]["expires_at"] - listed["now"] <= 600
    # alice's admin token is beyond oscar's reach: not listed (and not revocable)
    assert all(t["agent"] != "alice" for t in listed["tokens"])
    assert "secret" not in json.dumps(listed) and "hash" not in json.dumps(listed)
    # the text listing: the full id, the expiry in words, at 80 columns
    narrow = runner.invoke(
        app, ["tokens", "list", *at], env={"COLUMNS": "80", "AGENTROOMS_TOKEN": operator}
    )
    code, out = narrow.exit_code, narrow.stdout
    assert code == EXIT_OK and f"{token_id}  expires in 10 min" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert run("tokens", "revoke", secret, *at, token=operator)[:2] == (EXIT_OK, "revoked\n")
    code, _, err = run("rooms", "list", *at, token=secret)
    assert code == EXIT_USAGE and err.startswith("unauthorized: token revoked")
    code, _, err = run("tokens", "revoke", token_id, *at, token=operator)
    assert code == EXIT_NOT_FOUND and err.startswith("not_found: ")
    alice_id = served.tokens["alice"].split("_")[1]
    code, _, err = run("tokens", "revoke", alice_id, *at, token=operator)
    assert code == EXIT_NOT_FOUND, err
    # the same listing, read on the store itself, shows the revoked token
    local = ok("tokens", "list", "--url", served.url)
    assert {t["id"]: t for t in local["tokens"]}[token_id]["revoked_at"] is not None


def test_a_token_cannot_mint_beyond_itself(served: Served) -> None:
    at = ["--server", served.base]
    operator = _operator(served)
    refusals = {
        ("--rooms", "*"): "rooms '*'",
        ("--rooms", "ops-a,elsewhere"): "rooms ['elsewhere']",
        ("--rooms", "ops-a", "--scopes", "admin,plan:write"): "scopes ['admin', 'plan:write']",
        ("--rooms", "ops-b", "--scopes", "docs:write", "--role", "legal"): "role 'legal'",
        ("--rooms", "ops-a", "--scopes", "docs:read", "--ttl", "7200"): "an expiry after",
    }
    for args, named in refusals.items():
        code, out, err = run("tokens", "mint", "mallory", *args, *at, token=operator)
        assert code == EXIT_USAGE and out == "", (args, out, err)
        assert err.startswith("forbidden: a token may not mint more than it holds: "), err
        assert named in err, (args, err)
    # its own role, its own scopes, its own rooms: allowed
    code, _, err = run("tokens", "mint", "olga", "--rooms", "ops-b", "--scopes",
                       "docs:write,tokens:admin", "--role", "ops", "--ttl", "60", *at,
                       token=operator)  # fmt: skip
    assert code == EXIT_OK, err
    assert all(t["agent"] != "mallory" for t in ok("tokens", "list", "--url", served.url)["tokens"])


def test_without_tokens_admin_is_forbidden_even_for_admin(served: Served) -> None:
    at = ["--server", served.base]
    for who in ("alice", "rita"):  # admin; rooms:read and docs:read
        for args in (("mint", "x", "--rooms", "r"), ("list",), ("revoke", "0" * 16)):
            code, out, err = run("tokens", *args, *at, token=served.tokens[who])
            assert code == EXIT_USAGE and out == "", (who, args, err)
            assert err.startswith("forbidden: this token lacks the 'tokens:admin' scope"), err
    response = httpx.get(f"{served.base}/v1/tokens", headers=_bearer(served.tokens["alice"]))
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "forbidden"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_doctor_remote_text_and_json(served: Served) -> None:
    at = ["--server", served.base]
    found = ok_or_finding("doctor", *at, token=served.tokens["rita"])
    assert found["server"] == served.base and found["healthz"] == "ok"
    assert found["store"]["backend"] == "sqlite" and "url" not in found["store"]
    assert served.url not in json.dumps(found)
    assert found["agent"] == "rita" and found["scopes"] == ["docs:read", "rooms:read"]
    assert found["token"]["id"] == served.tokens["rita"].split("_")[1]
    assert found["limits"]["rate"] == 50.0 and found["limits"]["max_connections"] == 1000
    code, out, err = run("doctor", *at, token=served.tokens["rita"])
    assert code in (EXIT_OK, EXIT_FINDING), err
    assert "sqlite" in out and "docs:read rooms:read" in out and "limit rate" in out
    assert f"{found['token']['id']} works, expires in 30 d" in out
    code, _, err = run("doctor", *at, token="ar_" + "0" * 16 + "_" + "0" * 64)
    assert code == EXIT_USAGE and err.startswith("unauthorized: ")


def ok_or_finding(*args: str, token: str) -> Any:
    code, out, err = run(*args, "--json", token=token)
    assert code in (EXIT_OK, EXIT_FINDING), (args, out, err)
    assert (code == EXIT_FINDING) == bool(json.loads(out)["store"]["warnings"])
    return json.loads(out)
