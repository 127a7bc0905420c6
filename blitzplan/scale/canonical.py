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
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from blitzplan.errors import InvalidInputError

__all__ = ["canonical_json", "check_digest", "digest", "es_number"]

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


def _prepared(value: Any, marks: list[int], path: str) -> Any:
    """``value`` with members in JCS order and every float that Python's ``repr`` writes
    differently from ECMAScript replaced by a marked string (``_MARK`` + its JCS text)."""
    kind = type(value)
    if kind is dict:
        out = {}
        for name in sorted(value, key=_key):
            if type(name) is not str:
                raise InvalidInputError(f"{path} has the key {name!r}: JSON keys are strings")
            out[name] = _prepared(value[name], marks, f"{path}.{name}")
        return out
    if kind is list or kind is tuple:
        return [_prepared(item, marks, f"{path}[]") for item in value]
    if kind is float:
        if value.is_integer() and abs(value) < _EXACT:
            return int(value)
        if 1e-4 <= abs(value) < 1e16:  # repr and ECMAScript agree digit for digit here
            return value
        if not math.isfinite(value):
            raise InvalidInputError(f"{path} holds {value!r}, which has no JSON form")
        marks.append(1)
        return _MARK + _es_finite(value)
    if kind is int and abs(value) >= _EXACT:
        raise InvalidInputError(
            f"{path} holds the integer {value}, beyond 2**53: JCS reads numbers as doubles"
        )
    if kind is str and _MARK in value:
        raise InvalidInputError(f"{path} holds a string with a NUL character")
    if value is None or kind in (bool, int, str):
        return value
    raise InvalidInputError(f"{path} holds a {kind.__name__}, which has no JSON form")


def canonical_json(value: Any, *, path: str = "$") -> str:
    """The RFC 8785 text of a parsed JSON value (dicts, lists, str, int, float, bool, None)."""
    marks: list[int] = []
    text = json.dumps(
        _prepared(value, marks, path),
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=False,
    )
    if marks:
        text, found = _MARKED.subn(r"\1", text)
        if found != len(marks):  # cannot happen: strings with NUL were refused above
            raise InvalidInputError(f"{path}: canonical numbers could not be placed")
    return text


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
    signed = _signed_text(text, claimed, key, trailer if trailer in document else "")
    if signed is not None and hashlib.sha256(signed.encode()).hexdigest() == claimed:
        return
    if digest(document, (key, trailer)) != claimed:
        raise InvalidInputError(
            f"{key} {claimed[:12]}... does not match the document: it was changed after it was "
            "written"
        )


def _signed_text(text: str, claimed: str, key: str, trailer: str) -> str | None:
    """``text`` without its ``key`` member and its last member ``trailer``, when ``text`` looks
    canonical (None otherwise)."""
    body = text[:-1] if text.endswith("\n") else text
    member = f'"{key}":"{claimed}"'
    at = body.find(member)
    if at < 1 or not body.endswith("}"):
        return None
    before, after = body[at - 1], body[at + len(member)]
    if before == "," and after in ",}":
        body = body[: at - 1] + body[at + len(member) :]
    elif before == "{" and after == ",":
        body = body[:at] + body[at + len(member) + 1 :]
    else:
        return None
    if trailer:
        cut = body.rfind(f',"{trailer}":')
        if cut < 0 or not _one_value(body[cut + len(trailer) + 4 : -1]):
            return None
        body = body[:cut] + "}"
    return body


def _one_value(text: str) -> bool:
    """Whether ``text`` is exactly one JSON value (so cutting it out cuts nothing else)."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
