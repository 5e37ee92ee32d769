"""The retained log's value types and the checks every call makes on its
input before it writes anything."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from later_django.clock import to_datetime
from later_django.conf import conf
from later_django.db.rows import StoredRecord

TOPIC_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
MAX_PARTITIONS = 10_000
MAX_READ_LIMIT = 10_000
MAX_NAME = 100  # characters of a group or member name


@dataclass(frozen=True, slots=True)
class Record:
    """One record as read back: its offset in ``partition``, its key (a str
    key comes back as its UTF-8 bytes), its value and when it was appended
    (on the database's clock)."""

    offset: int
    key: bytes
    value: bytes
    appended_at: dt.datetime
    partition: int


def to_record(stored: StoredRecord, partition: int) -> Record:
    return Record(
        stored.offset, stored.key, stored.value, to_datetime(stored.appended_ms), partition
    )


def check_topic_name(name: object) -> str:
    if not isinstance(name, str) or not TOPIC_NAME.match(name):
        raise ValueError(
            f"topic {name!r} is not a valid topic name; use 1-100 characters of "
            "letters, digits, '_', '-' or '.'"
        )
    return name


def key_bytes(key: object, where: str = "key") -> bytes:
    """A record key as stored: str keys as UTF-8, bytes as they are."""
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise TypeError(
        f"{where} must be str or bytes, got {type(key).__name__}; "
        "pass str(...) or the key's bytes (it picks the partition)"
    )


def value_bytes(value: object, where: str = "value") -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(
            f"{where} must be bytes, got {type(value).__name__}; encode it first "
            "(json.dumps(...).encode(), msgpack, ...)"
        )
    data = bytes(value)
    limit = conf.MAX_PAYLOAD_BYTES
    if len(data) > limit:
        raise ValueError(
            f"{where} is {len(data)} bytes, more than LATER['MAX_PAYLOAD_BYTES'] "
            f"({limit}); store large values elsewhere and append a reference"
        )
    return data


def check_count(value: object, name: str, *, low: int, high: int | None = None) -> int:
    """An int argument within low..high, else a ValueError/TypeError naming it."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} is {value}; it must be {bound}")
    return value


def check_name(value: object, name: str) -> str:
    """A group or member name: 1-100 characters."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME:
        raise ValueError(f"{name} is {value!r}; it must be a string of 1 to {MAX_NAME} characters")
    return value
