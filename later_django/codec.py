"""The payload codec: dataclasses to msgpack bytes and back.

Encoding accepts only the value types the SPEC lists and names the offending
field otherwise. Decoding is guided by the dataclass's type annotations, so
nested dataclasses, enums and tuples come back as the types they were.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import struct
import threading
import types
import typing
import uuid
from decimal import Decimal
from typing import Any

import msgpack

_EXT_DATETIME = 1
_EXT_DATE = 2
_EXT_DECIMAL = 3
_EXT_UUID = 4
_DATETIME = struct.Struct(">qii")  # epoch seconds, microseconds, UTC offset seconds
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_INT64_MIN, _UINT64_MAX = -(1 << 63), (1 << 64) - 1


class PayloadDecodeError(ValueError):
    """The stored payload bytes do not decode into the handler's payload type."""


def encode(payload: object) -> bytes:
    """Encode a dataclass instance; raise TypeError naming any unsupported value."""
    if not dataclasses.is_dataclass(payload) or isinstance(payload, type):
        raise TypeError(
            f"payload must be a dataclass instance, got {type(payload).__name__}; "
            "declare the payload with @dataclass"
        )
    return _pack(_to_plain(payload, "payload"))


def decode(data: bytes, payload_type: type[Any]) -> Any:
    """Decode bytes written by :func:`encode` into ``payload_type``."""
    try:
        plain = msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)
        flat = _flat_fields(payload_type)
        if flat is not None and type(plain) is dict and len(plain) == len(flat):
            kwargs = _flat_kwargs(plain, flat)
            if kwargs is not None:
                return payload_type(**kwargs)
        return _from_plain(plain, payload_type, "payload")
    except PayloadDecodeError:
        raise
    except Exception as exc:
        raise PayloadDecodeError(f"payload does not decode: {exc}") from exc


def encode_checked(payload: object, payload_type: type[Any]) -> bytes:
    """Encode ``payload`` and prove it decodes back into ``payload_type``.

    Raises TypeError for an unsupported value and PayloadDecodeError for one
    the worker could not decode (e.g. a str in an int field), so enqueue can
    refuse it before anything is written."""
    flat = _flat_fields(payload_type) if type(payload) is payload_type else None
    if flat is not None:
        plain = _flat_plain(payload, flat)
        if plain is not None:
            return _pack(plain)
    data = encode(payload)
    decode(data, payload_type)
    return data


# Exact value types a field of each annotation takes without conversion; a
# payload whose fields all match is encoded and checked in one pass.
_FLAT_TYPES: dict[Any, tuple[type, ...]] = {
    int: (int,),
    float: (float, int),
    str: (str,),
    bool: (bool,),
    bytes: (bytes,),
}


_FlatFields = tuple[tuple[str, tuple[type, ...]], ...]
_flat_cache: dict[type[Any], _FlatFields | None] = {}


def _flat_fields(cls: type[Any]) -> _FlatFields | None:
    """(name, accepted types) of each field of a dataclass whose fields are all
    annotated int, float, str, bool, bytes or an Optional of one; else None."""
    try:
        return _flat_cache[cls]
    except KeyError:
        flat = _flat_cache[cls] = _find_flat_fields(cls)
        return flat


def _find_flat_fields(cls: type[Any]) -> _FlatFields | None:
    if not dataclasses.is_dataclass(cls):
        return None
    hints = typing.get_type_hints(cls)
    flat = []
    for field in dataclasses.fields(cls):
        if not field.init:
            return None
        hint = hints.get(field.name)
        accepted = _FLAT_TYPES.get(hint)
        if accepted is None and typing.get_origin(hint) in (typing.Union, types.UnionType):
            args = typing.get_args(hint)
            rest = [arg for arg in args if arg is not type(None)]
            if len(args) == 2 and len(rest) == 1 and rest[0] in _FLAT_TYPES:
                accepted = (*_FLAT_TYPES[rest[0]], type(None))
        if accepted is None:
            return None
        flat.append((field.name, accepted))
    return tuple(flat)


def _flat_plain(payload: object, flat: _FlatFields) -> dict[str, object] | None:
    """The plain form of a flat payload, or None if a value needs the full path."""
    plain = {}
    for name, accepted in flat:
        value = getattr(payload, name)
        kind = type(value)
        if kind not in accepted or (kind is int and not _INT64_MIN <= value <= _UINT64_MAX):
            return None
        plain[name] = value
    return plain


def _flat_kwargs(plain: dict[Any, Any], flat: _FlatFields) -> dict[str, object] | None:
    """The constructor arguments of a flat payload whose stored values all have
    their field's exact type, or None if one needs the full path."""
    kwargs: dict[str, object] = {}
    for name, accepted in flat:
        if name not in plain:
            return None
        value = plain[name]
        kind = type(value)
        if kind not in accepted:
            return None
        # A float field stores a whole number as an int: give it back as a float.
        kwargs[name] = float(value) if kind is int and float in accepted else value
    return kwargs


_packers = threading.local()


def _pack(plain: object) -> bytes:
    # One Packer per thread: packb() builds a new one on every call, which
    # costs more than packing a small payload. A Packer is not thread-safe.
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    try:
        return packer.pack(plain)  # type: ignore[no-any-return]  # msgpack is untyped
    except UnicodeEncodeError as exc:
        raise TypeError(
            f"payload: a string holds {exc.object[exc.start : exc.end]!r}, which is not "
            "valid UTF-8 (a lone surrogate); clean the text or pass it as bytes"
        ) from exc


def _to_plain(value: object, path: str) -> object:
    # Order matters: bool is an int, IntEnum is an int, datetime is a date.
    if isinstance(value, enum.Enum):
        return _to_plain(value.value, path)
    if value is None or isinstance(value, (bool, str, bytes)):
        return value
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _UINT64_MAX:
            raise TypeError(f"{path}: integer {value} does not fit in 64 bits")
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, dt.datetime):
        return _pack_datetime(value, path)
    if isinstance(value, dt.date):
        return msgpack.ExtType(_EXT_DATE, struct.pack(">i", value.toordinal()))
    if isinstance(value, Decimal):
        return msgpack.ExtType(_EXT_DECIMAL, str(value).encode())
    if isinstance(value, uuid.UUID):
        return msgpack.ExtType(_EXT_UUID, value.bytes)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: _to_plain(getattr(value, field.name), f"{path}.{field.name}")
            for field in dataclasses.fields(value)
        }
    if isinstance(value, (list, tuple)):
        return [_to_plain(item, f"{path}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(
                    f"{path}: dict key {key!r} is a {type(key).__name__}; "
                    "only str and int keys are supported"
                )
            if isinstance(key, int) and not _INT64_MIN <= key <= _UINT64_MAX:
                raise TypeError(f"{path}: dict key {key} does not fit in 64 bits")
            plain[key] = _to_plain(item, f"{path}[{key!r}]")
        return plain
    raise TypeError(
        f"{path}: {type(value).__name__} is not a supported payload value; use "
        "dataclasses, list, dict, str, int, float, bool, None, bytes, aware "
        "datetime, date, Decimal, UUID or enums"
    )


def _pack_datetime(value: dt.datetime, path: str) -> msgpack.ExtType:
    offset = value.utcoffset()
    if offset is None:
        raise TypeError(
            f"{path}: naive datetime {value.isoformat()} is ambiguous; "
            "pass an aware datetime (e.g. django.utils.timezone.now())"
        )
    delta = value - _EPOCH
    seconds = delta.days * 86400 + delta.seconds
    body = _DATETIME.pack(seconds, delta.microseconds, int(offset.total_seconds()))
    return msgpack.ExtType(_EXT_DATETIME, body)


def _ext_hook(code: int, data: bytes) -> object:
    if code == _EXT_DATETIME:
        seconds, micros, offset = _DATETIME.unpack(data)
        tz = dt.timezone(dt.timedelta(seconds=offset))
        # Build the local time directly: near year 1 or 9999 the UTC instant
        # itself can fall outside datetime's range.
        local = _EPOCH_NAIVE + dt.timedelta(seconds=seconds + offset, microseconds=micros)
        return local.replace(tzinfo=tz)
    if code == _EXT_DATE:
        return dt.date.fromordinal(struct.unpack(">i", data)[0])
    if code == _EXT_DECIMAL:
        return Decimal(data.decode())
    if code == _EXT_UUID:
        return uuid.UUID(bytes=data)
    raise PayloadDecodeError(f"unknown msgpack extension type {code}")


@functools.cache
def _field_hints(cls: type[Any]) -> tuple[tuple[str, Any, bool], ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        (
            field.name,
            hints.get(field.name, Any),
            field.default is not dataclasses.MISSING
            or field.default_factory is not dataclasses.MISSING,
        )
        for field in dataclasses.fields(cls)
        if field.init
    )


def _from_plain(value: object, hint: Any, path: str) -> Any:  # noqa: C901, PLR0911
    if hint is Any or hint is object:
        return value
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _from_plain(value, option, path)
            except PayloadDecodeError as exc:
                errors.append(str(exc))
        raise PayloadDecodeError("; ".join(errors) or f"{path}: no union member fits")
    if origin in (list, tuple, dict) or origin is not None:
        return _from_generic(value, hint, origin, path)
    if isinstance(hint, type):
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise PayloadDecodeError(f"{path}: expected a {hint.__name__} mapping")
            kwargs = {}
            for name, field_hint, has_default in _field_hints(hint):
                if name in value:
                    kwargs[name] = _from_plain(value[name], field_hint, f"{path}.{name}")
                elif not has_default:
                    raise PayloadDecodeError(f"{path}.{name}: missing required field")
            return hint(**kwargs)
        if issubclass(hint, enum.Enum):
            try:
                return hint(value)
            except ValueError as exc:
                raise PayloadDecodeError(f"{path}: {exc}") from exc
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if hint is tuple and isinstance(value, list):
            return tuple(value)
        if hint is int and isinstance(value, bool):
            raise PayloadDecodeError(f"{path}: expected int, got bool")
        if hint is dt.date and isinstance(value, dt.datetime):
            raise PayloadDecodeError(f"{path}: expected date, got datetime")
        if not isinstance(value, hint):
            raise PayloadDecodeError(
                f"{path}: expected {hint.__name__}, got {type(value).__name__}"
            )
        return value
    return value


def _from_generic(value: object, hint: Any, origin: Any, path: str) -> Any:
    args = typing.get_args(hint)
    if origin is list and isinstance(value, list):
        item = args[0] if args else Any
        return [_from_plain(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is tuple and isinstance(value, list):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_plain(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise PayloadDecodeError(f"{path}: expected {len(args)} items, got {len(value)}")
        items = args or (Any,) * len(value)
        return tuple(
            _from_plain(v, a, f"{path}[{i}]")
            for i, (v, a) in enumerate(zip(value, items, strict=True))
        )
    if origin is dict and isinstance(value, dict):
        item = args[1] if len(args) == 2 else Any
        return {k: _from_plain(v, item, f"{path}[{k!r}]") for k, v in value.items()}
    if origin is typing.Literal:
        if value in args:
            return value
        raise PayloadDecodeError(f"{path}: {value!r} is not one of {args}")
    if origin in (list, tuple, dict):
        raise PayloadDecodeError(f"{path}: expected {origin.__name__}, got {type(value).__name__}")
    return value
