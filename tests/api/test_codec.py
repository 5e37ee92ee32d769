"""The payload codec: every supported value type survives encode/decode unchanged."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from dataclasses import dataclass, field
from decimal import Decimal

import msgpack
import pytest
from hypothesis import assume, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from later_django import codec
from tests.jobapp.jobs import Item, Noop, Order

INT64_MIN, UINT64_MAX = -(1 << 63), (1 << 64) - 1


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Mood(enum.StrEnum):
    CALM = "calm"
    BUSY = "busy"


class Rank(enum.Enum):
    FIRST = 1
    SECOND = 2


class Size(enum.IntEnum):
    SMALL = 1
    HUGE = 1 << 40


@dataclass
class Leaf:
    text: str
    number: int
    ratio: float
    flag: bool
    nothing: None
    raw: bytes
    when: dt.datetime
    day: dt.date
    amount: Decimal
    uid: uuid.UUID
    color: Color
    mood: Mood
    rank: Rank
    size: Size
    maybe: int | None = None


@dataclass
class Tree:
    leaf: Leaf
    leaves: list[Leaf]
    by_name: dict[str, Leaf]
    by_number: dict[int, list[int]]
    pair: tuple[str, int]
    many: tuple[float, ...]
    children: list[Tree] = field(default_factory=list)
    optional: Leaf | None = None


@dataclass
class Holder:
    """A dataclass with one field of any type, to probe unsupported values."""

    value: object


@dataclass
class WithDefaults:
    required: int
    plain_default: str = "plain"
    factory_default: list[int] = field(default_factory=lambda: [1, 2])


ints64 = st.integers(min_value=INT64_MIN, max_value=UINT64_MAX)
floats = st.floats(allow_nan=False)
offsets = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
    lambda minutes: dt.timezone(dt.timedelta(minutes=minutes))
)
aware_datetimes = st.builds(lambda naive, tz: naive.replace(tzinfo=tz), st.datetimes(), offsets)
decimals = st.decimals(allow_nan=False, allow_infinity=False)

leaves = st.builds(
    Leaf,
    text=st.text(),
    number=ints64,
    ratio=floats,
    flag=st.booleans(),
    nothing=st.none(),
    raw=st.binary(),
    when=aware_datetimes,
    day=st.dates(),
    amount=decimals,
    uid=st.uuids(),
    color=st.sampled_from(Color),
    mood=st.sampled_from(Mood),
    rank=st.sampled_from(Rank),
    size=st.sampled_from(Size),
    maybe=st.none() | ints64,
)


def _trees(children: st.SearchStrategy[list[Tree]]) -> st.SearchStrategy[Tree]:
    return st.builds(
        Tree,
        leaf=leaves,
        leaves=st.lists(leaves, max_size=3),
        by_name=st.dictionaries(st.text(max_size=8), leaves, max_size=3),
        by_number=st.dictionaries(ints64, st.lists(ints64, max_size=4), max_size=4),
        pair=st.tuples(st.text(), ints64),
        many=st.lists(floats, max_size=4).map(tuple),
        children=children,
        optional=st.none() | leaves,
    )


trees = st.deferred(lambda: _trees(st.just([])) | _trees(st.lists(trees, max_size=2)))


def _same_offsets(original: object, decoded: object) -> None:
    """Walk two equal values and check every datetime kept its UTC offset."""
    if isinstance(original, dt.datetime):
        assert isinstance(decoded, dt.datetime)
        assert decoded.utcoffset() == original.utcoffset()
    elif dataclasses.is_dataclass(original):
        for f in dataclasses.fields(original):
            _same_offsets(getattr(original, f.name), getattr(decoded, f.name))
    elif isinstance(original, (list, tuple)):
        for a, b in zip(original, decoded, strict=True):  # type: ignore[call-overload]
            _same_offsets(a, b)
    elif isinstance(original, dict):
        for key, value in original.items():
            _same_offsets(value, decoded[key])  # type: ignore[index]


@hypothesis_settings(deadline=None, max_examples=150)
@given(trees)
def test_codec_round_trips_nested_dataclasses(tree):
    """Any tree of supported values decodes equal to the original, offsets kept."""
    decoded = codec.decode(codec.encode(tree), Tree)
    assert decoded == tree
    assert type(decoded.leaf.color) is Color and type(decoded.leaf.size) is Size
    _same_offsets(tree, decoded)


@hypothesis_settings(deadline=None)
@given(leaves)
def test_codec_round_trips_every_leaf_type(leaf):
    """Each supported scalar comes back as the same type and value."""
    decoded = codec.decode(codec.encode(leaf), Leaf)
    assert decoded == leaf
    for f in dataclasses.fields(Leaf):
        assert type(getattr(decoded, f.name)) is type(getattr(leaf, f.name)), f.name


@pytest.mark.parametrize(
    "when",
    [
        dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-1))),
        dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=1))),
        dt.datetime(2024, 3, 31, 2, 30, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=45))),
    ],
    ids=["max-minus-1h", "min-plus-1h", "kathmandu"],
)
def test_codec_round_trips_datetimes_at_the_range_edges(when):
    """An aware datetime whose UTC instant is outside datetime's range still decodes."""
    leaf = Holder(value=when)
    decoded = codec.decode(codec.encode(leaf), Holder)
    assert decoded.value == when
    assert decoded.value.utcoffset() == when.utcoffset()


@pytest.mark.parametrize("value", [INT64_MIN, UINT64_MAX, 0, -1])
def test_codec_accepts_ints_at_the_64_bit_bounds(value):
    """The smallest int64 and the largest uint64 round-trip."""
    assert codec.decode(codec.encode(Noop(n=value)), Noop) == Noop(n=value)


@pytest.mark.parametrize(
    "payload",
    [
        Noop(n=UINT64_MAX + 1),
        Noop(n=INT64_MIN - 1),
        Holder(value=[1, 2, 1 << 70]),
        Holder(value={1 << 64: "key too large"}),
        Holder(value={INT64_MIN - 1: "key too small"}),
    ],
    ids=["uint64-plus-1", "int64-minus-1", "in-a-list", "dict-key-high", "dict-key-low"],
)
def test_codec_refuses_ints_beyond_64_bits(payload):
    """An int that does not fit in 64 bits, anywhere in the payload, is a TypeError."""
    with pytest.raises(TypeError, match="64 bits"):
        codec.encode(payload)


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        ({1, 2}, "payload.value", "set"),
        (object(), "payload.value", "object"),
        (dt.datetime(2024, 1, 1), "payload.value", "naive datetime"),
        ([1, {"x": frozenset()}], "payload.value[1]['x']", "frozenset"),
        ({(1, 2): "tuple key"}, "payload.value", "dict key"),
        ({True: "bool key"}, "payload.value", "dict key"),
        (bytearray(b"x"), "payload.value", "bytearray"),
        (dt.time(12, 0), "payload.value", "time"),
    ],
    ids=[
        "set",
        "object",
        "naive-datetime",
        "nested-frozenset",
        "tuple-key",
        "bool-key",
        "bytearray",
        "time",
    ],
)
def test_codec_names_the_unsupported_value(value, path, problem):
    """An unsupported value raises TypeError naming its path and what it is."""
    with pytest.raises(TypeError) as info:
        codec.encode(Holder(value=value))
    assert path in str(info.value)
    assert problem in str(info.value)


@pytest.mark.parametrize("payload", [Noop, {"n": 1}, 42, None], ids=repr)
def test_codec_refuses_a_payload_that_is_not_a_dataclass_instance(payload):
    """Only dataclass instances are payloads; classes and plain values are refused."""
    with pytest.raises(TypeError, match="dataclass"):
        codec.encode(payload)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        b"\x81\xa1n",
        b"\x81\xa1n\x01trailing",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"n": "not an int"}),
        msgpack.packb({"n": True}),
        msgpack.packb({"n": msgpack.ExtType(99, b"?")}),
        msgpack.packb({"n": msgpack.ExtType(1, b"short")}),
    ],
    ids=[
        "empty",
        "reserved-byte",
        "truncated",
        "trailing-bytes",
        "array",
        "str-for-int",
        "bool-for-int",
        "unknown-ext",
        "bad-datetime-ext",
    ],
)
def test_codec_decode_of_garbage_raises_payload_decode_error(data):
    """Bytes that are not an encoded payload raise PayloadDecodeError, nothing else."""
    with pytest.raises(codec.PayloadDecodeError):
        codec.decode(data, Noop)


@hypothesis_settings(deadline=None)
@given(st.binary(max_size=64))
def test_codec_decode_of_random_bytes_never_raises_anything_else(data):
    """Arbitrary bytes either decode into the type or raise PayloadDecodeError."""
    try:
        decoded = codec.decode(data, Order)
    except codec.PayloadDecodeError:
        return
    assert isinstance(decoded, Order)
    assert all(isinstance(item, Item) for item in decoded.items)


def test_codec_decode_error_is_a_value_error():
    """PayloadDecodeError is a ValueError, so generic handlers catch it."""
    assert issubclass(codec.PayloadDecodeError, ValueError)


def test_codec_decode_names_a_missing_required_field():
    """A stored payload without a required field raises PayloadDecodeError naming it."""
    data = msgpack.packb({"items": []})
    with pytest.raises(codec.PayloadDecodeError, match=r"payload\.id: missing required field"):
        codec.decode(data, Order)


def test_codec_decode_names_a_missing_nested_field():
    """A nested dataclass missing a required field is reported with its full path."""
    data = msgpack.packb({"id": 1, "items": [{"name": "pen", "qty": 1}, {"name": "ink"}]})
    with pytest.raises(codec.PayloadDecodeError, match=r"payload\.items\[1\]\.qty"):
        codec.decode(data, Order)


def test_codec_decode_ignores_unknown_fields():
    """A field the payload type no longer has is dropped, the rest decodes."""
    data = msgpack.packb(
        {
            "id": 7,
            "items": [{"name": "pen", "qty": 2, "colour": "red"}],
            "note": None,
            "removed_field": [1, 2],
        }
    )
    assert codec.decode(data, Order) == Order(id=7, items=[Item(name="pen", qty=2)])


def test_codec_decode_fills_missing_fields_with_their_defaults():
    """A missing field with a default or default_factory takes that default."""
    assert codec.decode(msgpack.packb({"required": 3}), WithDefaults) == WithDefaults(
        required=3, plain_default="plain", factory_default=[1, 2]
    )
    assert codec.decode(msgpack.packb({"id": 1}), Order) == Order(id=1, items=[], note=None)


@dataclass
class Flat:
    count: int
    ratio: float
    name: str
    flag: bool
    blob: bytes
    note: str | None = None


# Any value at all, so the one-pass check of flat payloads is held to the
# full encode-then-decode check on wrong types too (bool in an int field,
# int in a str field, IntEnum, huge ints, None where not optional).
anything = st.one_of(
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.booleans(),
    st.binary(max_size=5),
    st.none(),
    st.sampled_from([Size.SMALL, Mood.CALM]),
)


def _full_check(payload):
    data = codec.encode(payload)
    codec.decode(data, Flat)
    return data


@hypothesis_settings(deadline=None, max_examples=300)
@given(
    st.builds(
        Flat,
        count=st.one_of(st.integers(), anything),
        ratio=st.one_of(st.floats(allow_nan=False), anything),
        name=st.one_of(st.text(), anything),
        flag=st.one_of(st.booleans(), anything),
        blob=st.one_of(st.binary(), anything),
        note=st.one_of(st.none(), st.text(), anything),
    )
)
def test_encode_checked_agrees_with_encode_then_decode(payload):
    try:
        expected = _full_check(payload)
    except (TypeError, codec.PayloadDecodeError) as exc:
        with pytest.raises(type(exc)):
            codec.encode_checked(payload, Flat)
    else:
        assert codec.encode_checked(payload, Flat) == expected


@hypothesis_settings(deadline=None, max_examples=300)
@given(
    st.fixed_dictionaries(
        {
            "count": st.one_of(
                st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1), anything
            ),
            "ratio": st.one_of(st.floats(allow_nan=False), st.integers(-5, 5), anything),
            "name": st.one_of(st.text(), anything),
            "flag": st.one_of(st.booleans(), anything),
            "blob": st.one_of(st.binary(), anything),
        },
        optional={"note": st.one_of(st.none(), st.text(), anything), "other": anything},
    )
)
def test_decode_of_flat_payloads_agrees_with_the_full_path(stored):
    try:
        data = msgpack.packb(stored, use_bin_type=True)
    except OverflowError:
        assume(False)  # beyond 64 bits: encode refuses it before it is ever stored
    try:
        expected = codec._from_plain(msgpack.unpackb(data), Flat, "payload")
    except codec.PayloadDecodeError:
        with pytest.raises(codec.PayloadDecodeError):
            codec.decode(data, Flat)
    else:
        decoded = codec.decode(data, Flat)
        assert decoded == expected
        assert [type(getattr(decoded, f.name)) for f in dataclasses.fields(Flat)] == [
            type(getattr(expected, f.name)) for f in dataclasses.fields(Flat)
        ]


def test_a_refused_payload_leaves_nothing_behind_for_the_next_one():
    """The per-thread packer is reused: a payload refused half-way (a lone
    surrogate after other fields) must not leave bytes in front of the next."""
    with pytest.raises(TypeError, match="surrogate"):
        codec.encode(Flat(count=1, ratio=2.0, name="ok", flag=True, blob=b"x", note="\ud800"))
    good = Flat(count=7, ratio=0.5, name="fine", flag=False, blob=b"y")
    assert codec.decode(codec.encode(good), Flat) == good
    assert codec.encode(good) == msgpack.packb(dataclasses.asdict(good), use_bin_type=True)
