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
import re
from collections.abc import Mapping
from typing import Any

from blitzplan._collector import collector_paused
from blitzplan.errors import InvalidInputError
from blitzplan.wire.jcs_walk import (
    _MARKED,
    _dump,
    _key,
    _Marks,
    _prepared,
    _Reorder,
    _text,
    es_number,
)

__all__ = [
    "canonical_json",
    "check_digest",
    "digest",
    "es_number",
    "signed_as_written",
    "signed_json",
]


def canonical_json(value: Any) -> str:
    """The RFC 8785 text of a parsed JSON value (dicts with str keys, lists, tuples, str, int,
    float, bool, None); InvalidInputError for anything JSON cannot hold."""
    with collector_paused():  # a large document's containers would earn full passes
        marks = _Marks()
        try:
            prepared = _prepared(value, marks)
        except _Reorder:
            marks = _Marks()
            marks.as_is = False
            prepared = _prepared(value, marks)
        return _text(prepared, marks)


def signed_json(
    document: Mapping[str, Any], key: str, extra: Mapping[str, Any] | None = None
) -> tuple[str, str]:
    """``(text, digest)``: the canonical text of ``document`` with ``key`` set to the SHA-256
    of the canonical text of ``document`` alone, and the members of ``extra`` (not signed).
    Each member is written once: the signed text and the text are joined from the same
    pieces."""
    with collector_paused():
        marks = _Marks()
        try:
            prepared = _prepared(dict(document), marks)
        except _Reorder:
            marks = _Marks()
            marks.as_is = False
            prepared = _prepared(dict(document), marks)
        sort = marks.as_is
        members = {name: _member(name, item, sort) for name, item in prepared.items()}
        signed = "{" + ",".join(text for text, _ in members.values()) + "}"
        if sum(found for _, found in members.values()) != len(marks):  # cannot happen
            raise InvalidInputError("canonical numbers could not be placed")
        hexdigest = hashlib.sha256(signed.encode()).hexdigest()
        members[key] = _member(key, hexdigest, sort)
        for name, value in (extra or {}).items():
            extra_marks = _Marks()
            extra_marks.as_is = False  # small: sorted here, whatever the document needed
            members[name] = _member(name, _prepared(value, extra_marks), False)
        names = sorted(members, key=_key)
        return "{" + ",".join(members[name][0] for name in names) + "}", hexdigest


def _member(name: str, prepared: Any, sort: bool) -> tuple[str, int]:
    """The text ``"name":value`` of a prepared member, and how many marked numbers it held."""
    text = _dump({name: prepared}, sort)
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
