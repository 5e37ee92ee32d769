"""partition_for_key and rendezvous ownership: pure functions, fixed forever."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from later_django.partitions.hashing import key_bytes, murmur2, owner_of, partition_for_key

# Kafka's own murmur2 test vectors (the Java client's UtilsTest).
KAFKA_MURMUR2 = [
    ("21", -973932308),
    ("foobar", -790332482),
    ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    ("abc", 479470107),
]

# Partitions as this release assigns them. They must never change: a changed
# value would send a key's new jobs to another partition than its queued ones.
GOLDEN = [
    ("customer-42", 8, 1),
    ("a", 8, 4),
    ("", 8, 1),
    ("ünïcode", 8, 5),
    (0, 16, 4),
    (1, 16, 15),
    (42, 16, 12),
    (-7, 16, 11),
    (2**40, 16, 0),
    (b"", 3, 0),
    (b"\x00\xff", 3, 1),
    (b"customer-42", 3, 0),
]


@pytest.mark.parametrize(("text", "expected"), KAFKA_MURMUR2)
def test_murmur2_is_kafkas(text, expected):
    assert murmur2(text.encode()) == expected


@pytest.mark.parametrize(("key", "count", "expected"), GOLDEN)
def test_partition_for_key_golden_values(key, count, expected):
    assert partition_for_key(key, count) == expected


def test_a_key_routes_the_same_in_another_process_with_another_hash_seed():
    keys = ["customer-42", "ünïcode", 42, b"\x00\xff"]
    code = (
        "from later_django.partitions.hashing import partition_for_key as p; "
        f"print([p(k, 7) for k in {keys!r}])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str([partition_for_key(k, 7) for k in keys])


def test_int_keys_route_like_their_decimal_string_and_str_like_its_utf8_bytes():
    for key in (0, 7, 123456789, -3):
        assert partition_for_key(key, 13) == partition_for_key(str(key), 13)
    assert partition_for_key("ünïcode", 13) == partition_for_key("ünïcode".encode(), 13)


def test_keys_spread_over_every_partition():
    counts = Counter(partition_for_key(f"customer-{n}", 8) for n in range(8000))
    assert sorted(counts) == list(range(8))
    assert min(counts.values()) > 800  # 1,000 each when perfectly even


@pytest.mark.parametrize("key", [1.5, None, True, ["a"]])
def test_what_is_no_partition_key_is_refused(key):
    with pytest.raises(TypeError, match="partition key must be str, int or bytes"):
        key_bytes(key)


@pytest.mark.parametrize("count", [0, -1, 1.0, True])
def test_a_partition_count_below_one_is_refused(count):
    with pytest.raises(ValueError, match="count must be an int >= 1"):
        partition_for_key("k", count)


def test_a_joining_server_takes_only_partitions_it_wins():
    servers = [f"server-{n}" for n in range(4)]
    before = {p: owner_of("default", "orders", p, servers) for p in range(256)}
    after = {p: owner_of("default", "orders", p, [*servers, "server-new"]) for p in range(256)}
    moved = {p for p in before if before[p] != after[p]}
    assert moved and all(after[p] == "server-new" for p in moved)
    assert 20 < len(moved) < 90  # about a fifth of 256
    # ... and a leaving server gives up only its own.
    gone = {p: owner_of("default", "orders", p, servers[1:]) for p in range(256)}
    assert all(before[p] == "server-0" for p in before if before[p] != gone[p])


def test_ownership_ignores_the_order_servers_are_listed_in_and_needs_one():
    servers = ["a", "b", "c"]
    for p in range(32):
        assert owner_of("ns", "t", p, servers) == owner_of("ns", "t", p, reversed(servers))
    assert owner_of("ns", "t", 0, []) is None
