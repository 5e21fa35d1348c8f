"""The IO-free parts of the server: entity tags and preconditions, the token bucket,
the JSON shape check, token strings, the partition rule."""

from __future__ import annotations

import pytest

from agentrooms.errors import BadRequest, Unauthorized
from agentrooms.server.auth import Principal, parse_bearer, parse_token
from agentrooms.server.conditional import ANY, Expect, decide, parse_tags
from agentrooms.server.limits import HttpLimits, RateLimiter, parse_json


def test_parse_tags() -> None:
    assert parse_tags(None, "If-Match") is None
    assert parse_tags(" * ", "If-Match") == ANY
    tags = parse_tags('"1", W/"2" ,"a,b"', "If-Match")
    assert tags is not None
    assert tags.strong == {"1", "a,b"} and tags.weak == {"2"}
    assert parse_tags('"17"', "If-Match") is not None
    assert parse_tags('"17"', "If-Match").single_version() == 17  # type: ignore[union-attr]
    assert parse_tags('W/"17"', "If-Match").single_version() is None  # type: ignore[union-attr]
    for bad in ("17", '"1" "2"', '"unterminated', "", ",", 'W/ "1"'):
        with pytest.raises(BadRequest):
            parse_tags(bad, "If-Match")


def test_decide_follows_rfc_9110_order() -> None:
    strong = parse_tags('"3"', "If-Match")
    weak = parse_tags('W/"3"', "If-Match")
    assert decide(3, strong, None) == Expect(version=3)
    assert decide(4, strong, None) is None
    assert decide(3, weak, None) is None  # If-Match compares strongly
    assert decide(None, ANY, None) is None
    assert decide(5, ANY, None) == Expect(version=5)
    assert decide(None, None, ANY) == Expect(absent=True)
    assert decide(2, None, ANY) is None
    assert decide(3, None, weak) is None  # If-None-Match compares weakly
    assert decide(4, None, weak) == Expect(version=4)


def test_token_bucket() -> None:
    now = [0.0]
    bucket = RateLimiter(rate=2.0, burst=3, clock=lambda: now[0])
    assert [bucket.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take("a") == pytest.approx(0.5)
    assert bucket.take("b") == 0.0  # per agent
    now[0] += 0.5
    assert bucket.take("a") == 0.0
    assert bucket.take("a") == pytest.approx(0.5)
    now[0] += 100
    assert [bucket.take("a") for _ in range(4)][-1] > 0  # refills only up to the burst


def test_the_bucket_table_is_bounded() -> None:
    bucket = RateLimiter(rate=1.0, burst=1, clock=lambda: 0.0, max_agents=2)
    for agent in ("a", "b", "c"):
        bucket.take(agent)
    assert bucket.take("a") == 0.0  # "a" was dropped and came back with a full bucket
    assert bucket.take("c") > 0


def test_parse_json() -> None:
    limits = HttpLimits(max_json_depth=3, max_string_bytes=4, max_items=2)
    assert parse_json(b'{"a": [1, "xy"]}', limits) == {"a": [1, "xy"]}
    for bad in (b"[[[[1]]]]", b'"12345"', b'{"toolong": 1}', b"[1, 2, 3]", b"NaN", b"\xff"):
        with pytest.raises(BadRequest):
            parse_json(bad, limits)


def test_token_strings() -> None:
    good = "ar_" + "0" * 16 + "_" + "a" * 64
    assert parse_token(good) == ("0" * 16, "a" * 64)
    assert parse_bearer(f"Bearer {good}") == parse_token(good)
    assert parse_bearer(f"bearer   {good} ") == parse_token(good)
    for bad in (None, "", "Bearer", f"Basic {good}", "Bearer ar_x_y", f"Bearer {good}0"):
        with pytest.raises(Unauthorized):
            parse_bearer(bad)


def test_partition_rule() -> None:
    writer = Principal("a", None, frozenset({"docs:write"}), "writer")
    assert writer.may_write_doc("writer/x")
    assert not writer.may_write_doc("reader/x")
    assert not writer.may_write_doc("x")
    reader = Principal("a", None, frozenset({"docs:read"}), "writer")
    assert not reader.may_write_doc("writer/x")
    admin = Principal("a", None, frozenset({"admin"}), None)
    assert admin.may_write_doc("x") and admin.may_write_doc("reader/x")
    scoped = Principal("a", frozenset({"r1"}), frozenset({"admin"}), None)
    assert scoped.may_enter("r1") and not scoped.may_enter("r2")
