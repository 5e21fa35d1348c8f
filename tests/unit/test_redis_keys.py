"""The Redis key layout and store URL handling: pure functions, no server needed."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from agentrooms.errors import BadRequest
from agentrooms.store.redis.keys import (
    DEFAULT_PREFIX,
    check_prefix,
    record_key,
    redact_url,
    room_keys,
    room_tag,
    set_key,
    split_url,
)


def test_layout() -> None:
    keys = room_keys("ar", "room-1")
    assert keys == (
        "ar:{ar:room-1}:m",
        "ar:{ar:room-1}:i",
        "ar:{ar:room-1}:log",
        "ar:{ar:room-1}:r:",
        "ar:{ar:room-1}:s:",
        "ar:{ar:room-1}:sets",
    )
    assert record_key("ar", "room-1", "task/t1") == "ar:{ar:room-1}:r:task/t1"
    assert set_key("ar", "room-1", "ready") == "ar:{ar:room-1}:s:ready"
    assert room_tag("ar", "room-1") == "{ar:room-1}"


@pytest.mark.parametrize("key", ["task/t1", "}", "{x}", "a}b{c}", "日本語", ":m", "r:"])
def test_every_key_of_a_room_shares_one_hash_slot(key: str) -> None:
    keys = room_keys("p:x", "room é")
    slot = key_slot(room_tag("p:x", "room é")[1:-1].encode())
    names = [*keys, record_key("p:x", "room é", key), set_key("p:x", "room é", key)]
    assert {key_slot(name.encode()) for name in names} == {slot}
    assert all(name.startswith("p:x:") for name in names)  # SCAN MATCH <prefix>* finds them


def test_records_never_collide_with_room_keys_or_other_rooms() -> None:
    a, b = room_keys("ar", "a"), room_keys("ar", "a:b")
    own = {a.meta, a.scan, a.log, a.sets}
    for name in ("m", "i", "log", "sets", "ets", "s:x", "r:x", ""):
        assert record_key("ar", "a", name) not in own
        assert set_key("ar", "a", name) not in own
        assert set_key("ar", "a", name) != record_key("ar", "a", name)
    # a set and a record of the same name, or named like each other's keys, never meet
    assert not set_key("ar", "a", "x").startswith(a.record)
    assert not record_key("ar", "a", "x").startswith(a.set)
    assert not a.sets.startswith(a.set) and not a.sets.startswith(a.record)
    # a room named like another room plus a suffix has its own tag
    assert not record_key("ar", "a:b", "k").startswith(a.record)
    # and so does a prefix that looks like prefix + room
    assert not room_keys("ar:a", "b").meta.startswith(b.meta[:-1])
    assert room_keys("ar:a", "b").meta != b.meta


def test_split_url_takes_our_prefix_and_keeps_the_rest_verbatim() -> None:
    assert split_url("redis://h:6379/0") == ("redis://h:6379/0", DEFAULT_PREFIX)
    assert split_url("redis://h/0?prefix=t1") == ("redis://h/0", "t1")
    assert split_url("rediss://h/0?socket_timeout=2&prefix=a%3Ab&ssl_cert_reqs=none") == (
        "rediss://h/0?socket_timeout=2&ssl_cert_reqs=none",
        "a:b",
    )
    assert split_url("redis://h/0?db=3&x=%2520") == ("redis://h/0?db=3&x=%2520", "ar")


@pytest.mark.parametrize(
    "url",
    [
        "redis://h/0?prefix=",
        "redis://h/0?prefix=a{b",
        "redis://h/0?prefix=a%7Db",
        "redis://h/0?prefix=a%20b",
        "redis://h/0?prefix=a%00b",
        "redis://h/0?prefix=" + "x" * 101,
        "redis://h/0?prefix=a&prefix=b",
    ],
)
def test_bad_prefixes(url: str) -> None:
    with pytest.raises(BadRequest):
        split_url(url)


def test_check_prefix_accepts_ordinary_names() -> None:
    assert check_prefix("artest-0123abcd") == "artest-0123abcd"
    assert check_prefix("team:prod") == "team:prod"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0?prefix=x", "redis://127.0.0.1:6379/0?prefix=x"),
        ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://user:p%40ss:w@h/0?prefix=x", "rediss://user:***@h/0?prefix=x"),
        ("redis://user@h/0", "redis://user@h/0"),
        ("redis://h/0?password=s3cret&prefix=x", "redis://h/0?password=***&prefix=x"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "s3cret" not in redact_url(url)
