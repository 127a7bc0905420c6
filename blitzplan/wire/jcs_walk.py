"""The walk behind :mod:`blitzplan.wire.canonical`: a parsed JSON value prepared for a
JSON writer (members in JCS order, floats Python writes differently from ECMAScript replaced by
marked strings, anything JSON cannot hold refused) and written by msgspec's C writer.

Large documents are mostly lists of records with one key set and lists of numbers: those are
checked column by column (and nested lists as one list) and passed on as they are when nothing
in them needs a change, the writer then sorting keys by code point (equal to JCS's UTF-16
order unless a key set mixes astral characters with U+E000..U+FFFF: :class:`_Reorder`, and the
walk is done again record by record with no sorting by the writer).
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import re
from collections.abc import Iterable, Sequence
from typing import Any

from blitzplan.errors import InvalidInputError

_EXACT = 2**53
_MARK = "\x00"
_MARKED = re.compile(r'"\\u0000([^"]*)"')


def es_number(value: float) -> str:
    """``value`` as ECMAScript's ``Number.prototype.toString`` writes it (RFC 8785, 3.2.2.3)."""
    if not math.isfinite(value):
        raise InvalidInputError(f"{value!r} has no JSON form (JSON numbers are finite)")
    return _es_finite(value)


def _es_finite(value: float) -> str:
    if value == 0:
        return "0"
    text = repr(abs(value))
    mantissa, _, exponent = text.partition("e")
    point = mantissa.find(".")
    point = len(mantissa) if point < 0 else point
    raw = mantissa.replace(".", "")
    stripped = raw.lstrip("0")
    n = point + int(exponent or 0) - (len(raw) - len(stripped))
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = f"{digits[:n]}.{digits[n:]}"
    elif -6 < n <= 0:
        out = "0." + "0" * -n + digits
    else:
        e = n - 1
        out = f"{digits[0]}{'.' + digits[1:] if k > 1 else ''}e{'+' if e >= 0 else '-'}{abs(e)}"
    return "-" + out if value < 0 else out


def _key(name: str) -> bytes:
    return name.encode("utf-16-be")


def _float(value: float, marks: _Marks) -> Any:
    """A float as :func:`_prepared` writes it: an int when integral below 2**53, itself where
    Python's ``repr`` and ECMAScript agree (non-integral, |x| >= 1e-4), else its marked JCS
    text."""
    if value.is_integer():
        if -_EXACT < value < _EXACT:
            return int(value)
    elif 1e-4 <= abs(value) < math.inf:  # non-integral, so < 2**52: repr and ECMAScript agree
        return value
    if not math.isfinite(value):
        raise InvalidInputError(f"{value!r} has no JSON form (JSON numbers are finite)")
    marks.append(1)
    return _MARK + _es_finite(value)


def _scalar(value: Any, marks: _Marks) -> Any:
    kind = type(value)
    if kind is float:
        return _float(value, marks)
    if kind is str:
        if _MARK in value:
            raise InvalidInputError(f"the string {value[:40]!r} holds a NUL character")
        return value
    if kind is int and not -_EXACT < value < _EXACT:
        raise InvalidInputError(f"the integer {value} is beyond 2**53: JCS reads it as a double")
    if value is None or kind is bool or kind is int:
        return value
    raise InvalidInputError(f"a {kind.__name__} has no JSON form")


def _plain(item: Any) -> bool:
    """Whether ``item`` is written as it is (a string without NUL, a bool, None, an int below
    2**53, or a float whose ``repr`` is its JCS text: non-integral, 1e-4 <= |x| < inf)."""
    t = type(item)
    if t is float:
        return bool(1e-4 <= abs(item) < math.inf) and not item.is_integer()
    if t is str:
        return _MARK not in item
    if t is int:
        return bool(-_EXACT < item < _EXACT)
    return item is None or t is bool


def _prepared(value: Any, marks: _Marks) -> Any:
    """``value`` with members in JCS order and every float that Python's ``repr`` writes
    differently from ECMAScript replaced by a marked string (``_MARK`` + its JCS text). A list
    or tuple that needs no change is returned as it is (read only)."""
    kind = type(value)
    if kind is dict:
        return _members(value, marks)
    if kind is list or kind is tuple:
        return _items(value, marks)
    if kind is float:
        return _float(value, marks)
    return _scalar(value, marks)


def _members(value: dict[Any, Any], marks: _Marks) -> dict[str, Any]:
    """A dict as :func:`_prepared` writes it: its members in JCS order, each prepared."""
    names = _names(value, marks)
    out = {}
    for name in names:
        item = value[name]
        kind = type(item)
        if kind is float:
            if not (1e-4 <= abs(item) < math.inf) or item.is_integer():
                item = _float(item, marks)
        elif kind is str:
            if _MARK in item:
                _scalar(item, marks)  # raises
        elif kind is int:
            if not -_EXACT < item < _EXACT:
                _scalar(item, marks)  # raises
        elif not (item is None or kind is bool):
            item = _prepared(item, marks)
        out[name] = item
    return out


def _names(value: dict[Any, Any], marks: _Marks) -> list[str]:
    """A dict's names in JCS order (UTF-16 code units); :class:`_Reorder` when the writer
    sorts keys (``marks.as_is``) and code-point order differs (only astral characters against
    U+E000..U+FFFF)."""
    if all(map(str.isascii, value)):
        names = sorted(value)
    else:
        names = sorted(value, key=_key)
        if marks.as_is and names != sorted(value):
            raise _Reorder
    if _MARK in "".join(names):
        raise InvalidInputError("a key holds a NUL character")
    return names


class _Marks(list[int]):
    """The marked numbers written (one 1 each); ``as_is``: dicts may pass unsorted, the
    writer sorting keys by code point."""

    as_is = True


class _Reorder(Exception):
    """A key set whose JCS order is not its code-point order: write without ``as_is``."""


def _records(value: list[Any] | tuple[Any, ...], marks: _Marks) -> Any:
    """A list of dicts with one key set, column by column: the list as it is when no column
    needs a change (the writer sorts the keys), else shallow copies with the changed columns
    set. Any error: None (the caller goes record by record, so the first bad item is named as
    before)."""
    first = value[0]
    keys = first.keys()
    if not all(map(keys.__eq__, map(dict.keys, value))):
        return None
    found = len(marks)
    try:
        changed = []
        for name in _names(first, marks):
            column = list(map(operator.itemgetter(name), value))
            prepared = _items(column, marks)
            if prepared is not column and any(map(operator.is_not, prepared, column)):
                changed.append((name, prepared))
    except (InvalidInputError, TypeError, ValueError):
        del marks[found:]
        return None
    if not changed:
        return value
    out = [dict(item) for item in value]
    for name, prepared in changed:
        for record, item in zip(out, prepared, strict=True):
            record[name] = item
    return out


def _items(value: list[Any] | tuple[Any, ...], marks: _Marks) -> Any:
    """A list or tuple as :func:`_prepared` writes it. Its items' types are looked at first:
    all ints below 2**53, all strings without NUL, all plain floats, or lists / tuples of such
    ints, and it is written as it is; else item by item."""
    kinds = set(map(type, value))
    if len(kinds) == 1:
        (kind,) = kinds
        if kind is dict:
            if marks.as_is:
                found = _records(value, marks)
                if found is not None:
                    return found
            return [_members(item, marks) for item in value]
        if kind is int and _below_2_53(value):
            return value
        if kind is float:
            return value if _plain_floats(value) else _floats(value, marks)
        if kind is str and _MARK not in "".join(value):
            return value
    if kinds and kinds <= _SEQUENCES and marks.as_is:  # their items as one list
        items = list(itertools.chain.from_iterable(value))
        prepared = _items(items, marks) if items else items
        if prepared is items:
            return value
        ends = itertools.accumulate(map(len, value))
        return [prepared[end - len(item) : end] for item, end in zip(value, ends, strict=True)]
    if kinds and kinds <= _SEQUENCES:
        flat = itertools.chain.from_iterable
        if set(map(type, flat(value))) == _INT and _below_2_53(flat(value), flat(value)):
            return value
    return [item if _plain(item) else _prepared(item, marks) for item in value]


_SEQUENCES = frozenset({list, tuple})
_INT = {int}


def _below_2_53(ints: Iterable[int], again: Iterable[int] | None = None) -> bool:
    """Whether the ints (a non-empty list, or one iterator and ``again`` another over the
    same ints) are all within (-2**53, 2**53)."""
    return min(ints) > -_EXACT and max(ints if again is None else again) < _EXACT


def _plain_floats(floats: Sequence[float]) -> bool:
    """Whether every float of a non-empty list is :func:`_plain`."""
    return (
        all(map(math.isfinite, floats))
        and min(map(abs, floats)) >= 1e-4
        and not any(map(float.is_integer, floats))
    )


def _dump(prepared: Any, sort: bool) -> str:
    """The JSON text of a prepared value (members in the order given, no whitespace, strings
    escaped as ``json.dumps(ensure_ascii=False)`` and JCS do) by msgspec's C writer, whose
    text equals ``json.dumps``'s for every prepared value (ints below 2**53, plain floats:
    ``repr``; tests/test_export_speed.py); ``json.dumps`` where msgspec refuses (a lone
    surrogate), so what that did is kept."""
    import msgspec

    try:
        return msgspec.json.encode(prepared, order="sorted" if sort else None).decode()
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return json.dumps(
            prepared, ensure_ascii=False, separators=(",", ":"), allow_nan=False, sort_keys=sort
        )


def _floats(floats: Sequence[float], marks: _Marks) -> list[float | str]:
    """A list of floats as the item-by-item walk writes it: only the floats not
    :func:`_plain` (found in numpy, in order) go through :func:`_float`."""
    import numpy as np

    values = np.asarray(floats, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        plain = (np.abs(values) >= 1e-4) & np.isfinite(values) & (values != np.floor(values))
    out: list[Any] = list(floats)
    for k in np.flatnonzero(~plain).tolist():
        out[k] = _float(out[k], marks)
    return out


def _text(prepared: Any, marks: _Marks) -> str:
    text = _dump(prepared, marks.as_is)
    if marks:
        text, found = _MARKED.subn(r"\1", text)
        if found != len(marks):  # cannot happen: strings with NUL were refused
            raise InvalidInputError("canonical numbers could not be placed")
    return text
