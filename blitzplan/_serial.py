"""Typed, lossless conversion of frozen plan objects to JSON-ready data and back.

Dataclasses become objects keyed by field name, NamedTuples objects keyed by field name, enums
their value, tuples lists, mappings objects with string keys. Floats keep every bit (Python's
``repr`` round-trips); non-finite floats become the strings ``"inf"``, ``"-inf"``, ``"nan"`` so the
output is strict JSON. Decoding follows the type hints of the target class, so it needs no type
tags and rejects data that does not fit, naming the path.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar, Union

from blitzplan.errors import InvalidInputError

__all__ = ["from_data", "to_data"]

T = TypeVar("T")
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def to_data(value: object) -> Any:
    """Plain JSON-ready data for ``value``."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {name: to_data(getattr(value, name)) for name in value._fields}
    if isinstance(value, list | tuple):
        return [to_data(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): to_data(item) for key, item in value.items()}
    raise TypeError(f"cannot serialise {type(value).__name__}")


def from_data(kind: Any, data: Any, path: str = "$") -> Any:
    """Rebuild a value of type ``kind`` from :func:`to_data` output."""
    origin = typing.get_origin(kind)
    if kind is Any:
        return data
    if origin in (Union, types.UnionType):
        options = typing.get_args(kind)
        if data is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return from_data(option, data, path)
            except InvalidInputError as exc:
                errors.append(str(exc))
        raise InvalidInputError(f"{path}: {data!r} fits none of {kind}: {'; '.join(errors)}")
    if isinstance(kind, type) and issubclass(kind, Enum):
        try:
            return kind(data)
        except ValueError:
            raise InvalidInputError(f"{path}: {data!r} is not a {kind.__name__}") from None
    if kind is float:
        if isinstance(data, str) and data in _NON_FINITE:
            return _NON_FINITE[data]
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise InvalidInputError(f"{path}: expected a number, got {data!r}")
        return float(data)
    if kind in (int, str, bool):
        if not isinstance(data, kind) or (kind is int and isinstance(data, bool)):
            raise InvalidInputError(f"{path}: expected {kind.__name__}, got {data!r}")
        return data
    if kind is type(None):
        if data is not None:
            raise InvalidInputError(f"{path}: expected null, got {data!r}")
        return None
    if origin is tuple:
        return _tuple(kind, data, path)
    if origin in (dict, Mapping, typing.Mapping) or kind in (dict, Mapping):
        args = typing.get_args(kind) or (str, Any)
        if not isinstance(data, dict):
            raise InvalidInputError(f"{path}: expected an object, got {data!r}")
        return {
            from_data(args[0], key, path): from_data(args[1], item, f"{path}.{key}")
            for key, item in data.items()
        }
    if isinstance(kind, type) and (dataclasses.is_dataclass(kind) or hasattr(kind, "_fields")):
        return _record(kind, data, path)
    raise TypeError(f"{path}: cannot decode type {kind!r}")


def _tuple(kind: Any, data: Any, path: str) -> tuple[Any, ...]:
    if not isinstance(data, list):
        raise InvalidInputError(f"{path}: expected a list, got {data!r}")
    args = typing.get_args(kind)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(from_data(args[0], item, f"{path}[{i}]") for i, item in enumerate(data))
    if len(args) != len(data):
        raise InvalidInputError(f"{path}: expected {len(args)} items, got {len(data)}")
    return tuple(
        from_data(a, item, f"{path}[{i}]")
        for i, (a, item) in enumerate(zip(args, data, strict=True))
    )


def _record(kind: type[T], data: Any, path: str) -> T:
    if not isinstance(data, dict):
        raise InvalidInputError(f"{path}: expected an object for {kind.__name__}, got {data!r}")
    hints = typing.get_type_hints(kind)
    names = (
        [f.name for f in dataclasses.fields(kind) if f.init]
        if dataclasses.is_dataclass(kind)
        else list(kind._fields)  # type: ignore[attr-defined]
    )
    unknown = set(data) - set(names)
    if unknown:
        raise InvalidInputError(f"{path}: unknown key(s) {sorted(unknown)} for {kind.__name__}")
    values = {
        name: from_data(hints[name], data[name], f"{path}.{name}") for name in names if name in data
    }
    try:
        return kind(**values)
    except TypeError as exc:
        raise InvalidInputError(f"{path}: {exc}") from None
