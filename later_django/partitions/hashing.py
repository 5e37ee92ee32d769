"""Which partition a key goes to, and which server owns a partition.

Both are pure functions of bytes, fixed forever: every process, machine and
release must agree, so neither uses Python's ``hash()`` (salted per process).

- ``partition_for_key``: Kafka's default partitioner (murmur2 of the key's
  bytes, made non-negative, modulo the partition count), so a key routes the
  same way here as through a Kafka producer. A ``str`` key is its UTF-8
  bytes, an ``int`` key its decimal digits (so ``42`` and ``"42"`` go to the
  same partition), ``bytes`` are used as they are.
- ``owner_of``: rendezvous (highest random weight) hashing over the live
  servers: each (partition, server) pair gets a score and the highest wins,
  so a server joining or leaving moves only the partitions it wins or won.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

PartitionKey = str | int | bytes

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def key_bytes(key: PartitionKey) -> bytes:
    """The bytes a partition key is hashed as (the fixed encoding)."""
    if isinstance(key, bool):
        raise TypeError("a partition key must be str, int or bytes, got bool")
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, int):
        return str(key).encode("ascii")
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise TypeError(
        f"a partition key must be str, int or bytes, got {type(key).__name__}; "
        "return one of those from partition_key()"
    )


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (32 bits, seed 0x9747b28c), as a signed 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    full = length - length % 4
    for i in range(0, full, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length % 4
    if tail == 3:
        h ^= data[full + 2] << 16
    if tail >= 2:
        h ^= data[full + 1] << 8
    if tail >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: PartitionKey, count: int) -> int:
    """The partition (0..count-1) of ``key`` in a topic of ``count`` partitions."""
    checked: object = count  # callers without type checking may pass anything
    if isinstance(checked, bool) or not isinstance(checked, int) or count < 1:
        raise ValueError(f"count must be an int >= 1, got {count!r}")
    return (murmur2(key_bytes(key)) & 0x7FFFFFFF) % count


def _score(namespace: str, topic: str, partition: int, server: str) -> int:
    text = f"{namespace}\0{topic}\0{partition}\0{server}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def owner_of(namespace: str, topic: str, partition: int, servers: Iterable[str]) -> str | None:
    """The live server that owns ``(topic, partition)``: the highest score
    (ties, which need equal 64-bit scores, go to the smaller server id)."""
    best: tuple[int, str] | None = None
    for server in servers:
        candidate = (_score(namespace, topic, partition, server), server)
        if (
            best is None
            or candidate[0] > best[0]
            or (candidate[0] == best[0] and candidate[1] < best[1])
        ):
            best = candidate
    return None if best is None else best[1]
