"""The canonical JSON form of blitzplan documents: RFC 8785, the JSON Canonicalization Scheme.

JCS writes a JSON value with no whitespace, object members sorted by the UTF-16 code units of
their names, strings escaped as ECMAScript's ``JSON.stringify`` does (``\\"``, ``\\\\``, ``\\b``,
``\\f``, ``\\n``, ``\\r``, ``\\t``, other control characters as ``\\u00xx``, nothing else), and
numbers as ECMAScript's ``Number.prototype.toString`` does (the shortest digits that read back
to the same IEEE double: ``1`` for 1.0, ``0.000001``, ``1e-7``, ``1e+21``). Any JCS
implementation reproduces these bytes from the parsed document, so a digest of them (a
document's ``plan_id`` or ``program_id``) can be recomputed without blitzplan.

blitzplan writes its documents *as* their canonical form (plus a final newline), so a reader
checks a digest on the text itself (:func:`check_digest`); a document that was re-formatted
(indented, keys reordered) is canonicalized again and still checks. Integers beyond 2**53
are refused: JCS reads every number as a double.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from blitzplan._collector import collector_paused
from blitzplan.errors import InvalidInputError

__all__ = [
    "canonical_json",
    "check_digest",
    "digest",
    "es_number",
    "signed_as_written",
    "signed_json",
]

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


def _float(value: float, marks: list[int]) -> Any:
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


def _scalar(value: Any, marks: list[int]) -> Any:
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


def _prepared(value: Any, marks: list[int]) -> Any:
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


def _members(value: dict[Any, Any], marks: list[int]) -> dict[str, Any]:
    """A dict as :func:`_prepared` writes it: its members in JCS order, each prepared."""
    names = sorted(value) if all(map(str.isascii, value)) else sorted(value, key=_key)
    if _MARK in "".join(names):
        raise InvalidInputError("a key holds a NUL character")
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


def _items(value: list[Any] | tuple[Any, ...], marks: list[int]) -> Any:
    """A list or tuple as :func:`_prepared` writes it. Its items' types are looked at first:
    all ints below 2**53, all strings without NUL, all plain floats, or lists / tuples of such
    ints, and it is written as it is; else item by item."""
    kinds = set(map(type, value))
    if len(kinds) == 1:
        (kind,) = kinds
        if kind is dict:
            return [_members(item, marks) for item in value]
        if kind is int and _below_2_53(value):
            return value
        if kind is float and _plain_floats(value):
            return value
        if kind is str and _MARK not in "".join(value):
            return value
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


def _dump(prepared: Any) -> str:
    """The JSON text of a prepared value (members in the order given, no whitespace, strings
    escaped as ``json.dumps(ensure_ascii=False)`` and JCS do) by msgspec's C writer, whose
    text equals ``json.dumps``'s for every prepared value (ints below 2**53, plain floats:
    ``repr``; tests/test_export_speed.py); ``json.dumps`` where msgspec refuses (a lone
    surrogate), so what that did is kept."""
    import msgspec

    try:
        return msgspec.json.encode(prepared).decode()
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return json.dumps(prepared, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _text(prepared: Any, marks: list[int]) -> str:
    text = _dump(prepared)
    if marks:
        text, found = _MARKED.subn(r"\1", text)
        if found != len(marks):  # cannot happen: strings with NUL were refused
            raise InvalidInputError("canonical numbers could not be placed")
    return text


def canonical_json(value: Any) -> str:
    """The RFC 8785 text of a parsed JSON value (dicts with str keys, lists, tuples, str, int,
    float, bool, None); InvalidInputError for anything JSON cannot hold."""
    with collector_paused():  # a large document's containers would earn full passes
        marks: list[int] = []
        return _text(_prepared(value, marks), marks)


def signed_json(
    document: Mapping[str, Any], key: str, extra: Mapping[str, Any] | None = None
) -> tuple[str, str]:
    """``(text, digest)``: the canonical text of ``document`` with ``key`` set to the SHA-256
    of the canonical text of ``document`` alone, and the members of ``extra`` (not signed).
    Each member is written once: the signed text and the text are joined from the same
    pieces."""
    with collector_paused():
        marks: list[int] = []
        prepared = _prepared(dict(document), marks)
        members = {name: _member(name, item) for name, item in prepared.items()}
        signed = "{" + ",".join(text for text, _ in members.values()) + "}"
        if sum(found for _, found in members.values()) != len(marks):  # cannot happen
            raise InvalidInputError("canonical numbers could not be placed")
        hexdigest = hashlib.sha256(signed.encode()).hexdigest()
        members[key] = _member(key, hexdigest)
        for name, value in (extra or {}).items():
            members[name] = _member(name, _prepared(value, marks))
        names = sorted(members, key=_key)
        return "{" + ",".join(members[name][0] for name in names) + "}", hexdigest


def _member(name: str, prepared: Any) -> tuple[str, int]:
    """The text ``"name":value`` of a prepared member, and how many marked numbers it held."""
    text = _dump({name: prepared})
    return _MARKED.subn(r"\1", text[1:-1]) if "\\u0000" in text else (text[1:-1], 0)


def digest(document: Mapping[str, Any], leave_out: tuple[str, ...]) -> str:
    """SHA-256 (hex) of the canonical UTF-8 text of ``document`` without the keys
    ``leave_out``."""
    kept = {key: value for key, value in document.items() if key not in leave_out}
    return hashlib.sha256(canonical_json(kept).encode()).hexdigest()


_DIGEST = re.compile(r"[0-9a-f]{64}")


def check_digest(text: str, document: Mapping[str, Any], key: str, trailer: str = "") -> None:
    """Check that ``document[key]`` is :func:`digest` of ``document`` without ``key`` and
    ``trailer`` (a key that is not part of the digest, such as wall-clock timing).

    ``text`` is the document's text. When it is the canonical form blitzplan writes, the digest
    is taken over the text itself with the ``key`` member (and a final ``trailer`` member)
    cut out; a match proves the rest of the text is exactly what was signed. Otherwise the
    parsed document is canonicalized again. InvalidInputError when ``key`` is missing, malformed
    or does not match."""
    claimed = document.get(key)
    if not isinstance(claimed, str) or not _DIGEST.fullmatch(claimed):
        raise InvalidInputError(
            f"{key} must be the 64 hex digits of the document's SHA-256 (it is what keeps the "
            f"document from being changed unseen), got {claimed!r}"
        )
    if _signed_digest(text, claimed, key, trailer if trailer in document else "") == claimed:
        return
    if digest(document, (key, trailer)) != claimed:
        raise InvalidInputError(
            f"{key} {claimed[:12]}... does not match the document: it was changed after it was "
            "written"
        )


def read_signed(
    text: str, schema: str, version: int, key: str, trailer: str = ""
) -> dict[str, Any]:
    """The parsed document ``text``, once its ``schema``, ``schema_version`` and digest ``key``
    (:func:`check_digest`) are checked; InvalidInputError naming the first thing wrong."""
    import msgspec

    if not isinstance(text, str):
        raise InvalidInputError(f"a {schema} document is JSON text, got {type(text).__name__}")
    try:
        document = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise InvalidInputError(f"the {schema} document does not parse: {exc}") from None
    if not isinstance(document, dict) or document.get("schema") != schema:
        raise InvalidInputError(f"not a {schema} document (its 'schema' key must say so)")
    found = document.get("schema_version")
    if found != version:
        raise InvalidInputError(
            f"schema_version {found!r} is not supported (this blitzplan reads {version})"
        )
    check_digest(text, document, key, trailer)
    return document


def signed_as_written(text: str, key: str) -> str | None:
    """The digest ``text`` claims under ``key`` when ``text`` is canonical text whose digest
    (the text without the ``key`` member) is that claim, else None (a reader then parses and
    checks with :func:`check_digest`). A reader that gets a digest here may decode ``text``
    knowing it is exactly what was signed, once it has checked that the parsed ``key`` is
    this digest (a top-level member, not one nested inside)."""
    found = re.search(f'"{re.escape(key)}":"([0-9a-f]{{64}})"', text)
    if found is None:
        return None
    claimed = found.group(1)
    if _signed_digest(text, claimed, key, "") != claimed:
        return None
    return claimed


def _signed_digest(text: str, claimed: str, key: str, trailer: str) -> str | None:
    """SHA-256 (hex) of ``text`` without its ``key`` member and its last member ``trailer``,
    when ``text`` looks canonical (None otherwise). The kept pieces are hashed in place (no
    copy of the document is joined)."""
    end = len(text) - 1 if text.endswith("\n") else len(text)
    member = f'"{key}":"{claimed}"'
    at = text.find(member, 0, end)
    if at < 1 or end < 1 or text[end - 1] != "}" or at + len(member) >= end:
        return None
    before, after = text[at - 1], text[at + len(member)]
    if before == "," and after in ",}":
        pieces = [(0, at - 1), (at + len(member), end)]
    elif before == "{" and after == ",":
        pieces = [(0, at), (at + len(member) + 1, end)]
    else:
        return None
    if trailer:  # the last member: in the last piece when the text is canonical
        lo, hi = pieces[-1]
        cut = text.rfind(f',"{trailer}":', lo, hi)
        if cut < 0 or not _one_value(text[cut + len(trailer) + 4 : hi - 1]):
            return None
        pieces = [*pieces[:-1], (lo, cut), (end - 1, end)]
    return _hash_pieces(text, pieces)


def _hash_pieces(text: str, pieces: list[tuple[int, int]]) -> str:
    sha = hashlib.sha256()
    if text.isascii():  # byte offsets are character offsets: hash views of one encoding
        data = memoryview(text.encode())
        for lo, hi in pieces:
            sha.update(data[lo:hi])
    else:
        for lo, hi in pieces:
            sha.update(text[lo:hi].encode())
    return sha.hexdigest()


def _one_value(text: str) -> bool:
    """Whether ``text`` is exactly one JSON value (so cutting it out cuts nothing else)."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
